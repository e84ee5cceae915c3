// Write policy-host plugins in JavaScript: the table of contents of the SDK. A plugin is an
// object with `describe`, `reconcile(observation, app)` and optionally `finalize`; the
// component's entry module exports `exportPlugin(plugin, hostApp)` as `policy` (see
// ../README.md). Modules, from the contract outwards:
//
// - contract.js    — kind refs, capabilities, actions, events, decisions, PolicyError
// - observation.js — the parent and children parsed, Pods as views, the observation's time
// - children.js    — built-in kinds, child skeletons, Pod/Container/Service/PDB builders
// - desired.js     — the children wanted now, as applies plus deletes of the owned rest
// - conditions.js  — status conditions that keep lastTransitionTime
// - names.js       — whether the child names derived from the parent's name are valid
// - app.js         — the App (sessions, exchanges, app-calls, credentials) and its errors
// - log.js         — lines in the host's log
// - utf8.js        — text to bytes and back (QuickJS has no TextEncoder)
// - export.js      — the component's `policy` export for a plugin
// - testing.js     — native fakes: observation builder, ScriptedApp, decision readers
// - host.js        — the App over the WIT imports (component only; not re-exported here)

export * from './contract.js';
export * from './observation.js';
export * as children from './children.js';
export { Desired } from './desired.js';
export * from './conditions.js';
export * from './names.js';
export * from './app.js';
export * as log from './log.js';
export { decodeUtf8, encodeUtf8 } from './utf8.js';
export { exportPlugin } from './export.js';
