// The JS SDK's pieces, natively: conditions, names, the desired set, sessions and their
// frames, the scripted app (an in-memory fake of the host's exchange), and the export edge
// that turns a plugin into the component's `policy` interface.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import {
  Action,
  ChildName,
  Desired,
  ExchangeError,
  PolicyError,
  checkChildNames,
  children,
  condition,
  exchange,
  exportPlugin,
  frames,
  rfc3339,
  setCondition,
  alreadySet,
} from '../sdk/index.js';
import { ScriptedApp, observation } from '../sdk/testing.js';

const text = (bytes) => new TextDecoder().decode(bytes);

test('setCondition keeps lastTransitionTime while the status holds, and moves it when it changes', () => {
  const t0 = { seconds: 1_767_225_600 };
  const t1 = { seconds: 1_767_225_660 };
  let conditions = setCondition([], condition('Ready', false, 'Starting', 'one'), t0);
  assert.equal(conditions[0].lastTransitionTime, '2026-01-01T00:00:00Z');
  conditions = setCondition(conditions, condition('Ready', false, 'Starting', 'two'), t1);
  assert.equal(conditions[0].lastTransitionTime, '2026-01-01T00:00:00Z', 'same status, new message');
  assert.equal(conditions[0].message, 'two');
  conditions = setCondition(conditions, condition('Ready', true, 'Up', 'up'), t1);
  assert.equal(conditions[0].lastTransitionTime, '2026-01-01T00:01:00Z');
  assert.equal(conditions.length, 1);
  assert.ok(alreadySet(conditions, condition('Ready', true, 'Up', 'up')));
  assert.ok(!alreadySet(conditions, condition('Ready', true, 'Up', 'other')));
  assert.equal(rfc3339({ seconds: 0 }), '1970-01-01T00:00:00Z');
});

test('disruptionBudget keeps minAvailable of the selected Pods up and never writes maxUnavailable', () => {
  // maxUnavailable is read against the owner's scale subresource: a plugin's Pods are owned by
  // a custom resource, and a budget the disruption controller cannot compute guards nothing.
  const budget = children.disruptionBudget('demo', { app: 'demo' }, 2, { team: 'a' });
  assert.equal(budget.spec.minAvailable, 2);
  assert.equal(budget.spec.maxUnavailable, undefined);
  assert.deepEqual(budget.spec.selector, { matchLabels: { app: 'demo' } });
});

test('checkChildNames accepts a short name and says how long a name may be', () => {
  const names = [ChildName.service('{name}-servers'), ChildName.dnsLabel('Pod', '{name}-15')];
  assert.equal(checkChildNames('demo', names), undefined);
  const message = checkChildNames('x'.repeat(60), names);
  assert.match(message, /Service name `x+-servers` .* at most 63 characters/);
  assert.match(message, /at most 55 characters/);
  assert.match(checkChildNames('Demo', names), /lower-case letters, digits and '-' only/);
});

test('Desired applies what is wanted, then deletes the rest of its kinds, sparing kept and terminating children', () => {
  const pod = (name, extra = {}) => ({ ...children.childObject(children.podKind(), name), ...extra });
  const obs = observation({ metadata: { name: 'p' } })
    .child(children.podKind(), pod('p-0'))
    .child(children.podKind(), pod('p-1'))
    .child(children.podKind(), pod('p-2'))
    .child(children.podKind(), { ...pod('p-3'), metadata: { name: 'p-3', deletionTimestamp: 'x' } })
    .child(children.configMapKind(), children.childObject(children.configMapKind(), 'unmanaged'))
    .build();
  const actions = new Desired([children.podKind()]).want(pod('p-0')).keep(children.podKind(), 'p-1').actions(obs);
  assert.deepEqual(
    actions.map((a) => (a.tag === 'apply' ? `apply ${a.val.metadata.name}` : `${a.tag} ${a.val.name}`)),
    ['apply p-0', 'delete p-2'],
  );
});

test('a session cuts pipelined replies into frames and keeps the rest for the next read', () => {
  const app = new ScriptedApp().answers('db-0', 'admin', 'a\nb\n', 'one\ntwo\n');
  const session = app.connect('db-0', 'admin');
  session.send('a\n');
  session.send('b\n');
  assert.equal(text(session.receiveFrame(frames.line)), 'one\n');
  assert.equal(text(session.receiveFrame(frames.line)), 'two\n');
  assert.throws(() => session.receiveFrame(frames.line), (e) => e instanceof ExchangeError && e.kind === 'timeout');
});

test('frames.untilLine ends at a line that is exactly the terminator', () => {
  const end = frames.untilLine('END');
  const bytes = (t) => new TextEncoder().encode(t);
  assert.equal(end(bytes('x END\r\n')), undefined);
  assert.equal(end(bytes('x\r\nEND\r\nrest')), 'x\r\nEND\r\n'.length);
  assert.equal(end(bytes('END\r\n')), 5);
});

test('ScriptedApp: the same request gets the next unused answer, then the last; errors and unscripted rounds fail', () => {
  const app = new ScriptedApp()
    .answers('a', 'p', 'q\n', 'first\n')
    .answers('a', 'p', 'q\n', 'second\n')
    .fails('b', 'p', 'unreachable');
  const ask = (pod) => text(exchange(app, { pod, port: 'p', request: 'q\n', replyComplete: frames.line }));
  assert.deepEqual([ask('a'), ask('a'), ask('a')], ['first\n', 'second\n', 'second\n']);
  assert.throws(() => ask('b'), (e) => e instanceof ExchangeError && e.kind === 'unreachable');
  assert.throws(() => ask('c'), /no scripted exchange with pod `c`/);
  assert.equal(app.sessionLog().length, 5);
});

test('ScriptedApp reads the responder file policy-host simulate reads', () => {
  const responses = JSON.parse(readFileSync(new URL('../responses.json', import.meta.url), 'utf8'));
  const app = ScriptedApp.fromResponses(responses);
  const reply = text(exchange(app, { pod: 'demo-2', port: 'memcache', request: 'stats\r\n', replyComplete: frames.untilLine('END') }));
  assert.match(reply, /STAT evictions 3\r\n/);
  const hex = ScriptedApp.fromResponses({ sessions: [{ pod: 'x', sendHex: '0a', replyHex: '6f6b0a' }, { pod: 'y', error: 'timeout' }] });
  assert.equal(text(exchange(hex, { pod: 'x', port: 'any', request: '\n', replyComplete: frames.line })), 'ok\n');
  assert.throws(() => exchange(hex, { pod: 'y', port: 'any', request: 'anything', replyComplete: frames.line }), /timeout/);
});

const plugin = (reconcile) => ({
  describe: () => ({ name: 'edge', version: '0.0.1' }),
  reconcile,
});
const raw = () => observation({ metadata: { name: 'p' } }).raw();

test('the export edge hands the host JSON text, and a requeue as the bindings represent a u64', () => {
  const exported = exportPlugin(
    plugin(() => ({ actions: [Action.apply({ kind: 'Pod', metadata: { name: 'p-0' } }), Action.setStatus({ ok: true })], requeueAfterMs: 1500 })),
    new ScriptedApp(),
  );
  const decision = exported.reconcile(raw());
  assert.deepEqual(decision.actions, [
    { tag: 'apply', val: '{"kind":"Pod","metadata":{"name":"p-0"}}' },
    { tag: 'set-status', val: '{"ok":true}' },
  ]);
  assert.equal(decision.requeueAfterMs, 1500n);
  const quickjs = exported.reconcile({ ...raw(), now: { seconds: 1_767_225_600, nanoseconds: 0 } });
  assert.equal(quickjs.requeueAfterMs, 1500, 'a Number where the bindings hand over Numbers (componentize-qjs)');
  assert.deepEqual(exported.finalize(raw()), { actions: [], done: true, requeueAfterMs: undefined });
});

test('a PolicyError becomes the err payload; any other exception a PluginFailed refusal, never a trap', () => {
  const refuse = exportPlugin(plugin(() => { throw new PolicyError('NotYet', 'wait for x'); }), new ScriptedApp());
  assert.throws(() => refuse.reconcile(raw()), (e) => e.payload.reason === 'NotYet' && e.payload.message === 'wait for x');
  const buggy = exportPlugin(plugin((o) => o.parent().spec.missing.field), new ScriptedApp());
  assert.throws(() => buggy.reconcile(raw()), (e) => e.payload.reason === 'PluginFailed' && /edge failed while deciding \(TypeError/.test(e.payload.message));
  const badAction = exportPlugin(plugin(() => ({ actions: [{ tag: 'patch', val: {} }] })), new ScriptedApp());
  assert.throws(() => badAction.reconcile(raw()), (e) => e.payload.reason === 'PluginFailed' && /not one of apply/.test(e.payload.message));
  const badRequeue = exportPlugin(plugin(() => ({ actions: [], requeueAfterMs: -1 })), new ScriptedApp());
  assert.throws(() => badRequeue.reconcile(raw()), (e) => e.payload.reason === 'PluginFailed');
});

test('an observation whose parent is not JSON is refused with the reason InvalidObservation', () => {
  const exported = exportPlugin(plugin((o) => o.parentName()), new ScriptedApp());
  assert.throws(() => exported.reconcile({ ...raw(), parent: '{' }), (e) => e.payload.reason === 'InvalidObservation');
});

test('the SDK encodes and decodes UTF-8 as TextEncoder and TextDecoder do', async () => {
  const { decodeUtf8, encodeUtf8 } = await import('../sdk/utf8.js');
  for (const sample of ['', 'stats\r\n', 'é', '€ 100', '𝄞 clef', 'mixed ß 中文 🚀']) {
    assert.deepEqual(encodeUtf8(sample), new TextEncoder().encode(sample), sample);
    assert.equal(decodeUtf8(new TextEncoder().encode(sample)), sample, sample);
  }
  for (const bad of [[0xff], [0xc3], [0xe2, 0x82], [0xed, 0xa0, 0x80], [0xc0, 0xaf], [0x61, 0x80, 0x62]]) {
    assert.equal(decodeUtf8(Uint8Array.from(bad)), new TextDecoder().decode(Uint8Array.from(bad)), JSON.stringify(bad));
  }
});
