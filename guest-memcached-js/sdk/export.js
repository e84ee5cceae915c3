// The edge between a plugin and the component: `exportPlugin(plugin, app)` gives the object
// the component exports as its `policy` interface, converting between the SDK's shapes and
// the WIT's, and turning every failure into a `policy-error` rather than a trap.
//
// A plugin is an object:
//
//   {
//     describe()                      -> policy info (./contract.js shapes)
//     reconcile(observation, app)     -> decision   (throw PolicyError to refuse)
//     finalize(observation, app)      -> finalize decision (optional: only with wantsFinalizer)
//   }
//
// where `observation` is an `Observation` (./observation.js) and `app` an App (./app.js).

import { PolicyError } from './contract.js';
import { Observation } from './observation.js';

/** A decision's action as the WIT wants it: objects to apply and statuses as JSON text. */
function witAction(action) {
  switch (action?.tag) {
    case 'apply':
    case 'set-status':
      return { tag: action.tag, val: typeof action.val === 'string' ? action.val : JSON.stringify(action.val) };
    case 'delete':
    case 'record-event':
      return action;
    default:
      throw new PolicyError('PluginFailed', `the plugin returned an action that is not one of apply, delete, set-status, record-event: ${JSON.stringify(action)}; this is a bug in the plugin`);
  }
}

/**
 * Milliseconds as the WIT's `option<u64>`: a BigInt under componentize-js (jco's convention
 * for 64-bit integers), a Number under componentize-qjs (which converts from f64). Which one
 * the bindings use shows in the observation they handed over: `now.seconds` is an `s64`.
 */
function witRequeue(ms, bigints) {
  if (ms === undefined || ms === null) return undefined;
  if (!Number.isFinite(ms) || ms < 0) {
    throw new PolicyError('PluginFailed', `requeueAfterMs ${ms} is not a number of milliseconds >= 0; this is a bug in the plugin`);
  }
  return bigints ? BigInt(Math.round(ms)) : Math.round(ms);
}

/**
 * Runs a decision so that nothing escapes as a trap: a `PolicyError` passes through (it has
 * the `payload` componentize-js returns as `err`), anything else thrown (a TypeError, a bad
 * JSON field) becomes a `PluginFailed` refusal naming what failed. The host then records a
 * Warning Event and retries with backoff, as for any refusal; an uncaught exception would
 * instead trap the instance with only the engine's stack on stderr.
 */
function guarded(name, decide) {
  try {
    return decide();
  } catch (error) {
    if (error instanceof PolicyError) throw error;
    const what = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    throw new PolicyError('PluginFailed', `plugin ${name} failed while deciding (${what}); this is a bug in the plugin, report it with the parent's spec`);
  }
}

/** The `policy` export for `plugin`, deciding with `app`. */
export function exportPlugin(plugin, app) {
  const name = () => {
    try {
      return plugin.describe().name;
    } catch {
      return 'plugin';
    }
  };
  return {
    describe() {
      return plugin.describe();
    },

    reconcile(rawObservation) {
      return guarded(name(), () => {
        const decision = plugin.reconcile(new Observation(rawObservation), app);
        return {
          actions: (decision.actions ?? []).map(witAction),
          requeueAfterMs: witRequeue(decision.requeueAfterMs, typeof rawObservation.now.seconds === 'bigint'),
        };
      });
    },

    finalize(rawObservation) {
      return guarded(name(), () => {
        if (!plugin.finalize) return { actions: [], done: true, requeueAfterMs: undefined };
        const decision = plugin.finalize(new Observation(rawObservation), app);
        return {
          actions: (decision.actions ?? []).map(witAction),
          done: Boolean(decision.done),
          requeueAfterMs: witRequeue(decision.requeueAfterMs, typeof rawObservation.now.seconds === 'bigint'),
        };
      });
    },
  };
}
