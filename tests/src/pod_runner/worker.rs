//! The life of one Pod on the runner: volumes, init containers in order, containers with their
//! restart policy and probes, status reporting, and graceful termination on deletion.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use super::Runner;
use super::hosts::PodNames;
use super::probe::{self, ProbeTarget, Timing};
use super::spec::{self, BindMount, Image, NotStartable};
use super::volumes;
use crate::process::signal_group;

/// What a test hook or the watcher asks of a Pod's worker.
#[derive(Debug)]
pub(crate) enum PodCommand {
    /// SIGKILL the containers: a crash; the restart policy applies.
    Kill(oneshot::Sender<()>),
    /// SIGKILL the containers and mark the Pod Failed, with no restart.
    Fail(oneshot::Sender<()>),
    /// The Pod object is gone from the API: stop everything now.
    Gone,
}

/// Whether containers should keep running.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    Run,
    /// SIGTERM, then SIGKILL after the grace period.
    Grace(Duration),
    /// SIGKILL.
    Now,
}

/// One container as reported in the Pod status.
#[derive(Debug, Clone)]
struct ContainerRecord {
    name: String,
    image: String,
    state: Value,
    last_state: Value,
    ready: bool,
    started: bool,
    restart_count: i32,
    container_id: Option<String>,
    /// Will not run again (terminated for good, or stopped).
    finished: bool,
    /// Its last exit code, once it has exited.
    exit_code: Option<i32>,
}

impl ContainerRecord {
    fn new(container: &Container) -> ContainerRecord {
        ContainerRecord {
            name: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
            state: json!({"waiting": {"reason": "ContainerCreating"}}),
            last_state: json!({}),
            ready: false,
            started: false,
            restart_count: 0,
            container_id: None,
            finished: false,
            exit_code: None,
        }
    }

    fn status(&self) -> Value {
        json!({
            "name": self.name,
            "image": self.image,
            "imageID": self.image,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
            "containerID": self.container_id,
        })
    }
}

/// Everything the status of a Pod is computed from.
#[derive(Debug, Clone)]
struct PodState {
    init: Vec<ContainerRecord>,
    main: Vec<ContainerRecord>,
    initialized: bool,
    /// Failed by the `fail_pod` hook or an init container that may not restart.
    failed: Option<String>,
    start_time: String,
}

impl PodState {
    fn phase(&self) -> &'static str {
        if self.failed.is_some() {
            return "Failed";
        }
        if !self.initialized {
            return "Pending";
        }
        if !self.main.is_empty() && self.main.iter().all(|c| c.finished) {
            return if self.main.iter().all(|c| c.exit_code == Some(0)) {
                "Succeeded"
            } else {
                "Failed"
            };
        }
        if self.main.iter().any(|c| c.started || c.restart_count > 0) {
            "Running"
        } else {
            "Pending"
        }
    }
}

enum Kind {
    Init,
    Main,
}

/// What the containers of one Pod share.
struct PodContext {
    runner: Arc<Runner>,
    pod: Pod,
    ip: Ipv4Addr,
    dir: PathBuf,
    state: watch::Sender<PodState>,
    stop: watch::Receiver<Stop>,
    kill: watch::Receiver<u64>,
    /// Images of the main containers in the latest spec: the one field of a running Pod's
    /// containers that can change, and a change restarts that container, as kubelet does.
    images: watch::Receiver<Vec<String>>,
}

/// Images of a Pod's main containers, in order.
fn main_images(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| c.image.clone().unwrap_or_default())
        .collect()
}

/// Resolves once the image of main container `index` differs from `running`.
async fn image_changed(images: &mut watch::Receiver<Vec<String>>, index: usize, running: &str) {
    loop {
        if images.changed().await.is_err() {
            // The Pod's worker is ending; stopping is signalled separately.
            std::future::pending::<()>().await;
        }
        if images
            .borrow_and_update()
            .get(index)
            .is_some_and(|i| i != running)
        {
            return;
        }
    }
}

pub(crate) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Runs `pod` until it is deleted (or gone), then removes what it left.
pub(crate) async fn run_pod(
    runner: Arc<Runner>,
    pod: Pod,
    ip: Ipv4Addr,
    mut latest: watch::Receiver<Pod>,
    mut commands: mpsc::UnboundedReceiver<PodCommand>,
) {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let dir = runner
        .dir
        .join("pods")
        .join(&namespace)
        .join(format!("{name}-{}", uid.get(..8).unwrap_or(&uid)));

    let initial = PodState {
        init: spec
            .init_containers
            .iter()
            .flatten()
            .map(ContainerRecord::new)
            .collect(),
        main: spec.containers.iter().map(ContainerRecord::new).collect(),
        initialized: spec.init_containers.as_ref().is_none_or(Vec::is_empty),
        failed: None,
        start_time: now(),
    };
    let (state_tx, state_rx) = watch::channel(initial);
    let (stop_tx, stop_rx) = watch::channel(Stop::Run);
    let (kill_tx, kill_rx) = watch::channel(0u64);
    let (images_tx, images_rx) = watch::channel(main_images(&pod));
    let writer = tokio::spawn(write_status(
        runner.clone(),
        namespace.clone(),
        name.clone(),
        ip,
        state_rx,
    ));

    let names = PodNames {
        namespace: namespace.clone(),
        name: name.clone(),
        hostname: spec.hostname.clone().unwrap_or_else(|| name.clone()),
        subdomain: spec.subdomain.clone(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        ip,
    };
    if let Err(e) = runner.hosts.lock().await.set_pod(&uid, names) {
        tracing::warn!("could not update the hosts file for {namespace}/{name}: {e}");
    }

    let context = Arc::new(PodContext {
        runner: runner.clone(),
        pod: pod.clone(),
        ip,
        dir: dir.clone(),
        state: state_tx,
        stop: stop_rx,
        kill: kill_rx,
        images: images_rx,
    });
    let lifecycle = run_containers(context.clone());
    tokio::pin!(lifecycle);
    let mut lifecycle_done = false;
    // Some(true): delete the Pod object once stopped; Some(false): it is already gone.
    let mut deleting: Option<bool> = None;
    let grace_of = |pod: &Pod| {
        let seconds = pod
            .metadata
            .deletion_grace_period_seconds
            .or(pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(30);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    };
    if pod.metadata.deletion_timestamp.is_some() {
        let _ = stop_tx.send(Stop::Grace(grace_of(&pod)));
        deleting = Some(true);
    }
    loop {
        if lifecycle_done && deleting.is_some() {
            break;
        }
        tokio::select! {
            () = &mut lifecycle, if !lifecycle_done => lifecycle_done = true,
            command = commands.recv() => match command {
                Some(PodCommand::Kill(reply)) => {
                    kill_tx.send_modify(|n| *n += 1);
                    let _ = reply.send(());
                }
                Some(PodCommand::Fail(reply)) => {
                    context.state.send_modify(|s| s.failed = Some("failed by the test hook fail_pod".into()));
                    let _ = stop_tx.send(Stop::Now);
                    let _ = reply.send(());
                }
                Some(PodCommand::Gone) | None => {
                    let _ = stop_tx.send(Stop::Now);
                    deleting = Some(false);
                }
            },
            changed = latest.changed(), if deleting.is_none() => {
                if changed.is_err() {
                    let _ = stop_tx.send(Stop::Now);
                    deleting = Some(false);
                    continue;
                }
                let current = latest.borrow_and_update().clone();
                let images = main_images(&current);
                images_tx.send_if_modified(|running| {
                    let changed = *running != images;
                    *running = images;
                    changed
                });
                if current.metadata.deletion_timestamp.is_some() {
                    let _ = stop_tx.send(Stop::Grace(grace_of(&current)));
                    deleting = Some(true);
                }
            }
        }
    }
    // The final terminated states are worth reporting before the object goes.
    tokio::time::sleep(Duration::from_millis(50)).await;
    writer.abort();
    if deleting == Some(true) {
        let pods: Api<Pod> = Api::namespaced(runner.client.clone(), &namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = pods.delete(&name, &params).await {
            tracing::debug!("finalizing pod {namespace}/{name}: {e}");
        }
    }
    if let Err(e) = runner.hosts.lock().await.remove_pod(&uid) {
        tracing::warn!("could not update the hosts file: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    runner.pods.lock().await.remove(&uid);
}

/// Volumes, then init containers one by one, then all containers together.
async fn run_containers(context: Arc<PodContext>) {
    let spec = context.pod.spec.clone().unwrap_or_default();
    let mut stop = context.stop.clone();
    let volumes = loop {
        match volumes::prepare(
            &context.runner.client,
            &context.pod,
            &context.dir,
            &context.runner.dir,
            context.ip,
        )
        .await
        {
            Ok(volumes) => break volumes,
            Err(problem) => {
                context.state.send_modify(|s| {
                    for record in s.init.iter_mut().chain(s.main.iter_mut()) {
                        record.state = waiting(&problem);
                    }
                });
                if wait_or_stop(&mut stop, Duration::from_secs(1)).await {
                    return;
                }
            }
        }
    };
    for (index, container) in spec.init_containers.iter().flatten().enumerate() {
        let succeeded = run_container(&context, &volumes, container, Kind::Init, index).await;
        if !succeeded {
            if *context.stop.borrow() == Stop::Run {
                context.state.send_modify(|s| {
                    s.failed = Some(format!("init container {} failed", container.name));
                });
            }
            return;
        }
    }
    context.state.send_modify(|s| s.initialized = true);
    let containers = spec
        .containers
        .iter()
        .enumerate()
        .map(|(index, container)| run_container(&context, &volumes, container, Kind::Main, index));
    futures::future::join_all(containers).await;
}

fn waiting(problem: &NotStartable) -> Value {
    json!({"waiting": {"reason": problem.reason, "message": problem.message}})
}

/// Sleeps for `duration` unless asked to stop first; `true` when stopping.
async fn wait_or_stop(stop: &mut watch::Receiver<Stop>, duration: Duration) -> bool {
    if *stop.borrow() != Stop::Run {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(duration) => *stop.borrow() != Stop::Run,
        stopping = stopped(stop) => { let _ = stopping; true }
    }
}

/// Waits until stopping is asked for, and says how.
async fn stopped(stop: &mut watch::Receiver<Stop>) -> Stop {
    loop {
        let current = *stop.borrow_and_update();
        if current != Stop::Run {
            return current;
        }
        if stop.changed().await.is_err() {
            return Stop::Now;
        }
    }
}

/// Runs one container with its restart policy until it finishes for good or the Pod stops.
/// `true` when it finished with exit code 0.
async fn run_container(
    context: &PodContext,
    volumes: &BTreeMap<String, PathBuf>,
    container: &Container,
    kind: Kind,
    index: usize,
) -> bool {
    let update = |f: &dyn Fn(&mut ContainerRecord)| {
        context.state.send_modify(|s| {
            let list = match kind {
                Kind::Init => &mut s.init,
                Kind::Main => &mut s.main,
            };
            if let Some(record) = list.get_mut(index) {
                f(record);
            }
        });
    };
    let mut stop = context.stop.clone();
    let mut kill = context.kill.clone();
    let runner = &context.runner;
    let pod = &context.pod;
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let restart_policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into());
    let log = runner.log_path(&namespace, &pod_name, &container.name);
    let mut images = context.images.clone();
    let mut backoff = Duration::from_millis(500);
    loop {
        if *stop.borrow() != Stop::Run {
            update(&|r| r.finished = true);
            return false;
        }
        let wanted = match kind {
            Kind::Main => images.borrow_and_update().get(index).cloned(),
            Kind::Init => None,
        }
        .or_else(|| container.image.clone())
        .unwrap_or_default();
        let image = spec::resolve_image(&wanted, &runner.loaded_images());
        update(&|r| r.image = wanted.clone());
        let prepared = prepare_process(context, volumes, container, &image).await;
        let (mut command, env) = match prepared {
            Ok(prepared) => prepared,
            Err(problem) => {
                update(&|r| r.state = waiting(&problem));
                if wait_or_stop(&mut stop, backoff).await {
                    update(&|r| r.finished = true);
                    return false;
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        let spawned = crate::process::log_stdio(&log)
            .map_err(|e| e.to_string())
            .and_then(|(out, err)| {
                command
                    .stdout(out)
                    .stderr(err)
                    .spawn()
                    .map_err(|e| e.to_string())
            });
        let mut child = match spawned {
            Ok(child) => child,
            Err(message) => {
                let problem = NotStartable {
                    reason: "RunContainerError",
                    message,
                };
                update(&|r| r.state = waiting(&problem));
                if wait_or_stop(&mut stop, backoff).await {
                    update(&|r| r.finished = true);
                    return false;
                }
                continue;
            }
        };
        let pid = child.id().unwrap_or_default();
        runner.track_group(pid, true);
        let started_at = now();
        let has_readiness = matches!(kind, Kind::Main) && container.readiness_probe.is_some();
        update(&|r| {
            r.state = json!({"running": {"startedAt": started_at}});
            r.container_id = Some(format!("testenv://{pid}"));
            r.started = true;
            r.ready = matches!(kind, Kind::Main) && !has_readiness;
        });
        let (liveness_tx, mut liveness_rx) = mpsc::channel::<()>(1);
        let probes = match kind {
            Kind::Main => Some(tokio::spawn(run_probes(
                ProbeTarget {
                    ip: context.ip,
                    pid,
                    container: container.clone(),
                    image: image.clone(),
                    env,
                    http: runner.http.clone(),
                },
                context.state.clone(),
                index,
                liveness_tx,
            ))),
            Kind::Init => None,
        };
        let ran_since = Instant::now();
        kill.borrow_and_update();
        let mut replaced = false;
        let status = tokio::select! {
            status = child.wait() => status.ok(),
            how = stopped(&mut stop) => {
                terminate(&mut child, pid, how).await
            }
            _ = kill.changed() => terminate(&mut child, pid, Stop::Now).await,
            Some(()) = liveness_rx.recv() => terminate(&mut child, pid, Stop::Grace(Duration::from_secs(2))).await,
            () = image_changed(&mut images, index, &wanted), if matches!(kind, Kind::Main) => {
                replaced = true;
                terminate(&mut child, pid, Stop::Grace(Duration::from_secs(10))).await
            }
        };
        if let Some(probes) = probes {
            probes.abort();
        }
        // The container is its process group: what its main process started goes with it.
        signal_group(pid, Signal::SIGKILL);
        runner.track_group(pid, false);
        let exit_code = status.map_or(137, |s| {
            s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
        });
        let terminated = json!({"terminated": {
            "exitCode": exit_code,
            "reason": if exit_code == 0 { "Completed" } else { "Error" },
            "startedAt": started_at,
            "finishedAt": now(),
            "containerID": format!("testenv://{pid}"),
        }});
        update(&|r| {
            r.state = terminated.clone();
            r.ready = false;
            r.exit_code = Some(exit_code);
        });
        if *stop.borrow() != Stop::Run {
            update(&|r| r.finished = true);
            return false;
        }
        if replaced {
            // A new image: restarted at once whatever the restart policy, as kubelet does.
            update(&|r| {
                r.last_state = terminated.clone();
                r.restart_count += 1;
                r.state = json!({"waiting": {"reason": "ContainerCreating"}});
            });
            continue;
        }
        let restart = match (&kind, restart_policy.as_str()) {
            (Kind::Init, "Never") => false,
            (Kind::Init, _) => exit_code != 0,
            (Kind::Main, "Always") => true,
            (Kind::Main, "OnFailure") => exit_code != 0,
            (Kind::Main, _) => false,
        };
        if !restart {
            update(&|r| r.finished = true);
            return exit_code == 0;
        }
        if ran_since.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(500);
        }
        update(&|r| {
            r.last_state = terminated.clone();
            r.restart_count += 1;
            r.state = json!({"waiting": {
                "reason": "CrashLoopBackOff",
                "message": format!("back-off {} ms restarting failed container", backoff.as_millis()),
            }});
        });
        if wait_or_stop(&mut stop, backoff).await {
            update(&|r| r.finished = true);
            return false;
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// Stops a container's process group: SIGTERM and up to the grace period, or SIGKILL at once.
async fn terminate(
    child: &mut tokio::process::Child,
    pid: u32,
    how: Stop,
) -> Option<std::process::ExitStatus> {
    if let Stop::Grace(grace) = how {
        signal_group(pid, Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
            return status.ok();
        }
    }
    signal_group(pid, Signal::SIGKILL);
    child.wait().await.ok()
}

/// The command line of a container and its environment.
async fn prepare_process(
    context: &PodContext,
    volumes: &BTreeMap<String, PathBuf>,
    container: &Container,
    image: &Image,
) -> Result<(tokio::process::Command, BTreeMap<String, String>), NotStartable> {
    let runner = &context.runner;
    let pod = &context.pod;
    let mut env = spec::environment(&runner.client, pod, container, context.ip).await?;
    let argv = spec::argv(container, image, &env, context.ip)?;
    for (name, value) in spec::image_defaults(image) {
        env.entry(name)
            .or_insert_with(|| spec::pod_local(&value, context.ip));
    }
    let mut mounts = Vec::new();
    // The service-account volume has no token in it here (no kubelet to mint one): mounting it
    // would only create /var/run/secrets/... on the machine, so it is skipped.
    let token_volumes: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| {
            v.projected.as_ref().is_some_and(|p| {
                p.sources
                    .iter()
                    .flatten()
                    .any(|s| s.service_account_token.is_some())
            })
        })
        .map(|v| v.name.as_str())
        .collect();
    for mount in container.volume_mounts.iter().flatten() {
        if token_volumes.contains(&mount.name.as_str())
            && !std::path::Path::new(&mount.mount_path).exists()
        {
            continue;
        }
        let Some(source) = volumes.get(&mount.name) else {
            return Err(NotStartable {
                reason: "CreateContainerConfigError",
                message: format!(
                    "volume {} of mount {} is not defined",
                    mount.name, mount.mount_path
                ),
            });
        };
        let source = match mount.sub_path.as_deref().filter(|p| !p.is_empty()) {
            Some(sub) => {
                let path = source.join(sub);
                if !path.exists() {
                    let _ = std::fs::create_dir_all(&path);
                }
                path
            }
            None => source.clone(),
        };
        mounts.push(BindMount {
            source,
            target: mount.mount_path.clone(),
        });
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let hostname = spec
        .hostname
        .clone()
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    let working_dir = match &container.working_dir {
        Some(dir) => PathBuf::from(dir),
        None => context.dir.clone(),
    };
    std::fs::create_dir_all(&context.dir).map_err(|e| NotStartable {
        reason: "RunContainerError",
        message: format!("creating {}: {e}", context.dir.display()),
    })?;
    let hosts_path = runner.hosts_path.clone();
    let script = spec::wrapper_script(&hosts_path, &hostname, &mounts, &working_dir);
    let mut command = tokio::process::Command::new("setpriv");
    command
        .args(["--pdeathsig", "KILL", "--"])
        .args([
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "--",
        ])
        .args(["sh", "-c", &script, "sh"])
        .args(&argv)
        .env_clear()
        .envs(&env)
        .env("PATH", spec::path_var(image))
        .env("HOSTNAME", &hostname)
        .env("HOME", "/root")
        .current_dir(&context.dir)
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    Ok((command, env))
}

/// Runs the readiness and liveness probes of a running container.
async fn run_probes(
    target: ProbeTarget,
    state: watch::Sender<PodState>,
    index: usize,
    liveness: mpsc::Sender<()>,
) {
    let readiness = target.container.readiness_probe.clone();
    let live = target.container.liveness_probe.clone();
    let ready_task = readiness.map(|probe| {
        let target = target.clone();
        tokio::spawn(async move {
            let timing = Timing::of(&probe);
            tokio::time::sleep(timing.initial_delay).await;
            let (mut successes, mut failures) = (0u32, 0u32);
            let mut ready = false;
            loop {
                if probe::check(&probe, &target, timing.timeout).await {
                    successes += 1;
                    failures = 0;
                } else {
                    failures += 1;
                    successes = 0;
                }
                let now_ready = if successes >= timing.success_threshold {
                    true
                } else if failures >= timing.failure_threshold {
                    false
                } else {
                    ready
                };
                if now_ready != ready {
                    ready = now_ready;
                    state.send_modify(|s| {
                        if let Some(record) = s.main.get_mut(index) {
                            record.ready = ready;
                        }
                    });
                }
                // Not ready yet: probe more often than the period, so readiness comes quickly.
                let wait = if ready {
                    timing.period
                } else {
                    timing.period.min(Duration::from_secs(1))
                };
                tokio::time::sleep(wait).await;
            }
        })
    });
    if let Some(probe) = live {
        let timing = Timing::of(&probe);
        tokio::time::sleep(timing.initial_delay).await;
        let mut failures = 0u32;
        loop {
            if probe::check(&probe, &target, timing.timeout).await {
                failures = 0;
            } else {
                failures += 1;
                if failures >= timing.failure_threshold {
                    let _ = liveness.send(()).await;
                    break;
                }
            }
            tokio::time::sleep(timing.period).await;
        }
    }
    if let Some(task) = ready_task {
        // Keep the readiness task alive as long as this one is (aborting this one aborts it).
        let guard = AbortOnDrop(task);
        std::future::pending::<()>().await;
        drop(guard);
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reports the Pod's status each time it changes.
async fn write_status(
    runner: Arc<Runner>,
    namespace: String,
    name: String,
    ip: Ipv4Addr,
    mut state: watch::Receiver<PodState>,
) {
    let pods: Api<Pod> = Api::namespaced(runner.client.clone(), &namespace);
    let mut transitions: BTreeMap<&'static str, (bool, String)> = BTreeMap::new();
    loop {
        let snapshot = state.borrow_and_update().clone();
        let containers_ready = snapshot.main.iter().all(|c| c.ready);
        let phase = snapshot.phase();
        let mut conditions = Vec::new();
        for (kind, value) in [
            ("PodScheduled", true),
            ("Initialized", snapshot.initialized),
            ("ContainersReady", containers_ready),
            ("Ready", containers_ready && snapshot.failed.is_none()),
        ] {
            let entry = transitions.entry(kind).or_insert_with(|| (value, now()));
            if entry.0 != value {
                *entry = (value, now());
            }
            conditions.push(json!({
                "type": kind,
                "status": if value { "True" } else { "False" },
                "lastTransitionTime": entry.1,
            }));
        }
        let status = json!({"status": {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip.to_string(),
            "podIPs": [{"ip": ip.to_string()}],
            "startTime": snapshot.start_time,
            "conditions": conditions,
            "initContainerStatuses": snapshot.init.iter().map(ContainerRecord::status).collect::<Vec<_>>(),
            "containerStatuses": snapshot.main.iter().map(ContainerRecord::status).collect::<Vec<_>>(),
            "message": snapshot.failed,
            "reason": snapshot.failed.as_ref().map(|_| "Failed"),
        }});
        if let Err(e) = pods
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            tracing::debug!("reporting status of pod {namespace}/{name}: {e}");
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}
