// Status conditions in the Kubernetes convention (type, status, reason, message,
// lastTransitionTime, observedGeneration), and RFC 3339 time from the observation's clock.
// `lastTransitionTime` changes only when `status` does, or every reconcile would rewrite the
// status and wake every watcher: `setCondition` keeps it.

/** A condition with status `True` or `False`; `setCondition` fills in the transition time. */
export function condition(type, status, reason, message, observedGeneration = undefined) {
  const c = { type, status: status ? 'True' : 'False', reason, message, lastTransitionTime: '' };
  if (observedGeneration !== undefined) c.observedGeneration = observedGeneration;
  return c;
}

/**
 * `conditions` with `c` in place of the one of its type (a new array). Its transition time is
 * kept from the old one when the status did not change, and is `now` otherwise.
 */
export function setCondition(conditions, c, now) {
  const old = conditions.find((x) => x.type === c.type);
  const lastTransitionTime =
    old && old.status === c.status && old.lastTransitionTime ? old.lastTransitionTime : rfc3339(now);
  const updated = { ...c, lastTransitionTime };
  return old ? conditions.map((x) => (x.type === c.type ? updated : x)) : [...conditions, updated];
}

/**
 * Whether `conditions` already say exactly `c` (type, status, reason, message): record the
 * Event that goes with a condition only when this is false, once when it appears.
 */
export function alreadySet(conditions, c) {
  return conditions.some(
    (x) => x.type === c.type && x.status === c.status && x.reason === c.reason && x.message === c.message,
  );
}

/** `now` (`{ seconds }`) as RFC 3339 in UTC with second precision, e.g. `2024-05-01T12:00:00Z`. */
export function rfc3339(now) {
  return new Date(Number(now.seconds) * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
}
