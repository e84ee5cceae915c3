// The children a decision wants, as a set: an apply for each wanted child and a delete for
// each observed child of a managed kind outside it, so a plugin never writes delete lists by
// hand. Mirrors the Rust SDK's `Desired` (wit/sdk/src/desired.rs).

import { Action, apiVersion, sameKind } from './contract.js';

const identity = (object) => `${object.apiVersion}\u0000${object.kind}\u0000${object.metadata?.name}`;

export class Desired {
  /** An empty set that prunes children of the `managed` kinds. */
  constructor(managed) {
    this.managed = managed;
    this.wanted = [];
    this.kept = [];
  }

  /** Wants `object`; wanting the same kind and name twice keeps the last. */
  want(object) {
    const key = identity(object);
    this.wanted = this.wanted.filter((o) => identity(o) !== key);
    this.wanted.push(object);
    return this;
  }

  wantAll(objects) {
    for (const object of objects) this.want(object);
    return this;
  }

  /** Leaves the observed child `name` of `kind` alone: neither applied nor deleted. */
  keep(kind, name) {
    this.kept.push([kind, name]);
    return this;
  }

  wants(kind, name) {
    return this.wanted.some((o) => o.kind === kind.kind && o.apiVersion === apiVersion(kind) && o.metadata?.name === name);
  }

  /** Deletes of observed children of managed kinds neither wanted, kept nor already going. */
  deletes(observation) {
    const deletes = [];
    for (const kind of this.managed) {
      const names = observation
        .childrenOfKind(kind)
        .filter((o) => o.metadata?.deletionTimestamp == null)
        .map((o) => o.metadata?.name)
        .filter((name) => typeof name === 'string')
        .filter((name) => !this.wants(kind, name) && !this.kept.some(([k, n]) => sameKind(k, kind) && n === name))
        .sort();
      deletes.push(...names.map((name) => Action.delete(kind, name)));
    }
    return deletes;
  }

  applies() {
    return this.wanted.map((object) => Action.apply(object));
  }

  /** Applies, then deletes: a replacement exists before what it replaces goes. */
  actions(observation) {
    return [...this.applies(), ...this.deletes(observation)];
  }
}
