// The memcached policy plugin for policy-host: a pool of independent memcached servers (the
// clients hash keys over them), with a headless Service, a client Service and a
// PodDisruptionBudget, and each server's `stats` in the pool's status.
//
// policy-host watches `MemcachedPool` resources (`memcached.policy-host.io/v1alpha1`) and
// hands this plugin each one with its Pods, Services and budget. memcached speaks its own
// text protocol, not HTTP, so the plugin asks each running server `stats` over the
// contract's `exchange` capability (a session to the granted `memcache` port of its own
// Pods). The host knows nothing of memcached.
//
// - spec.js     — the custom resource's spec, defaults and validation
// - protocol.js — memcached's `stats` command and reply
// - children.js — the server Pods, the Services and the budget
// - decide.js   — the decisions (pure; tested natively against in-memory facts)
//
// This file is the only one that talks to the app: `gather` collects the facts, `decide`
// turns them into actions.

import { Capability, ExchangeError, children, log } from '../sdk/index.js';
import { CONFIG_ANNOTATION, MEMCACHE_PORT_NAME, ordinal } from './children.js';
import { decide } from './decide.js';
import { ProtocolError, STATS_REQUEST, parseStats, serverFacts, statsReplyLength } from './protocol.js';
import { targetKind } from './spec.js';

/** The plugin's name and version, as the host knows them (package.json's version). */
export const PLUGIN_NAME = 'memcached';
export const PLUGIN_VERSION = '0.1.0';

/** How long to wait for a server's reply (ms). */
const REPLY_TIMEOUT_MS = 2_000;

/** What one server says to `stats`: `{ answer }` or `{ error }` (a message). */
export function askStats(app, pod) {
  let session;
  try {
    session = app.connect(pod, MEMCACHE_PORT_NAME).withTimeoutMs(REPLY_TIMEOUT_MS);
    return { answer: serverFacts(parseStats(session.request(STATS_REQUEST, statsReplyLength))) };
  } catch (error) {
    if (error instanceof ExchangeError || error instanceof ProtocolError) return { error: error.message };
    throw error;
  } finally {
    session?.close();
  }
}

/** The facts of one observation: the pool, its server Pods, and each running server's `stats`. */
export function gather(observation, app) {
  const parent = observation.parent();
  const name = observation.parentName();
  const servers = [];
  for (const pod of observation.pods(children.podKind())) {
    const server = {
      name: pod.name,
      ordinal: ordinal(name, pod.name),
      phase: pod.phase,
      terminating: pod.terminating,
      ended: pod.ended,
      ready: pod.ready,
      config: pod.annotation(CONFIG_ANNOTATION),
      waitingReason: pod.waitingReason('memcached'),
      answer: undefined,
      error: undefined,
    };
    if (!server.terminating && server.phase === 'Running' && pod.ip && server.ordinal !== undefined) {
      Object.assign(server, askStats(app, pod.name));
      if (server.error) log.debug('server does not answer stats', { pod: pod.name, error: server.error });
    }
    servers.push(server);
  }
  servers.sort((a, b) => (a.ordinal ?? Infinity) - (b.ordinal ?? Infinity) || a.name.localeCompare(b.name));
  return {
    name,
    generation: observation.parentGeneration(),
    spec: parent.spec ?? {},
    status: parent.status ?? {},
    servers,
    now: observation.now,
    observation,
  };
}

/** The plugin, as `exportPlugin` exports it. */
export const memcachedPlugin = {
  describe() {
    return {
      name: PLUGIN_NAME,
      version: PLUGIN_VERSION,
      target: targetKind(),
      children: [children.podKind(), children.serviceKind(), children.pdbKind()],
      capabilities: [Capability.exchange(MEMCACHE_PORT_NAME)],
      wantsFinalizer: false,
    };
  },

  reconcile(observation, app) {
    return decide(gather(observation, app));
  },
};
