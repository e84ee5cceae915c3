// The native test kit, in-memory fakes for unit tests of pure decision logic (no host, no
// wasm, no app): observations built in a line, a scripted App, and readers of a decision.
//
//   const obs = observation(parent).child(podKind(), pod).at(1_700_000_000).build();
//   const app = new ScriptedApp().answers('demo-0', 'memcache', 'stats\r\n', 'STAT pid 1\r\nEND\r\n');
//   const decision = plugin.reconcile(obs, app);
//   status(decision); events(decision); applied(decision, podKind(), 'demo-0');
//
// `ScriptedApp` answers sessions by rounds, as the host's own script does in `policy-host
// simulate` and shadow mode: a round is the bytes the plugin sent on a connection since it
// last read (none when the server speaks first) and the app's reply; the same request twice
// gets the next unused answer, then the last. `ScriptedApp.fromResponses(json)` reads the
// responder file `simulate --responses` reads, so one file serves both.

import { AppCallError, CredentialError, ExchangeError, Session } from './app.js';
import { sameKind, summary } from './contract.js';
import { Observation } from './observation.js';
import { decodeUtf8, encodeUtf8 } from './utf8.js';


const hexBytes = (hex) => Uint8Array.from(hex.match(/../g) ?? [], (h) => parseInt(h, 16));
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

/** Builds an observation: `observation(parent).child(kind, object).at(seconds).build()`. */
export function observation(parent) {
  const children = [];
  let seconds = 1_767_225_600; // 2026-01-01T00:00:00Z
  const builder = {
    child(kind, object) {
      children.push({ kind, object: JSON.stringify(object) });
      return builder;
    },
    at(at) {
      seconds = at;
      return builder;
    },
    /** The observation as the host hands it to the component (JSON text, BigInt seconds). */
    raw() {
      return { parent: JSON.stringify(parent), children: [...children], now: { seconds: BigInt(seconds), nanoseconds: 0 } };
    },
    build() {
      return new Observation(builder.raw());
    },
  };
  return builder;
}

/** A connection of the scripted app: rounds of (sent since the last read, reply). */
class ScriptedConnection {
  constructor(app, pod, port) {
    this.app = app;
    this.pod = pod;
    this.port = port;
    this.sent = new Uint8Array(0);
    this.pending = new Uint8Array(0);
    this.rounds = 0;
  }

  send(bytes) {
    const joined = new Uint8Array(this.sent.length + bytes.length);
    joined.set(this.sent);
    joined.set(bytes, this.sent.length);
    this.sent = joined;
  }

  receive(maxBytes) {
    if (this.pending.length === 0) {
      if (this.rounds > 0 && this.sent.length === 0) throw new ExchangeError('timeout');
      this.pending = this.app.answer(this.pod, this.port, this.sent);
      this.sent = new Uint8Array(0);
      this.rounds += 1;
    }
    const chunk = this.pending.slice(0, maxBytes);
    this.pending = this.pending.slice(chunk.length);
    return chunk;
  }

  close() {}
}

/** A fake App whose answers are written down in advance. */
export class ScriptedApp {
  constructor() {
    this.rows = [];
    this.httpRows = [];
    this.credentials = [];
    this.used = new Set();
    this.log = [];
  }

  /** `pod` speaks first on `port` with `reply`. */
  greets(pod, port, reply) {
    return this.answers(pod, port, new Uint8Array(0), reply);
  }

  /** When `sent` arrives on `port` of `pod`, the app answers `reply` (strings are UTF-8). */
  answers(pod, port, sent, reply) {
    this.rows.push({ pod, port, sent: toBytes(sent), reply: toBytes(reply) });
    return this;
  }

  /** Every round on `port` of `pod` fails with `kind` (`unreachable`, `timeout`, `closed`, `refused`). */
  fails(pod, port, kind = 'unreachable') {
    this.rows.push({ pod, port, sent: undefined, error: kind });
    return this;
  }

  /** An HTTP app-call to `path` of `pod` (`*`: any) answers `status` and `body`. */
  respond(pod, path, status, body) {
    this.httpRows.push({ pod, path, status, body });
    return this;
  }

  /** `credential(secret, key)` returns `value`. */
  withCredential(secret, key, value) {
    this.credentials.push({ secret, key, value: toBytes(value) });
    return this;
  }

  /** The responder file of `policy-host simulate --responses` (as parsed JSON). */
  static fromResponses(responses) {
    const app = new ScriptedApp();
    for (const row of responses.sessions ?? []) {
      // Without `send`, an error row answers every round and a reply row is the greeting.
      const sent = row.sendHex !== undefined ? hexBytes(row.sendHex) : row.send !== undefined ? toBytes(row.send) : undefined;
      if (row.error) app.rows.push({ pod: row.pod, port: row.port, sent, error: row.error });
      else app.answers(row.pod, row.port, sent ?? new Uint8Array(0), row.replyHex !== undefined ? hexBytes(row.replyHex) : toBytes(row.reply ?? ''));
    }
    for (const row of responses.appCalls ?? []) app.respond(row.pod, row.path, row.status ?? 200, row.body ?? '');
    for (const row of responses.credentials ?? []) app.withCredential(row.secret, row.key, row.value);
    return app;
  }

  /** Every round so far: `{ pod, port, sent, reply }` (text), or `error` instead of `reply`. */
  sessionLog() {
    return this.log;
  }

  connect(pod, port) {
    return new Session(pod, port, new ScriptedConnection(this, pod, port));
  }

  answer(pod, port, sent) {
    const matching = this.rows
      .map((row, index) => ({ row, index }))
      .filter(({ row }) => row.pod === pod && (row.port === undefined || row.port === port))
      .filter(({ row }) => (row.sent === undefined ? row.error !== undefined : same(row.sent, sent)));
    const entry = matching.find(({ index }) => !this.used.has(index)) ?? matching.at(-1);
    const round = { pod, port, sent: decodeUtf8(sent) };
    this.log.push(round);
    if (!entry) {
      round.error = 'unreachable';
      throw new ExchangeError('unreachable', `no scripted exchange with pod \`${pod}\` port \`${port}\` for this request (${sent.length} bytes)`);
    }
    this.used.add(entry.index);
    if (entry.row.error) {
      round.error = entry.row.error;
      throw new ExchangeError(entry.row.error, 'scripted');
    }
    round.reply = decodeUtf8(entry.row.reply);
    return entry.row.reply;
  }

  call({ pod, path }) {
    const row = this.httpRows.find((r) => (r.pod === pod || r.pod === '*') && r.path === path);
    if (!row) throw new AppCallError('unreachable', `no scripted answer for ${pod} ${path}`);
    return { status: row.status, body: row.body };
  }

  credential(secret, key) {
    const row = this.credentials.find((c) => c.secret === secret && c.key === key);
    if (!row) throw new CredentialError('refused', `no scripted credential ${secret}/${key}`);
    return row.value;
  }
}

function toBytes(bytes) {
  return typeof bytes === 'string' ? encodeUtf8(bytes) : bytes;
}

/** The objects a decision applies, of `kind` (and named `name`, if given). */
export function applied(decision, kind, name = undefined) {
  return decision.actions
    .filter((a) => a.tag === 'apply' && a.val.kind === kind.kind && (name === undefined || a.val.metadata?.name === name))
    .map((a) => a.val);
}

/** The names a decision deletes, of `kind`. */
export function deleted(decision, kind) {
  return decision.actions.filter((a) => a.tag === 'delete' && sameKind(a.val.kind, kind)).map((a) => a.val.name);
}

/** The status a decision sets (the last), or undefined. */
export function status(decision) {
  return decision.actions.filter((a) => a.tag === 'set-status').at(-1)?.val;
}

/** The Events a decision records. */
export function events(decision) {
  return decision.actions.filter((a) => a.tag === 'record-event').map((a) => a.val);
}

/** One line per action (`apply Pod/demo-0`, `event Warning/InvalidSpec`). */
export function summarize(decision) {
  return decision.actions.map(summary);
}

/**
 * Runs `plugin` against an in-memory model of its parent and children until a decision
 * changes nothing (the Rust SDK's `Harness::converge`, and `policy-host simulate` natively):
 * applies replace a child (keeping the `status` the model gave it), deletes remove it at once,
 * `set-status` replaces the parent's status, Events are collected. `kubelet(object)` stands in
 * for the cluster: it gets each applied child and returns it as observed (give a Pod its
 * `status` there). Time moves by each decision's requeue (1 s without one).
 *
 * `children` seeds the model with observed children (a pool as it ran before a change).
 * Returns `{ parent, children, events, decisions }` once converged; throws after `steps`
 * decisions that each changed something.
 */
export function converge(plugin, parent, { app = new ScriptedApp(), steps = 20, at = 1_767_225_600, kubelet = (object) => object, children = [] } = {}) {
  const kinds = plugin.describe().children;
  const kindOf = (object) => kinds.find((k) => k.kind === object.kind && (k.group ? `${k.group}/${k.version}` : k.version) === object.apiVersion);
  const key = (kind, name) => `${kind.group}/${kind.kind}/${name}`;
  const model = { parent: JSON.parse(JSON.stringify(parent)), children: new Map() };
  for (const object of children) {
    const kind = kindOf(object);
    if (!kind) throw new Error(`seeded child ${object.kind}/${object.metadata?.name} is of no kind the plugin declares`);
    model.children.set(key(kind, object.metadata.name), { kind, object });
  }
  const events = [];
  const decisions = [];
  let seconds = at;
  for (let step = 0; step < steps; step++) {
    const builder = observation(model.parent).at(seconds);
    for (const { kind, object } of model.children.values()) builder.child(kind, object);
    const decision = plugin.reconcile(builder.build(), app);
    decisions.push(decision);
    let changed = false;
    for (const action of decision.actions) {
      if (action.tag === 'apply') {
        const kind = kindOf(action.val);
        if (!kind) throw new Error(`${summary(action)}: the plugin does not declare this kind in describe().children`);
        const k = key(kind, action.val.metadata.name);
        const before = model.children.get(k)?.object;
        const applied = JSON.parse(JSON.stringify(action.val));
        if (before?.status) applied.status = before.status;
        const observed = kubelet(applied);
        if (JSON.stringify(observed) !== JSON.stringify(before)) changed = true;
        model.children.set(k, { kind, object: observed });
      } else if (action.tag === 'delete') {
        changed = model.children.delete(key(action.val.kind, action.val.name)) || changed;
      } else if (action.tag === 'set-status') {
        if (JSON.stringify(action.val) !== JSON.stringify(model.parent.status)) changed = true;
        model.parent.status = action.val;
      } else if (action.tag === 'record-event') {
        events.push(action.val);
        changed = true;
      }
    }
    if (!changed) {
      return { parent: model.parent, children: [...model.children.values()].map((c) => c.object), events, decisions };
    }
    seconds += (decision.requeueAfterMs ?? 1000) / 1000;
  }
  throw new Error(`no convergence within ${steps} decisions: each changed the model; raise steps or check the plugin`);
}
