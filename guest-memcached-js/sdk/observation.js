// The observation as the plugin reads it: the parent and children parsed once, Pods as views
// with the few fields decisions need, and the observation's time (a plugin's only clock).

import { PolicyError, sameKind } from './contract.js';

/** Parses `text` as JSON, or refuses to decide with a message naming `what`. */
function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new PolicyError('InvalidObservation', `${what} is not JSON (${error.message}); this is a host bug, report it`);
  }
}

/**
 * An observation: `{ parent, children, now }` as the host hands it over (`parent` and each
 * child's `object` are JSON text, `now.seconds` a BigInt), read on demand.
 */
export class Observation {
  constructor(raw) {
    this.raw = raw;
    this.parentObject = undefined;
    this.parsedChildren = new Map();
  }

  /** The parent custom resource, parsed (metadata, spec, status). */
  parent() {
    this.parentObject ??= parseJson(this.raw.parent, 'the parent');
    return this.parentObject;
  }

  /** `metadata.name` of the parent. */
  parentName() {
    const name = this.parent().metadata?.name;
    if (typeof name !== 'string' || name === '') {
      throw new PolicyError('InvalidObservation', 'the parent has no metadata.name; this is a host bug, report it');
    }
    return name;
  }

  /** `metadata.generation` of the parent, if set. */
  parentGeneration() {
    return this.parent().metadata?.generation;
  }

  /** The observation's time as `{ seconds, nanoseconds }` (Numbers; seconds since the epoch, UTC). */
  get now() {
    return { seconds: Number(this.raw.now.seconds), nanoseconds: this.raw.now.nanoseconds };
  }

  /** The parsed children of `kind`, in the host's order. */
  childrenOfKind(kind) {
    const out = [];
    this.raw.children.forEach((child, index) => {
      if (!sameKind(child.kind, kind)) return;
      if (!this.parsedChildren.has(index)) {
        this.parsedChildren.set(index, parseJson(child.object, `child ${index} (${child.kind.kind})`));
      }
      out.push(this.parsedChildren.get(index));
    });
    return out;
  }

  /** The child `name` of `kind`, parsed, or undefined. */
  childNamed(kind, name) {
    return this.childrenOfKind(kind).find((o) => o.metadata?.name === name);
  }

  /** The Pod children, as `PodView`s. */
  pods(podKind) {
    return this.childrenOfKind(podKind).map((object) => new PodView(object));
  }
}

/** A Pod child: the fields decisions usually read, and the whole object as `object`. */
export class PodView {
  constructor(object) {
    this.object = object;
  }

  get name() {
    return this.object.metadata?.name ?? '';
  }

  /** `status.phase` (`Pending` when the kubelet has not reported yet). */
  get phase() {
    return this.object.status?.phase ?? 'Pending';
  }

  /** `status.podIP`, or undefined. */
  get ip() {
    return this.object.status?.podIP || undefined;
  }

  /** True while the Pod is being deleted. */
  get terminating() {
    return this.object.metadata?.deletionTimestamp != null;
  }

  /** True when the Pod's process ended for good (Failed or Succeeded). */
  get ended() {
    return this.phase === 'Failed' || this.phase === 'Succeeded';
  }

  /** The `Ready` condition is True. */
  get ready() {
    return (this.object.status?.conditions ?? []).some((c) => c.type === 'Ready' && c.status === 'True');
  }

  label(key) {
    return this.object.metadata?.labels?.[key];
  }

  annotation(key) {
    return this.object.metadata?.annotations?.[key];
  }

  /** The image of container `name`. */
  image(name) {
    return (this.object.spec?.containers ?? []).find((c) => c.name === name)?.image;
  }

  /** Restarts of container `name` so far. */
  restarts(name) {
    return (this.object.status?.containerStatuses ?? []).find((c) => c.name === name)?.restartCount ?? 0;
  }

  /** Why container `name` is waiting (`CrashLoopBackOff`, `ImagePullBackOff`), if it is. */
  waitingReason(name) {
    return (this.object.status?.containerStatuses ?? []).find((c) => c.name === name)?.state?.waiting?.reason;
  }
}
