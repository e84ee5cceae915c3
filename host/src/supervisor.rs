//! The supervisor: keeps exactly one controller running per policy in the store — starts one
//! when a policy appears, restarts it when what it watches changes, stops it when the policy
//! is removed.
//!
//! A new version with the same target, children and concurrency keeps its controller: the
//! controller reads the current plugin at each reconcile, so a hot swap costs no watch restart.
//! Only a change of what must be *watched* (target or child kinds) or of the concurrency
//! restarts it. Stopping is graceful: in-flight reconciles finish first (on shutdown, every
//! controller's at once).

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use kube::Client;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::admin::Health;
use crate::controller::{self, ControllerOptions};
use crate::metrics::Metrics;
use crate::policy_store::{LoadedPolicy, PolicyStore};

/// How long a stopping controller may take to finish its in-flight reconciles.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// First and largest wait before restarting a controller that ended on its own; it doubles
/// with each death in a row, so a controller that dies at once does not spin.
const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// What a controller was started for; a change means a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WatchedShape {
    target: String,
    children: Vec<String>,
    concurrency: u16,
}

impl WatchedShape {
    fn of(policy: &LoadedPolicy, default_concurrency: u16) -> Self {
        let info = policy.plugin.info();
        Self {
            target: info.target.to_string(),
            children: info.children.iter().map(|k| k.to_string()).collect(),
            concurrency: policy.concurrency.unwrap_or(default_concurrency),
        }
    }
}

struct RunningController {
    shape: WatchedShape,
    /// The plugin last seen for the policy, to name it if it is unloaded.
    last: Arc<LoadedPolicy>,
    /// Tells an `ended` message of this run from one of an earlier run of the same policy.
    generation: u64,
    started: Instant,
    /// Deaths in a row before this run (restart backoff).
    deaths_in_a_row: u32,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The running controllers. Dropped without a graceful stop (the supervisor's task aborted,
/// as when a leader loses its Lease), it aborts them: a controller never outlives its
/// supervisor.
#[derive(Default)]
struct Controllers(HashMap<String, RunningController>);

impl Drop for Controllers {
    fn drop(&mut self) {
        for controller in self.0.values() {
            controller.task.abort();
        }
    }
}

impl std::ops::Deref for Controllers {
    type Target = HashMap<String, RunningController>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Controllers {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// A controller that ended on its own, waiting to be restarted.
struct DeadController {
    restart_at: Instant,
    deaths_in_a_row: u32,
}

/// A controller run that ended: its policy, its generation and how it ended.
type Ended = (String, u64, String);

/// Runs controllers following the store until `shutdown` resolves, then stops them all.
///
/// A controller that ends on its own (a panic in the host, a watch stream that ended) is
/// counted (`policy_host_controller_restarts_total`), reported to `health`, and restarted
/// after a backoff (review #20): before, it was noticed only at the next store change.
pub async fn supervise(
    client: Client,
    store: PolicyStore,
    metrics: Metrics,
    health: Health,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let mut changes = store.subscribe();
    let mut running = Controllers::default();
    let mut dead: HashMap<String, DeadController> = HashMap::new();
    // Finalizer releasers of unloaded policies, with the kind they reconciled.
    let mut orphans: HashMap<String, (String, JoinHandle<()>)> = HashMap::new();
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<Ended>();
    let mut generation: u64 = 0;
    tokio::pin!(shutdown);
    loop {
        let loaded: HashMap<String, Arc<LoadedPolicy>> = store
            .list()
            .into_iter()
            .map(|p| (p.name().to_string(), p))
            .collect();
        let wanted: HashMap<String, WatchedShape> = loaded
            .iter()
            .map(|(name, p)| (name.clone(), WatchedShape::of(p, options.concurrency)))
            .collect();
        dead.retain(|name, _| wanted.contains_key(name));
        let stale: Vec<String> = running
            .iter()
            .filter(|(name, c)| wanted.get(*name) != Some(&c.shape))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(controller) = running.remove(&name) {
                let last = controller.last.clone();
                stop(&name, controller, &metrics, &health).await;
                if !wanted.contains_key(&name) {
                    orphans.insert(
                        name.clone(),
                        (
                            last.plugin.info().target.to_string(),
                            tokio::spawn(crate::orphans::release(
                                client.clone(),
                                store.clone(),
                                name,
                                last.plugin.label().to_string(),
                                last.plugin.info().clone(),
                                options.clone(),
                            )),
                        ),
                    );
                }
            }
        }
        // A policy loaded again, or another one for the same kind, takes its finalizers over.
        orphans.retain(|name, (target, task)| {
            let taken_over =
                wanted.contains_key(name) || wanted.values().any(|shape| &shape.target == target);
            if taken_over {
                task.abort();
            }
            !taken_over
        });
        let now = Instant::now();
        for (name, shape) in wanted {
            if running.contains_key(&name) || dead.get(&name).is_some_and(|d| d.restart_at > now) {
                continue;
            }
            let deaths_in_a_row = match dead.remove(&name) {
                Some(died) => {
                    metrics.controller_restarted(&name);
                    tracing::info!(policy = %name, "restarting the controller that ended");
                    died.deaths_in_a_row
                }
                None => 0,
            };
            generation += 1;
            let Some(last) = loaded.get(&name).cloned() else {
                continue;
            };
            let controller = start(
                last,
                &client,
                &store,
                &metrics,
                &health,
                &options,
                &name,
                shape,
                generation,
                ended_tx.clone(),
            );
            metrics.controller_running(&name, true);
            running.insert(
                name,
                RunningController {
                    deaths_in_a_row,
                    ..controller
                },
            );
        }
        let next_restart = dead.values().map(|d| d.restart_at).min();
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { break },
            Some((name, ended_generation, how)) = ended_rx.recv() => {
                // A message of an earlier run (stopped on purpose) is no death.
                let this_run = running.get(&name).is_some_and(|c| c.generation == ended_generation);
                if let Some(ended) = this_run.then(|| running.remove(&name)).flatten() {
                    metrics.controller_running(&name, false);
                    health.controller_died(&name);
                    // A controller that ran for a while before dying starts its backoff over.
                    let deaths_in_a_row = if ended.started.elapsed() > RESTART_BACKOFF.1 {
                        1
                    } else {
                        ended.deaths_in_a_row + 1
                    };
                    let wait = RESTART_BACKOFF
                        .0
                        .saturating_mul(2u32.saturating_pow(deaths_in_a_row.saturating_sub(1).min(16)))
                        .min(RESTART_BACKOFF.1);
                    tracing::error!(policy = %name, %how, restart_in = ?wait, "controller ended on its own; restarting it");
                    dead.insert(name, DeadController { restart_at: Instant::now() + wait, deaths_in_a_row });
                }
            }
            () = sleep_until(next_restart) => {}
            () = &mut shutdown => break,
        }
    }
    // All at once: a leader renews its Lease until the last of them has stopped, so the
    // handover waits for the slowest, not for their sum.
    let (metrics, health) = (&metrics, &health);
    futures::future::join_all(running.drain().map(|(name, controller)| async move {
        stop(&name, controller, metrics, health).await;
    }))
    .await;
    for (_, (_, task)) in orphans.drain() {
        task.abort();
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Spawns the controller of `name`; when it ends, for whatever reason (a panic included),
/// `ended` hears of it.
#[allow(clippy::too_many_arguments)]
fn start(
    last: Arc<LoadedPolicy>,
    client: &Client,
    store: &PolicyStore,
    metrics: &Metrics,
    health: &Health,
    options: &ControllerOptions,
    name: &str,
    shape: WatchedShape,
    generation: u64,
    ended: mpsc::UnboundedSender<Ended>,
) -> RunningController {
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let options = ControllerOptions {
        concurrency: shape.concurrency,
        ..options.clone()
    };
    let (client, store, task_metrics) = (client.clone(), store.clone(), metrics.clone());
    let policy = name.to_string();
    let synced_health = health.clone();
    let task = tokio::spawn(async move {
        let stopped = async move {
            let _ = stop_rx.await;
        };
        let synced_policy = policy.clone();
        let on_synced = move || synced_health.controller_synced(&synced_policy);
        let run = controller::run(
            client,
            store,
            policy.clone(),
            task_metrics,
            options,
            on_synced,
            stopped,
        );
        let how = match AssertUnwindSafe(run).catch_unwind().await {
            Ok(Ok(())) => "its watch ended".to_string(),
            Ok(Err(error)) => error.to_string(),
            Err(panic) => format!(
                "it panicked: {}",
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default()
            ),
        };
        let _ = ended.send((policy, generation, how));
    });
    RunningController {
        shape,
        last,
        generation,
        started: Instant::now(),
        deaths_in_a_row: 0,
        stop: stop_tx,
        task,
    }
}

async fn stop(name: &str, controller: RunningController, metrics: &Metrics, health: &Health) {
    let _ = controller.stop.send(());
    let mut task = controller.task;
    if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
        tracing::warn!(policy = %name, grace = ?STOP_GRACE, "controller did not stop in time; aborting it");
        task.abort();
    }
    metrics.controller_running(name, false);
    metrics.plugin_policy_gone(name);
    health.controller_stopped(name);
}
