// The decisions: which servers exist, which one is replaced next, and what the status says.
// Pure: facts in (the pool, each server's Pod and what it answered to `stats`), actions out.
//
// The rules:
// - A spec that cannot run (or a pool name that makes an invalid child name) changes nothing
//   but the status: `Degraded=True` with reason `InvalidSpec` and a message naming the field,
//   and one Warning Event when that condition first appears. Running servers keep running.
// - Servers are Pods `<name>-0 .. <name>-(replicas-1)`; a missing one is created, one past
//   `replicas` or one that ended (Failed, Succeeded) is deleted, and created again next time.
// - A server created with another image or memory size (its annotation) is replaced, one at a
//   time and only while every other wanted server answers `stats`: memcached holds no data
//   worth keeping, but the pool keeps serving all its key space but one server's.
// - The Services and the PodDisruptionBudget are applied on every decision.
// - Status: `readyServers` (servers answering `stats`), per server its pid, version, uptime,
//   items and evictions as of `statsAt`, and the conditions Ready, Progressing and Degraded.
//   The counters move with client traffic, so they are refreshed at most every
//   STATS_REFRESH_SECONDS (or when a server comes, goes or restarts): a status rewritten on
//   every decision would wake every watcher and, through the host's own watch, decide again.

import { Action, Desired, Event, alreadySet, checkChildNames, children, condition, rfc3339, setCondition } from '../sdk/index.js';
import { CHILD_NAMES, budget, clientService, podName, serverConfig, serverPod, serversService } from './children.js';
import { readSpec } from './spec.js';

/** Reconcile again this soon while anything moves (ms). */
export const REQUEUE_BUSY_MS = 2_000;

/** Reconcile again this soon when all is well, to notice a server that stopped answering (ms). */
export const REQUEUE_STEADY_MS = 15_000;

/** Least time between two refreshes of the per-server counters in the status (s). */
export const STATS_REFRESH_SECONDS = 60;

/** Container waiting reasons that mean a server will not start without a change. */
const FAILING_REASONS = new Set(['CrashLoopBackOff', 'ImagePullBackOff', 'ErrImagePull', 'InvalidImageName', 'CreateContainerConfigError']);

/**
 * Decides, from `facts` alone: `{ name, generation, spec (as written), status (as last
 * written), servers, now, observation }`, where each server is `{ name, ordinal, phase,
 * terminating, ended, ready, config, waitingReason, answer (serverFacts) | undefined,
 * error | undefined }`. `observation` is only read to prune children no longer wanted.
 */
export function decide(facts) {
  const previous = facts.status ?? {};
  let conditions = previous.conditions ?? [];
  const actions = [];
  const { spec, problem } = readSpec(facts.spec);
  const invalid = checkChildNames(facts.name, CHILD_NAMES) ?? problem;
  if (invalid) {
    const degraded = condition('Degraded', true, 'InvalidSpec', invalid, facts.generation);
    if (!alreadySet(conditions, degraded)) actions.push(Action.event(Event.warning('InvalidSpec', invalid)));
    conditions = setCondition(conditions, degraded, facts.now);
    actions.push(Action.setStatus({ ...previous, conditions }));
    // Nothing moves until the spec is edited, and an edit wakes the host.
    return { actions, requeueAfterMs: undefined };
  }

  const config = serverConfig(spec);
  const live = facts.servers.filter((s) => !s.terminating);
  const wanted = Array.from({ length: spec.replicas }, (_, i) => i);
  const at = new Map(live.filter((s) => s.ordinal !== undefined).map((s) => [s.ordinal, s]));
  const going = new Set(facts.servers.filter((s) => s.terminating).map((s) => s.name));
  const answers = (ordinal) => at.get(ordinal)?.answer !== undefined;

  // One outdated server at a time, while every other wanted server answers and none is going.
  const outdated = wanted.map((o) => at.get(o)).filter((s) => s && !s.ended && s.config !== config);
  const replaced =
    going.size === 0 ? outdated.find((s) => wanted.every((o) => o === s.ordinal || answers(o))) : undefined;

  const desired = new Desired([children.podKind(), children.serviceKind(), children.pdbKind()]);
  for (const o of wanted) {
    const server = at.get(o);
    if (!server) {
      // A Pod of that name still terminating is waited for: an apply would patch it.
      if (!going.has(podName(facts.name, o))) desired.want(serverPod(facts.name, o, spec));
    } else if (server.ended || server === replaced) {
      // Not wanted: deleted now, created again on a later decision.
    } else if (server.config !== config) {
      desired.keep(children.podKind(), server.name);
    } else {
      desired.want(serverPod(facts.name, o, spec));
    }
  }
  desired.want(serversService(facts.name)).want(clientService(facts.name)).want(budget(facts.name, spec.replicas));
  actions.push(...desired.actions(facts.observation));

  if (replaced) {
    actions.push(
      Action.event(
        Event.normal('ServerReplaced', `${replaced.name} runs ${replaced.config}; replacing it to run ${config}, one server at a time`),
      ),
    );
  }
  for (const s of live.filter((s) => s.ended && s.ordinal !== undefined && s.ordinal < spec.replicas)) {
    actions.push(Action.event(Event.warning('ServerEnded', `${s.name} ended (${s.phase}); creating it again`)));
  }

  // Status.
  const answering = wanted.map((o) => at.get(o)).filter((s) => s?.answer !== undefined);
  const readyServers = answering.length;
  const { servers, statsAt } = reportedServers(previous, answering, facts.now);

  const ready =
    spec.replicas === 0
      ? condition('Ready', true, 'NoServersWanted', 'spec.replicas is 0')
      : readyServers === spec.replicas
        ? condition('Ready', true, 'AllServersAnswer', `${readyServers} of ${spec.replicas} servers answer stats`)
        : condition('Ready', false, 'ServersNotAnswering', `${readyServers} of ${spec.replicas} servers answer stats`);

  const missing = wanted.filter((o) => !at.get(o)).length;
  // Starting: not answering yet and not ready yet; a ready server that does not answer is
  // Degraded (below), not progressing.
  const starting = wanted.map((o) => at.get(o)).filter((s) => s && s.answer === undefined && !(s.ready && s.error)).length;
  const surplus = live.filter((s) => s.ordinal === undefined || s.ordinal >= spec.replicas).length;
  const progressing =
    outdated.length > 0
      ? condition('Progressing', true, 'RollingUpdate', `${outdated.length} server(s) run another image or memory size; replacing one at a time`)
      : missing > 0 || surplus > 0 || going.size > 0
        ? condition('Progressing', true, 'Scaling', `${wanted.length - missing} of ${spec.replicas} servers exist; ${surplus} to remove, ${going.size} going`)
        : starting > 0
          ? condition('Progressing', true, 'Starting', `${starting} server(s) starting`)
          : condition('Progressing', false, 'Converged', `${spec.replicas} servers run ${config}`);

  const failing = live
    .filter((s) => s.ended || FAILING_REASONS.has(s.waitingReason))
    .map((s) => `${s.name}: ${s.ended ? s.phase : s.waitingReason}`);
  const silent = live.filter((s) => s.ready && s.answer === undefined && s.error).map((s) => `${s.name}: ${s.error}`);
  const degraded =
    failing.length > 0
      ? condition('Degraded', true, 'ServerFailing', failing.join('; '))
      : silent.length > 0
        ? condition('Degraded', true, 'ServerNotAnswering', `ready but not answering stats: ${silent.join('; ')}`)
        : condition('Degraded', false, 'Healthy', 'every server runs or is starting');
  if (degraded.status === 'True' && !alreadySet(conditions, degraded)) {
    actions.push(Action.event(Event.warning(degraded.reason, degraded.message)));
  }

  for (const c of [ready, progressing, degraded]) {
    conditions = setCondition(conditions, { ...c, observedGeneration: facts.generation }, facts.now);
  }
  const status = { replicas: spec.replicas, readyServers, servers, conditions };
  if (statsAt) status.statsAt = statsAt;
  if (facts.generation !== undefined) status.observedGeneration = facts.generation;
  actions.push(Action.setStatus(status));

  const settled = progressing.status === 'False' && degraded.status === 'False';
  return { actions, requeueAfterMs: settled ? REQUEUE_STEADY_MS : REQUEUE_BUSY_MS };
}

/**
 * The per-server figures for the status: the last ones written while the same servers (same
 * names, same pids) answer and they are younger than STATS_REFRESH_SECONDS; otherwise fresh.
 */
function reportedServers(previous, answering, now) {
  const fresh = answering.map((s) => ({ name: s.name, ...s.answer }));
  const last = previous.servers ?? [];
  const sameServers =
    last.length === fresh.length && last.every((p, i) => p.name === fresh[i].name && p.pid === fresh[i].pid);
  const lastAt = previous.statsAt ? Date.parse(previous.statsAt) / 1000 : NaN;
  if (sameServers && now.seconds - lastAt < STATS_REFRESH_SECONDS) {
    return { servers: last, statsAt: previous.statsAt };
  }
  return { servers: fresh, statsAt: fresh.length > 0 ? rfc3339(now) : undefined };
}
