#!/usr/bin/env node
// A distsched producer written from lua/README.md and the script headers alone: it reads
// the script files, assembles and hashes them itself, sends raw EVALSHA calls, packs the
// payloads with msgpack, and reads records and results in the documented formats.
//
// Usage: node producer.js <redis url> <namespace> enqueue|report
//   enqueue  schedule the tasks of the scenario below, cancel one, and print what was
//            read back right after (versions, records, queue scores, settling counts)
//   report   print each task's record and decoded result
// The output is one JSON object on stdout.

'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const Redis = require('ioredis');
const { encode, decode, decodeMulti } = require('@msgpack/msgpack');

const LUA_DIR = process.env.DISTSCHED_LUA_DIR || path.join(__dirname, '..', '..', 'lua');
const BUDGET = 1000;
const RECORD_FIELDS = [
  'state', 'version', 'attempt', 'max_attempts', 'backoff_ms', 'run_at_ms', 'priority',
  'cancel_requested', 'updated_delta_ms', 'remaining', 'optional_remaining',
];
const TASK_IDS = ['sum', 'hi', 'bare', 'parent', 'child', 'doomed', 'gate', 'g0', 'g1', 'g2'];

// ------------------------------------------------------------------ assembly (### Assembly)

function directives(text) {
  const includes = [];
  const keys = [];
  for (const line of text.split('\n')) {
    if (line.startsWith('--- @include ')) includes.push(line.slice('--- @include '.length).trim());
    else if (line.startsWith('--- @keys ')) keys.push(...line.slice('--- @keys '.length).split(/\s+/).filter(Boolean));
  }
  return { includes, keys };
}

function partText(name) {
  return fs.readFileSync(path.join(LUA_DIR, 'lib', `${name}.lua`), 'utf8');
}

// For each include in file order: the part's own includes first (recursively), then the
// part, skipping one already placed.
function includeOrder(includes) {
  const placed = [];
  const place = (name) => {
    if (placed.includes(name)) return;
    for (const sub of directives(partText(name)).includes) place(sub);
    placed.push(name);
  };
  includes.forEach(place);
  return placed;
}

function prelude(keys) {
  const fields = keys.map((name, i) => `${name} = KEYS[${i + 1}]`).join(', ');
  const n = keys.length;
  return `local k = { ${fields} }\n` +
    `if #KEYS ~= ${n} then return redis.error_reply('BADARG KEYS expected ${n}: ${keys.join(' ')}') end`;
}

function assemble(name, namespace) {
  const text = fs.readFileSync(path.join(LUA_DIR, `${name}.lua`), 'utf8');
  const { includes, keys } = directives(text);
  const body = [prelude(keys), ...includeOrder(includes).map(partText), text].join('\n');
  return {
    name,
    text: body,
    sha: crypto.createHash('sha1').update(body, 'utf8').digest('hex'),
    keys: keys.map((key) => `ds:{${namespace}}:${key}`),
  };
}

// ------------------------------------------------------------------ calls (### Replies, ### Errors)

class Producer {
  constructor(redis, namespace) {
    this.redis = redis;
    this.namespace = namespace;
    this.scripts = new Map();
    this.counts = { noscript: 0, busy: 0, propagate_calls: 0, settled_after_reply: 0 };
  }

  key(name) {
    return `ds:{${this.namespace}}:${name}`;
  }

  script(name) {
    if (!this.scripts.has(name)) this.scripts.set(name, assemble(name, this.namespace));
    return this.scripts.get(name);
  }

  // One EVALSHA; on NOSCRIPT, load the text on this server and send the call again.
  async raw(name, ...args) {
    const s = this.script(name);
    try {
      return await this.redis.evalsha(s.sha, s.keys.length, ...s.keys, ...args);
    } catch (err) {
      if (!String(err.message).startsWith('NOSCRIPT')) throw err;
      this.counts.noscript += 1;
      // On a cluster the script goes to every master: the one that answered is among them,
      // and a failover or a reshard may move the namespace's slot to any other.
      const nodes = this.redis instanceof Redis.Cluster ? this.redis.nodes('master') : [this.redis];
      for (const node of nodes) {
        const sha = await node.script('LOAD', s.text);
        if (sha !== s.sha) throw new Error(`SCRIPT LOAD of ${name} returned ${sha}, expected ${s.sha}`);
      }
      return this.redis.evalsha(s.sha, s.keys.length, ...s.keys, ...args);
    }
  }

  // Call propagate.lua until no propagation job is left.
  async settle() {
    for (;;) {
      const [left] = await this.raw('propagate', BUDGET);
      this.counts.propagate_calls += 1;
      if (left === 0) return;
    }
  }

  // One transition: on BUSY <id> settle and send again (Redis's own BUSY: wait and send
  // again); settle whatever the reply leaves.
  async call(name, ...args) {
    for (;;) {
      let reply;
      try {
        reply = await this.raw(name, ...args);
      } catch (err) {
        const message = String(err.message);
        if (message.startsWith('BUSY Redis is busy')) {
          await new Promise((resolve) => setTimeout(resolve, 50));
          continue;
        }
        if (!message.startsWith('BUSY ')) throw err;
        this.counts.busy += 1;
        await this.settle();
        continue;
      }
      if (reply[0] > 0) {
        this.counts.settled_after_reply += 1;
        await this.settle();
      }
      return reply;
    }
  }

  // ---------------------------------------------------------------- data (## Data)

  // Every key of the namespace a schedule call may write, serialized (DUMP; nil when absent).
  async snapshot() {
    const out = {};
    for (const key of this.script('schedule').keys) {
      const dumped = await this.redis.dumpBuffer(key);
      out[key] = dumped === null ? null : dumped.toString('hex');
    }
    return out;
  }

  async record(taskId) {
    const raw = await this.redis.hgetBuffer(this.key('tasks'), taskId);
    if (raw === null) return null;
    // Twelve msgpack values one after the other, the worker id last, then the payload
    // when the record holds it (a payload of at most 512 bytes).
    const values = [...decodeMulti(raw)];
    const out = {};
    RECORD_FIELDS.forEach((field, i) => {
      out[field] = values[i];
    });
    out.worker = values[RECORD_FIELDS.length];
    out.payload = values.length > RECORD_FIELDS.length + 1 ? values[RECORD_FIELDS.length + 1] : null;
    out.updated_ms = out.run_at_ms + out.updated_delta_ms;
    return out;
  }

  async result(taskId) {
    const raw = await this.redis.hgetBuffer(this.key('results'), taskId);
    if (raw === null) return null;
    const kind = String.fromCharCode(raw[0]);
    if (kind === 'R') return { result: decode(raw.subarray(1)) };
    return { error: raw.subarray(1).toString('utf8') };
  }
}

// ------------------------------------------------------------------ payloads (## Payload)

function payload(fn, args, kwargs, options = {}) {
  return Buffer.from(encode({ fn, args, kwargs }, options));
}

// "in <ms> <priority> <max_attempts> <backoff_ms> <allow_unknown> <required> <optional>"
function spec({ mode = 'in', time = 0, priority = 0, maxAttempts = 1, backoffMs = 1000, required = 0 } = {}) {
  return `${mode} ${time} ${priority} ${maxAttempts} ${backoffMs} 0 ${required} 0`;
}

// ------------------------------------------------------------------ the scenario

async function enqueue(p) {
  const out = { versions: {}, records: {}, errors: {} };

  // One call, two tasks: [left, version, version]. `greet` gets kwargs only: args are left
  // out (ignoreUndefined drops the undefined key rather than writing nil).
  const both = await p.call('schedule', BUDGET, 2,
    'sum', spec({ priority: 5 }), payload('add', [2, 3], { scale: 10 }),
    'hi', spec(), payload('greet', undefined, { name: 'wörld' }, { ignoreUndefined: true }));
  [, out.versions.sum, out.versions.hi] = both;

  // kwargs left undefined, which the encoder writes as nil: the document says nil means
  // no keyword arguments.
  [, out.versions.bare] = await p.call('schedule', BUDGET, 1,
    'bare', spec(), payload('add', [4, 5], undefined));

  [, out.versions.parent] = await p.call('schedule', BUDGET, 1, 'parent', spec(), payload('add', [1], { scale: 1 }));
  [, out.versions.child] = await p.call('schedule', BUDGET, 1,
    'child', spec({ required: 1 }), payload('add', [7], { scale: 1 }), 'parent');

  // Due in an hour: it waits in the queue until it is cancelled.
  [, out.versions.doomed] = await p.call('schedule', BUDGET, 1,
    'doomed', spec({ time: 3600000 }), payload('add', [0], { scale: 1 }));
  out.cancel_reply = await p.call('cancel', BUDGET, 'doomed');

  // Dependents still to be told: a cancellation with a budget of one edge leaves two of
  // three dependents pending, and a new version of the cancelled task is refused with BUSY
  // until propagate.lua has told them.
  [, out.versions.gate] = await p.call('schedule', BUDGET, 1, 'gate', spec({ time: 3600000 }), payload('add', [0], { scale: 1 }));
  for (const id of ['g0', 'g1', 'g2']) {
    [, out.versions[id]] = await p.call('schedule', BUDGET, 1, id, spec({ required: 1 }), payload('add', [0], { scale: 1 }), 'gate');
  }
  out.gate_cancel_reply = await p.raw('cancel', 1, 'gate');
  out.blocked_before_settling = 0;
  for (const id of ['g0', 'g1', 'g2']) {
    if ((await p.record(id)).state === 'b') out.blocked_before_settling += 1;
  }
  [, out.versions.gate_again] = await p.call('schedule', BUDGET, 1, 'gate', spec(), payload('add', [100], { scale: 1 }));

  // Errors as the client sees them.
  try {
    await p.raw('cancel', BUDGET, 'no-such-task');
  } catch (err) {
    out.errors.notfound = { name: err.name, message: err.message };
  }
  try {
    await p.raw('schedule', BUDGET, 1, 'orphan', spec({ required: 1 }), payload('add', [0]), 'missing');
  } catch (err) {
    out.errors.unknown = { name: err.name, message: err.message };
  }

  // What the scripts refuse (## Limits): BADARG naming the field, and nothing written.
  const before = await p.snapshot();
  out.refusals = {};
  const refused = {
    non_utf8_id: [Buffer.from([0x66, 0xff, 0xfe]), spec(), payload('add', [0])],
    priority: ['loud', spec({ priority: 2 ** 31 }), payload('add', [0])],
    kwargs: ['odd', spec(), Buffer.from(encode({ fn: 'add', kwargs: [1] }))],
  };
  for (const [name, args] of Object.entries(refused)) {
    try {
      await p.raw('schedule', BUDGET, 1, ...args);
      out.refusals[name] = null;
    } catch (err) {
      out.refusals[name] = { name: err.name, message: err.message };
    }
  }
  out.unchanged_after_refusals = JSON.stringify(await p.snapshot()) === JSON.stringify(before);

  for (const id of TASK_IDS) out.records[id] = await p.record(id);
  out.blocked_cause_g0 = null;
  const cause = await p.redis.hget(p.key('blocked'), 'g0');
  if (cause !== null) {
    const len = parseInt(cause.slice(0, 3), 16);
    out.blocked_cause_g0 = { root: cause.slice(3, 3 + len), parent: cause.slice(3 + len) };
  }
  // The queue entry of `sum`: priority and version in the member, due time in the score.
  const member = (2147483647 - 5).toString(16).padStart(8, '0') +
    out.versions.sum.toString(16).padStart(14, '0') + 'sum';
  out.sum_queue_score = Number(await p.redis.zscore(p.key('queue'), member));
  const meta = await p.redis.hgetall(p.key('meta'));
  out.counts = {};
  for (const [field, value] of Object.entries(meta)) {
    if (field.startsWith('count:')) out.counts[field.slice('count:'.length)] = Number(value);
  }
  out.propagating = await p.redis.zcard(p.key('propagating'));
  out.calls = p.counts;
  return out;
}

async function report(p) {
  const out = { records: {}, results: {} };
  for (const id of TASK_IDS) {
    out.records[id] = await p.record(id);
    out.results[id] = await p.result(id);
  }
  return out;
}

// A client for a redis:// URL, or for a Redis Cluster given as
// redis+cluster://[user:password@]host:port[,host:port...]: ioredis follows MOVED and ASK
// itself, and every key of a namespace is in one slot (its {namespace} hash tag).
function connect(url) {
  // No retries behind the caller's back: a failed call must show.
  const options = { maxRetriesPerRequest: 0, enableOfflineQueue: true, lazyConnect: true };
  const cluster = /^(rediss?)\+cluster:\/\/(?:([^@/]*)@)?([^/?]+)/.exec(url);
  if (!cluster) return new Redis(url, options);
  const [, scheme, auth, hosts] = cluster;
  const seeds = hosts.split(',').map((hostPort) => {
    const at = hostPort.lastIndexOf(':');
    return { host: hostPort.slice(0, at).replace(/^\[|\]$/g, ''), port: Number(hostPort.slice(at + 1)) };
  });
  const redisOptions = { ...options };
  if (auth) {
    const [username, password] = auth.includes(':') ? auth.split(/:(.*)/s) : [undefined, auth];
    if (username) redisOptions.username = decodeURIComponent(username);
    redisOptions.password = decodeURIComponent(password);
  }
  if (scheme === 'rediss') redisOptions.tls = {};
  return new Redis.Cluster(seeds, { redisOptions, enableOfflineQueue: true, lazyConnect: true });
}

async function main() {
  const [url, namespace, mode] = process.argv.slice(2);
  if (!url || !namespace || !['enqueue', 'report'].includes(mode)) {
    process.stderr.write('usage: node producer.js <redis url> <namespace> enqueue|report\n');
    process.exit(2);
  }
  const redis = connect(url);
  await redis.connect();
  try {
    const p = new Producer(redis, namespace);
    const out = mode === 'enqueue' ? await enqueue(p) : await report(p);
    process.stdout.write(`${JSON.stringify(out)}\n`);
  } finally {
    redis.disconnect();
  }
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
