// Live refresh: an element with data-poll="URL" fetches that JSON endpoint every
// two seconds and puts each value of "fields" into the elements marked
// data-field="NAME" (as text, never as markup) and each of "svgs" (server-rendered,
// escaped SVG) into data-svg="NAME". Nothing is computed here.
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  var PUSHED_PERIOD_MS = 10000;
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

  // An element that also has data-events="URL" listens to that server-sent event
  // stream (the task's progress reports and its end): each notice refreshes it at once,
  // and while the stream is open the timed refresh slows to every ten seconds.
  function poll(root) {
    var url = root.getAttribute("data-poll");
    var live = document.getElementById("live");
    var period = PERIOD_MS;
    var timer = null;
    var busy = false;
    var again = false;
    function show(text, cls) {
      if (!live) return;
      live.hidden = false;
      live.textContent = text;
      live.className = cls;
    }
    function tick() {
      clearTimeout(timer);
      if (busy) {
        again = true; // a notice during a read: read once more after it
        return;
      }
      busy = true;
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.json();
        })
        .then(function (reply) {
          apply(root, reply);
          show("live", "live");
        })
        .catch(function () {
          show("disconnected", "live down");
        })
        .finally(function () {
          busy = false;
          if (again) {
            again = false;
            tick();
          } else {
            timer = setTimeout(tick, period);
          }
        });
    }
    timer = setTimeout(tick, period);
    var events = root.getAttribute("data-events");
    if (events && window.EventSource) {
      var source = new EventSource(events, { withCredentials: true });
      source.addEventListener("open", function () {
        period = PUSHED_PERIOD_MS;
      });
      source.addEventListener("error", function () {
        period = PERIOD_MS;
      });
      source.addEventListener("progress", tick);
      ["ended", "gone", "stopped"].forEach(function (kind) {
        source.addEventListener(kind, function () {
          source.close(); // nothing more will come: back to the timed refresh
          period = PERIOD_MS;
          tick();
        });
      });
    }
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
