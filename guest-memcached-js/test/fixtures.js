// Fixtures of the plugin's tests: pools, server Pods as the kubelet reports them, and the
// `stats` replies of a running server. In-memory only; the decisions are pure.

import { children } from '../sdk/index.js';
import { serverPod } from '../src/children.js';
import { readSpec } from '../src/spec.js';
import { observation } from '../sdk/testing.js';

export const T0 = 1_767_225_600; // 2026-01-01T00:00:00Z

/** A MemcachedPool `demo` with `spec` and `status`. */
export function pool(spec = {}, status = undefined, name = 'demo') {
  const parent = { apiVersion: 'memcached.policy-host.io/v1alpha1', kind: 'MemcachedPool', metadata: { name, namespace: 'default', generation: 1 }, spec };
  if (status) parent.status = status;
  return parent;
}

/**
 * Server Pod `ordinal` of `demo` created for `spec`, in `phase`; running ones have an IP and,
 * unless `ready: false`, the Ready condition.
 */
export function serverPodObject(ordinal, spec = {}, { phase = 'Running', ready = true, terminating = false, waiting = undefined, pool = 'demo' } = {}) {
  const pod = serverPod(pool, ordinal, readSpec(spec).spec);
  pod.status = { phase };
  if (phase === 'Running') {
    pod.status.podIP = `10.0.0.${ordinal + 10}`;
    pod.status.conditions = [{ type: 'Ready', status: ready ? 'True' : 'False' }];
  }
  if (waiting) pod.status.containerStatuses = [{ name: 'memcached', restartCount: 3, state: { waiting: { reason: waiting } } }];
  if (terminating) pod.metadata.deletionTimestamp = '2026-01-01T00:00:00Z';
  return pod;
}

/** What memcached 1.6.18 answers to `stats` (the fields the plugin reads, and a few more). */
export function statsReply({ pid = 1, uptime = 100, items = 0, evictions = 0, maxbytes = 64 * 2 ** 20, version = '1.6.18' } = {}) {
  return [
    `STAT pid ${pid}`,
    `STAT uptime ${uptime}`,
    'STAT time 1767225600',
    `STAT version ${version}`,
    'STAT libevent 2.1.12-stable',
    'STAT pointer_size 64',
    `STAT curr_items ${items}`,
    'STAT total_items 0',
    `STAT evictions ${evictions}`,
    `STAT limit_maxbytes ${maxbytes}`,
    'STAT threads 4',
    'END',
    '',
  ].join('\r\n');
}

/** An observation of `parent` with `pods` and the pool's Services and budget, at `seconds`. */
export function observed(parent, pods, seconds = T0) {
  const builder = observation(parent).at(seconds);
  for (const pod of pods) builder.child(children.podKind(), pod);
  return builder.build();
}
