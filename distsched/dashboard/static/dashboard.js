// Live refresh: an element with data-poll="URL" fetches that JSON endpoint every
// two seconds and puts each value of "fields" into the elements marked
// data-field="NAME" (as text, never as markup) and each of "svgs" (server-rendered,
// escaped SVG) into data-svg="NAME". Nothing is computed here.
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  var drawn = new WeakMap(); // element -> the SVG source it shows

  function apply(root, reply) {
    var fields = reply.fields || {};
    Object.keys(fields).forEach(function (name) {
      root.querySelectorAll('[data-field="' + CSS.escape(name) + '"]').forEach(function (el) {
        if (el.textContent !== fields[name]) el.textContent = fields[name];
        var prefix = el.getAttribute("data-class-prefix");
        if (prefix) {
          Array.from(el.classList).forEach(function (c) {
            if (c.indexOf(prefix) === 0) el.classList.remove(c);
          });
          el.classList.add(prefix + fields[name]);
        }
      });
    });
    var svgs = reply.svgs || {};
    Object.keys(svgs).forEach(function (name) {
      root.querySelectorAll('[data-svg="' + CSS.escape(name) + '"]').forEach(function (el) {
        // Only a changed drawing is replaced: links keep focus, nothing flickers.
        if (drawn.get(el) !== svgs[name]) {
          el.innerHTML = svgs[name];
          drawn.set(el, svgs[name]);
        }
      });
    });
  }

  function poll(root) {
    var url = root.getAttribute("data-poll");
    var live = document.getElementById("live");
    function tick() {
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.json();
        })
        .then(function (reply) {
          apply(root, reply);
          if (live) {
            live.hidden = false;
            live.textContent = "live";
            live.className = "live";
          }
        })
        .catch(function () {
          if (live) {
            live.hidden = false;
            live.textContent = "disconnected";
            live.className = "live down";
          }
        })
        .finally(function () {
          setTimeout(tick, PERIOD_MS);
        });
    }
    setTimeout(tick, PERIOD_MS);
  }

  // A form marked data-confirm="QUESTION" is sent only once the user confirms.
  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute && event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-poll]").forEach(poll);
  });
})();
