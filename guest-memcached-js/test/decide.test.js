// The memcached plugin's decisions, natively: fake observations (pools and server Pods built
// in memory) and a scripted app (in-memory `stats` replies) through the whole plugin,
// `gather` and `decide`. One test per situation, named after it.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { children } from '../sdk/index.js';
import { ScriptedApp, applied, converge, deleted, events, status, summarize } from '../sdk/testing.js';
import { CONFIG_ANNOTATION } from '../src/children.js';
import { REQUEUE_BUSY_MS, REQUEUE_STEADY_MS, STATS_REFRESH_SECONDS } from '../src/decide.js';
import { PLUGIN_VERSION, memcachedPlugin } from '../src/memcached.js';
import { T0, observed, pool, serverPodObject, statsReply } from './fixtures.js';

const pod = children.podKind();
const condition = (decision, type) => status(decision).conditions.find((c) => c.type === type);

/** An app where every server `ordinals` answers `stats` with `reply(ordinal)`. */
function answering(ordinals, reply = () => statsReply()) {
  const app = new ScriptedApp();
  for (const o of ordinals) app.answers(`demo-${o}`, 'memcache', 'stats\r\n', reply(o));
  return app;
}

const decide = (parent, pods, app = new ScriptedApp(), seconds = T0) => memcachedPlugin.reconcile(observed(parent, pods, seconds), app);

test('describe: memcachedpools, its Pods, Services and budget, sessions on port memcache, package.json version', () => {
  const info = memcachedPlugin.describe();
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  assert.equal(info.version, pkg.version);
  assert.equal(PLUGIN_VERSION, pkg.version);
  assert.equal(info.target.plural, 'memcachedpools');
  assert.deepEqual(info.children.map((k) => k.kind), ['Pod', 'Service', 'PodDisruptionBudget']);
  assert.deepEqual(info.capabilities, [{ tag: 'exchange', val: 'memcache' }]);
});

test('a new pool creates its servers, both Services and the budget, and is not ready yet', () => {
  const decision = decide(pool({ replicas: 3, memoryMiB: 128 }), []);
  assert.deepEqual(summarize(decision), [
    'apply Pod/demo-0',
    'apply Pod/demo-1',
    'apply Pod/demo-2',
    'apply Service/demo-servers',
    'apply Service/demo',
    'apply PodDisruptionBudget/demo',
    'set-status',
  ]);
  const server = applied(decision, pod, 'demo-1')[0];
  const container = server.spec.containers[0];
  assert.equal(container.image, 'memcached:1.6.18');
  assert.deepEqual(container.args, ['-p', '11211', '-U', '0', '-l', '0.0.0.0', '-m', '128', '-c', '1024']);
  assert.deepEqual(container.ports, [{ name: 'memcache', containerPort: 11211, protocol: 'TCP' }]);
  assert.equal(server.spec.subdomain, 'demo-servers');
  assert.equal(server.metadata.annotations[CONFIG_ANNOTATION], 'image=memcached:1.6.18,memoryMiB=128');
  assert.equal(applied(decision, children.serviceKind(), 'demo-servers')[0].spec.clusterIP, 'None');
  // All servers but one stay up through evictions: two of three.
  const budget = applied(decision, children.pdbKind(), 'demo')[0];
  assert.equal(budget.spec.minAvailable, 2);
  assert.equal(budget.spec.maxUnavailable, undefined);
  assert.equal(condition(decision, 'Ready').status, 'False');
  assert.equal(condition(decision, 'Progressing').reason, 'Scaling');
  assert.equal(decision.requeueAfterMs, REQUEUE_BUSY_MS);
});

test('every server answering stats: Ready, Converged, per-server figures, a steady requeue', () => {
  const pods = [0, 1, 2].map((o) => serverPodObject(o));
  const app = answering([0, 1, 2], (o) => statsReply({ pid: 10 + o, uptime: 300 + o, items: o * 5, evictions: o }));
  const decision = decide(pool({ replicas: 3 }), pods, app);
  const s = status(decision);
  assert.equal(s.readyServers, 3);
  assert.deepEqual(s.servers[2], { name: 'demo-2', pid: 12, version: '1.6.18', uptimeSeconds: 302, currItems: 10, evictions: 2, memoryMiB: 64 });
  assert.equal(s.statsAt, '2026-01-01T00:00:00Z');
  assert.deepEqual(
    s.conditions.map((c) => `${c.type}=${c.status}/${c.reason}`),
    ['Ready=True/AllServersAnswer', 'Progressing=False/Converged', 'Degraded=False/Healthy'],
  );
  assert.deepEqual(events(decision), []);
  assert.equal(decision.requeueAfterMs, REQUEUE_STEADY_MS);
  assert.deepEqual(app.sessionLog().map((r) => `${r.pod} ${JSON.stringify(r.sent)}`), [
    'demo-0 "stats\\r\\n"',
    'demo-1 "stats\\r\\n"',
    'demo-2 "stats\\r\\n"',
  ]);
});

test('a settled pool decides the same again: the status it wrote is the status it writes', () => {
  const pods = [0, 1].map((o) => serverPodObject(o));
  const first = decide(pool({ replicas: 2 }), pods, answering([0, 1]));
  const second = decide(pool({ replicas: 2 }, status(first)), pods, answering([0, 1]), T0 + 15);
  assert.deepEqual(status(second), status(first));
  assert.deepEqual(summarize(second), summarize(first));
});

test('counters that move with traffic are refreshed at most every STATS_REFRESH_SECONDS, a restarted server at once', () => {
  const pods = [0].map((o) => serverPodObject(o));
  const first = status(decide(pool({ replicas: 1 }), pods, answering([0], () => statsReply({ pid: 1, items: 1 }))));
  const busy = (items, pid = 1) => answering([0], () => statsReply({ pid, items }));
  const soon = status(decide(pool({ replicas: 1 }, first), pods, busy(500), T0 + 20));
  assert.equal(soon.servers[0].currItems, 1, 'kept within the refresh period');
  const later = status(decide(pool({ replicas: 1 }, first), pods, busy(500), T0 + STATS_REFRESH_SECONDS));
  assert.equal(later.servers[0].currItems, 500);
  assert.equal(later.statsAt, '2026-01-01T00:01:00Z');
  const restarted = status(decide(pool({ replicas: 1 }, first), pods, busy(0, 99), T0 + 5));
  assert.equal(restarted.servers[0].pid, 99, 'a new pid is reported at once');
});

test('negative replicas: Degraded InvalidSpec, one Warning Event, nothing applied or deleted', () => {
  const pods = [0].map((o) => serverPodObject(o));
  const decision = decide(pool({ replicas: -1 }), pods, answering([0]));
  assert.deepEqual(summarize(decision), ['event Warning/InvalidSpec', 'set-status']);
  const degraded = condition(decision, 'Degraded');
  assert.equal(degraded.status, 'True');
  assert.equal(degraded.reason, 'InvalidSpec');
  assert.match(degraded.message, /spec\.replicas is -1; set it to a whole number from 0 to 16/);
  assert.equal(events(decision)[0].message, degraded.message);
  assert.equal(decision.requeueAfterMs, undefined);
  const again = decide(pool({ replicas: -1 }, status(decision)), pods, answering([0]), T0 + 30);
  assert.deepEqual(summarize(again), ['set-status'], 'the Event is recorded once, when the condition appears');
  assert.equal(condition(again, 'Degraded').lastTransitionTime, degraded.lastTransitionTime);
});

test('too little memory and a name too long for its children are invalid specs too', () => {
  const small = decide(pool({ memoryMiB: 8 }), []);
  assert.match(condition(small, 'Degraded').message, /spec\.memoryMiB is 8/);
  const long = decide(pool({}, undefined, 'x'.repeat(60)), []);
  assert.equal(condition(long, 'Degraded').reason, 'InvalidSpec');
  assert.match(condition(long, 'Degraded').message, /at most 55 characters/);
  assert.deepEqual(applied(long, pod), []);
});

test('a fixed spec clears InvalidSpec', () => {
  const bad = decide(pool({ replicas: -1 }), []);
  const fixed = decide(pool({ replicas: 1 }, status(bad)), [], new ScriptedApp(), T0 + 10);
  assert.equal(condition(fixed, 'Degraded').status, 'False');
  assert.equal(condition(fixed, 'Degraded').lastTransitionTime, '2026-01-01T00:00:10Z');
  assert.deepEqual(applied(fixed, pod).map((p) => p.metadata.name), ['demo-0']);
});

test('scaling down deletes the servers past spec.replicas', () => {
  const pods = [0, 1, 2].map((o) => serverPodObject(o));
  const decision = decide(pool({ replicas: 2 }), pods, answering([0, 1, 2]));
  assert.deepEqual(deleted(decision, pod), ['demo-2']);
  assert.equal(condition(decision, 'Progressing').reason, 'Scaling');
  assert.equal(status(decision).readyServers, 2);
});

test('scaled to zero: every server goes and the pool is Ready with nothing to serve', () => {
  const pods = [0, 1].map((o) => serverPodObject(o));
  const decision = decide(pool({ replicas: 0 }), pods, answering([0, 1]));
  assert.deepEqual(deleted(decision, pod), ['demo-0', 'demo-1']);
  assert.equal(condition(decision, 'Ready').reason, 'NoServersWanted');
});

test('a new version replaces one server at a time, the lowest first, while the others answer', () => {
  const old = [0, 1, 2].map((o) => serverPodObject(o, { version: '1.6.17' }));
  const decision = decide(pool({ replicas: 3, version: '1.6.18' }), old, answering([0, 1, 2]));
  assert.deepEqual(deleted(decision, pod), ['demo-0']);
  assert.deepEqual(applied(decision, pod), [], 'outdated servers are not patched: a Pod command is immutable');
  assert.deepEqual(events(decision).map((e) => e.reason), ['ServerReplaced']);
  assert.match(events(decision)[0].message, /demo-0 runs image=memcached:1\.6\.17,memoryMiB=64; replacing it to run image=memcached:1\.6\.18/);
  assert.equal(condition(decision, 'Progressing').reason, 'RollingUpdate');

  const going = [serverPodObject(0, { version: '1.6.17' }, { terminating: true }), ...old.slice(1)];
  const waiting = decide(pool({ replicas: 3, version: '1.6.18' }), going, answering([1, 2]));
  assert.deepEqual(deleted(waiting, pod), [], 'nothing more goes while one is terminating');
  assert.deepEqual(applied(waiting, pod), [], 'its name is not applied while it terminates');

  const recreated = [serverPodObject(0, { version: '1.6.18' }, { phase: 'Pending' }), ...old.slice(1)];
  const starting = decide(pool({ replicas: 3, version: '1.6.18' }), recreated, answering([1, 2]));
  assert.deepEqual(deleted(starting, pod), [], 'the next waits until the new one answers');
});

test('an outdated server that does not answer is replaced when every other one does; not when another is down too', () => {
  const spec = { replicas: 3, memoryMiB: 128 };
  const pods = [0, 1, 2].map((o) => serverPodObject(o, o === 1 ? { memoryMiB: 64 } : spec));
  assert.deepEqual(deleted(decide(pool(spec), pods, answering([0, 2])), pod), ['demo-1']);
  assert.deepEqual(deleted(decide(pool(spec), pods, answering([2])), pod), []);
});

test('a server whose Pod failed is deleted with a Warning, and the pool is Degraded until it is back', () => {
  const pods = [serverPodObject(0), serverPodObject(1, {}, { phase: 'Failed' })];
  const decision = decide(pool({ replicas: 2 }), pods, answering([0]));
  assert.deepEqual(deleted(decision, pod), ['demo-1']);
  assert.deepEqual(events(decision).map((e) => `${e.eventType} ${e.reason}`), ['warning ServerEnded', 'warning ServerFailing']);
  assert.equal(condition(decision, 'Degraded').message, 'demo-1: Failed');
});

test('a server in CrashLoopBackOff makes the pool Degraded, with one Event', () => {
  const pods = [serverPodObject(0), serverPodObject(1, {}, { ready: false, waiting: 'CrashLoopBackOff' })];
  const app = answering([0]).fails('demo-1', 'memcache', 'unreachable');
  const decision = decide(pool({ replicas: 2 }), pods, app);
  assert.equal(condition(decision, 'Degraded').reason, 'ServerFailing');
  const again = decide(pool({ replicas: 2 }, status(decision)), pods, answering([0]).fails('demo-1', 'memcache'), T0 + 2);
  assert.deepEqual(events(again), []);
});

test('a ready server that answers ERROR to stats is Degraded ServerNotAnswering, not a failed decision', () => {
  const pods = [serverPodObject(0), serverPodObject(1)];
  const app = answering([0]).answers('demo-1', 'memcache', 'stats\r\n', 'ERROR\r\n');
  const decision = decide(pool({ replicas: 2 }), pods, app);
  const degraded = condition(decision, 'Degraded');
  assert.equal(degraded.reason, 'ServerNotAnswering');
  assert.match(degraded.message, /demo-1: the server answered `ERROR` to stats/);
  assert.equal(status(decision).readyServers, 1);
  assert.equal(condition(decision, 'Ready').status, 'False');
  assert.equal(condition(decision, 'Progressing').status, 'False', 'a ready server that does not answer is not starting');
});

test('a server still starting (not ready, not reachable) is Progressing Starting, not Degraded', () => {
  const pods = [serverPodObject(0), serverPodObject(1, {}, { ready: false })];
  const app = answering([0]).fails('demo-1', 'memcache', 'unreachable');
  const decision = decide(pool({ replicas: 2 }), pods, app);
  assert.equal(condition(decision, 'Progressing').reason, 'Starting');
  assert.equal(condition(decision, 'Degraded').status, 'False');
  assert.equal(decision.requeueAfterMs, REQUEUE_BUSY_MS);
});

test('Pods not yet running are not asked anything', () => {
  const app = new ScriptedApp();
  decide(pool({ replicas: 2 }), [serverPodObject(0, {}, { phase: 'Pending' }), serverPodObject(1, {}, { terminating: true })], app);
  assert.deepEqual(app.sessionLog(), []);
});

/** The cluster as the converge model sees it: every Pod runs and is ready at once. */
function runningPods(object) {
  if (object.kind !== 'Pod') return object;
  const ordinalNumber = Number(object.metadata.name.split('-').at(-1));
  return { ...object, status: { phase: 'Running', podIP: `10.0.0.${ordinalNumber + 10}`, conditions: [{ type: 'Ready', status: 'True' }] } };
}

test('a new pool converges to Ready and then stays put', () => {
  const { parent, children: made, events: recorded } = converge(memcachedPlugin, pool({ replicas: 3 }), {
    app: answering([0, 1, 2]),
    kubelet: runningPods,
  });
  assert.equal(parent.status.readyServers, 3);
  assert.deepEqual(parent.status.conditions.map((c) => `${c.type}=${c.status}`), ['Ready=True', 'Progressing=False', 'Degraded=False']);
  assert.deepEqual(made.map((o) => `${o.kind}/${o.metadata.name}`).sort(), [
    'Pod/demo-0', 'Pod/demo-1', 'Pod/demo-2', 'PodDisruptionBudget/demo', 'Service/demo', 'Service/demo-servers',
  ]);
  assert.deepEqual(recorded, []);
});

test('a version change converges with every server replaced, one at a time', () => {
  const before = converge(memcachedPlugin, pool({ replicas: 3, version: '1.6.17' }), { app: answering([0, 1, 2]), kubelet: runningPods });
  const { parent, children: after, events: recorded, decisions } = converge(
    memcachedPlugin,
    { ...pool({ replicas: 3, version: '1.6.18' }), status: before.parent.status },
    { app: answering([0, 1, 2]), kubelet: runningPods, children: before.children },
  );
  assert.deepEqual(
    after.filter((o) => o.kind === 'Pod').map((p) => p.spec.containers[0].image),
    ['memcached:1.6.18', 'memcached:1.6.18', 'memcached:1.6.18'],
  );
  assert.deepEqual(recorded.map((e) => e.reason), ['ServerReplaced', 'ServerReplaced', 'ServerReplaced']);
  for (const decision of decisions) assert.ok(deleted(decision, pod).length <= 1, 'at most one server goes per decision');
  assert.equal(parent.status.conditions.find((c) => c.type === 'Progressing').reason, 'Converged');
});
