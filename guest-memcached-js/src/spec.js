// The `MemcachedPool` custom resource (`memcached.policy-host.io/v1alpha1`): its spec with
// defaults, and why a spec cannot run. The CRD (../crd.yaml) validates the same bounds on
// admission; the plugin checks again because a CRD may be installed without them, and a bad
// spec must become a condition and an Event, never a crash.

import { namespacedKind } from '../sdk/index.js';

/** The custom resource this plugin reconciles: `memcachedpools.memcached.policy-host.io`. */
export const targetKind = () => namespacedKind('memcached.policy-host.io', 'v1alpha1', 'MemcachedPool', 'memcachedpools');

/** memcached version when `spec.version` is not set: Debian 12's package. */
export const DEFAULT_VERSION = '1.6.18';

/** Servers when `spec.replicas` is not set. */
export const DEFAULT_REPLICAS = 3;

/** Most servers one pool may run: a decision holds one session per server, and the host allows 16 open at once. */
export const MAX_REPLICAS = 16;

/** Cache memory per server when `spec.memoryMiB` is not set (memcached's own default). */
export const DEFAULT_MEMORY_MIB = 64;

/**
 * Least cache memory per server: memcached hands memory out in 1 MiB slab pages, one class of
 * pages per item size (about 40 classes with the default growth factor), so a server with
 * much less than this cannot give every size its page and refuses stores ("SERVER_ERROR out
 * of memory storing object"). 64 MiB is also memcached's own default.
 */
export const MIN_MEMORY_MIB = 64;

/** Most cache memory per server. */
export const MAX_MEMORY_MIB = 65536;

const VERSION_PATTERN = /^[0-9]+\.[0-9]+\.[0-9]+$/;

/**
 * The spec with defaults filled in, and `problem`: why it cannot run (a message naming the
 * field to fix), or undefined.
 */
export function readSpec(raw = {}) {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    return { spec: undefined, problem: `spec is ${JSON.stringify(raw)}, not an object; write spec as a mapping (replicas, memoryMiB, version)` };
  }
  const spec = {
    replicas: raw.replicas ?? DEFAULT_REPLICAS,
    memoryMiB: raw.memoryMiB ?? DEFAULT_MEMORY_MIB,
    version: raw.version ?? DEFAULT_VERSION,
    image: raw.image,
  };
  spec.image ??= typeof spec.version === 'string' ? `memcached:${spec.version}` : undefined;
  return { spec, problem: problemOf(spec) };
}

function problemOf(spec) {
  if (!Number.isInteger(spec.replicas) || spec.replicas < 0 || spec.replicas > MAX_REPLICAS) {
    return `spec.replicas is ${JSON.stringify(spec.replicas)}; set it to a whole number from 0 to ${MAX_REPLICAS}`;
  }
  if (!Number.isInteger(spec.memoryMiB) || spec.memoryMiB < MIN_MEMORY_MIB || spec.memoryMiB > MAX_MEMORY_MIB) {
    return `spec.memoryMiB is ${JSON.stringify(spec.memoryMiB)}; set it to a whole number of MiB from ${MIN_MEMORY_MIB} (memcached needs a 1 MiB slab page per item size class) to ${MAX_MEMORY_MIB}`;
  }
  if (typeof spec.version !== 'string' || !VERSION_PATTERN.test(spec.version)) {
    return `spec.version ${JSON.stringify(spec.version)} is not a memcached version such as ${DEFAULT_VERSION}; fix spec.version`;
  }
  if (typeof spec.image !== 'string' || spec.image === '' || /\s/.test(spec.image)) {
    return `spec.image ${JSON.stringify(spec.image)} is not an image reference; remove it (to run memcached:<spec.version>) or set one`;
  }
  return undefined;
}
