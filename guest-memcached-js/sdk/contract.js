// The contract's types in plain JavaScript: kind references, capabilities, actions, events,
// decisions and the one error a plugin may return, with small constructors.
//
// The shapes are those of `wit/policy.wit` as componentize-js lifts and lowers them (records
// are objects with camelCase fields, variants `{ tag, val }` with kebab-case tags, enums
// strings), except two conveniences that `exportPlugin` (./export.js) converts at the edge:
// `requeueAfterMs` is a Number here (a `u64`, a BigInt, in the component), and an object to
// apply is a JavaScript object here (JSON text in the component). So decision logic never
// sees a BigInt or builds JSON text, and tests compare plain objects.

/** A Kubernetes resource type: `{ group, version, kind, plural, namespaced }`. */
export function namespacedKind(group, version, kind, plural) {
  return { group, version, kind, plural, namespaced: true };
}

/** `group/version`, or `version` for the core group: a child's `apiVersion`. */
export function apiVersion(kind) {
  return kind.group ? `${kind.group}/${kind.version}` : kind.version;
}

/** True when `a` and `b` name the same kind (group and kind; versions may differ). */
export function sameKind(a, b) {
  return a.group === b.group && a.kind === b.kind;
}

/** What a plugin asks the admin to grant (`describe().capabilities`). */
export const Capability = {
  /** HTTP/JSON requests to this container port (name or number) of the parent's Pods. */
  appCall: (port) => ({ tag: 'app-call', val: port }),
  /** Raw TCP exchanges and sessions with this container port of the parent's Pods. */
  exchange: (port) => ({ tag: 'exchange', val: port }),
};

/** One thing the host should do, in order. */
export const Action = {
  /** Server-side apply this child (an object with apiVersion, kind and metadata.name). */
  apply: (object) => ({ tag: 'apply', val: object }),
  /** Delete the child `name` of `kind`, if the parent controls it. */
  delete: (kind, name) => ({ tag: 'delete', val: { kind, name } }),
  /** Replace the parent's `.status` with `status` (an object). */
  setStatus: (status) => ({ tag: 'set-status', val: status }),
  /** Record an Event on the parent. */
  event: (event) => ({ tag: 'record-event', val: event }),
};

/** Kubernetes Events on the parent. `reason` is short CamelCase; `message` is for a human. */
export const Event = {
  normal: (reason, message) => ({ eventType: 'normal', reason, message }),
  warning: (reason, message) => ({ eventType: 'warning', reason, message }),
};

/** A decision: `actions` carried out in order, and when to look again (ms, or undefined). */
export function decision(actions = [], requeueAfterMs = undefined) {
  return { actions, requeueAfterMs };
}

/** A finalize decision: cleanup `actions`; `done` lets the host remove its finalizer. */
export function finalizeDecision(actions = [], done = true, requeueAfterMs = undefined) {
  return { actions, done, requeueAfterMs };
}

/**
 * A refusal to decide: the host records it as a failed reconcile (a log line and a Warning
 * Event) and retries with backoff. Throw it from `reconcile`; the message says what is wrong
 * and what to do. `payload` is what componentize-js returns as the `err` of the export's
 * `result` (a thrown value with a `payload` property becomes `err(payload)`).
 */
export class PolicyError extends Error {
  constructor(reason, message) {
    super(`${reason}: ${message}`);
    this.name = 'PolicyError';
    this.reason = reason;
    this.payload = { reason, message };
  }
}

/** A short description of an action, for log lines and tests: `apply Pod/demo-0`. */
export function summary(action) {
  switch (action.tag) {
    case 'apply':
      return `apply ${action.val.kind}/${action.val.metadata?.name}`;
    case 'delete':
      return `delete ${action.val.kind.kind}/${action.val.name}`;
    case 'set-status':
      return 'set-status';
    case 'record-event':
      return `event ${action.val.eventType === 'warning' ? 'Warning' : 'Normal'}/${action.val.reason}`;
    default:
      return `unknown ${action.tag}`;
  }
}
