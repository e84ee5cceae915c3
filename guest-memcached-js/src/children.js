// Names and objects of what the plugin creates for a pool `<name>`: one Pod per server
// (`<name>-0` ...), the headless Service `<name>-servers` that gives each a DNS name (clients
// that hash keys over the servers list them as `<name>-0.<name>-servers:11211`), the client
// Service `<name>` over all ready servers, and the PodDisruptionBudget `<name>`.

import { ChildName, children } from '../sdk/index.js';

const { Container, Pod, disruptionBudget, headlessService, service } = children;

/** memcached's TCP port, named `memcache` on every server: the exchange capability asks for it. */
export const MEMCACHE_PORT = 11211;
export const MEMCACHE_PORT_NAME = 'memcache';

/** Label naming the pool a child belongs to. */
export const INSTANCE_LABEL = 'app.kubernetes.io/instance';
export const NAME_LABEL = 'app.kubernetes.io/name';

/**
 * Annotation on each server Pod: the image and memory it was created with. A Pod's command is
 * immutable, so a server whose annotation differs from the spec's is replaced, not patched.
 */
export const CONFIG_ANNOTATION = 'memcached.policy-host.io/server-config';

/** Memory a server's container may use beyond its cache: connections, hash table, threads. */
export const OVERHEAD_MIB = 32;

/**
 * Every name derived from the pool's name, with the largest ordinal (`spec.replicas` is at
 * most 16): a pool whose name makes one invalid is refused before anything is applied.
 */
export const CHILD_NAMES = [
  ChildName.service('{name}'),
  ChildName.service('{name}-servers'),
  ChildName.dnsLabel('Pod', '{name}-15'),
  ChildName.labelValue(INSTANCE_LABEL, '{name}'),
];

export const podName = (pool, ordinal) => `${pool}-${ordinal}`;
export const headlessName = (pool) => `${pool}-servers`;

/** The ordinal of a server Pod of `pool`, or undefined if `pod` is not one. */
export function ordinal(pool, pod) {
  const rest = pod.startsWith(`${pool}-`) ? pod.slice(pool.length + 1) : undefined;
  return rest !== undefined && /^(0|[1-9][0-9]*)$/.test(rest) ? Number(rest) : undefined;
}

/** The server configuration a Pod is created with, as its annotation says it. */
export const serverConfig = (spec) => `image=${spec.image},memoryMiB=${spec.memoryMiB}`;

const selector = (pool) => ({ [INSTANCE_LABEL]: pool, [NAME_LABEL]: 'memcached' });

/** The server Pod `<pool>-<ordinal>`: `memcached -p 11211 -U 0 -l 0.0.0.0 -m <memoryMiB>`. */
export function serverPod(pool, ordinalNumber, spec) {
  const name = podName(pool, ordinalNumber);
  const memory = `${spec.memoryMiB + OVERHEAD_MIB}Mi`;
  return new Pod(name)
    .label(INSTANCE_LABEL, pool)
    .label(NAME_LABEL, 'memcached')
    .annotation(CONFIG_ANNOTATION, serverConfig(spec))
    .stableDns(headlessName(pool))
    .container(
      new Container('memcached', spec.image)
        .field('command', ['memcached'])
        // TCP only (-U 0: the UDP port served amplification attacks), on every address, with
        // the cache size of the spec.
        .args(['-p', String(MEMCACHE_PORT), '-U', '0', '-l', '0.0.0.0', '-m', String(spec.memoryMiB), '-c', '1024'])
        .port(MEMCACHE_PORT_NAME, MEMCACHE_PORT)
        .readyOnTcp(MEMCACHE_PORT_NAME)
        .field('resources', { requests: { memory }, limits: { memory } }),
    )
    .build();
}

/** The headless Service `<pool>-servers`: `<pool>-<n>.<pool>-servers` per server. */
export const serversService = (pool) =>
  headlessService(headlessName(pool), selector(pool), [[MEMCACHE_PORT_NAME, MEMCACHE_PORT]], { [INSTANCE_LABEL]: pool });

/** The client Service `<pool>`, over every ready server. */
export const clientService = (pool) =>
  service(pool, selector(pool), [[MEMCACHE_PORT_NAME, MEMCACHE_PORT]], { [INSTANCE_LABEL]: pool });

/**
 * The PodDisruptionBudget `<pool>`: every server of `replicas` but one stays up through
 * evictions, as the rollout replaces one at a time.
 */
export const budget = (pool, replicas) =>
  disruptionBudget(pool, selector(pool), Math.max(replicas - 1, 0), { [INSTANCE_LABEL]: pool });
