//! The supervisor: keeps exactly one controller running per policy in the store — starts one
//! when a policy appears, restarts it when what it watches changes, stops it when the policy
//! is removed.
//!
//! A new version with the same target, children and concurrency keeps its controller: the
//! controller reads the current plugin at each reconcile, so a hot swap costs no watch restart.
//! Only a change of what must be *watched* (target or child kinds) or of the concurrency
//! restarts it. Stopping is graceful: in-flight reconciles finish first.

use std::collections::HashMap;
use std::time::Duration;

use kube::Client;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::controller::{self, ControllerOptions};
use crate::metrics::Metrics;
use crate::policy_store::{LoadedPolicy, PolicyStore};

/// How long a stopping controller may take to finish its in-flight reconciles.
const STOP_GRACE: Duration = Duration::from_secs(30);

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

/// Runs controllers following the store until `shutdown` resolves, then stops them all.
pub async fn supervise(
    client: Client,
    store: PolicyStore,
    metrics: Metrics,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let mut changes = store.subscribe();
    let mut running = Controllers::default();
    tokio::pin!(shutdown);
    loop {
        let wanted: HashMap<String, WatchedShape> = store
            .list()
            .iter()
            .map(|p| {
                (
                    p.name().to_string(),
                    WatchedShape::of(p, options.concurrency),
                )
            })
            .collect();
        let stale: Vec<String> = running
            .iter()
            .filter(|(name, c)| wanted.get(*name) != Some(&c.shape) || c.task.is_finished())
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(controller) = running.remove(&name) {
                stop(&name, controller, &metrics).await;
            }
        }
        for (name, shape) in wanted {
            if running.contains_key(&name) {
                continue;
            }
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let options = ControllerOptions {
                concurrency: shape.concurrency,
                ..options.clone()
            };
            let (client, store, task_metrics) = (client.clone(), store.clone(), metrics.clone());
            let policy = name.clone();
            let task = tokio::spawn(async move {
                let stopped = async move {
                    let _ = stop_rx.await;
                };
                if let Err(error) = controller::run(
                    client,
                    store,
                    policy.clone(),
                    task_metrics,
                    options,
                    stopped,
                )
                .await
                {
                    tracing::error!(policy = %policy, %error, "controller ended");
                }
            });
            metrics.controller_running(&name, true);
            running.insert(
                name,
                RunningController {
                    shape,
                    stop: stop_tx,
                    task,
                },
            );
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { break },
            () = &mut shutdown => break,
        }
    }
    for (name, controller) in running.drain() {
        stop(&name, controller, &metrics).await;
    }
}

async fn stop(name: &str, controller: RunningController, metrics: &Metrics) {
    let _ = controller.stop.send(());
    let mut task = controller.task;
    if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
        tracing::warn!(policy = %name, grace = ?STOP_GRACE, "controller did not stop in time; aborting it");
        task.abort();
    }
    metrics.controller_running(name, false);
}
