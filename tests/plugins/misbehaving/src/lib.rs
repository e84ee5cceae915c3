//! A test plugin that behaves well or badly on request, to prove the host contains each kind
//! of misbehaviour within its limits. The parent's `spec.behaviour` picks what it does:
//!
//! - `ok` (default): applies a ConfigMap `<parent>-out` and sets `status.observedChildren`
//!   (and `status.firstObservedChildren`, kept from the first observation after status is cleared)
//!   and `status.observedGeneration`, so every change of spec is decided with a write even
//!   when the host skips the unchanged apply of `<parent>-out` (its `now` has a one-second grain);
//! - `loop`: spins forever (deadline);
//! - `memory`: allocates until it is stopped (memory cap);
//! - `output`: returns a decision of `spec.outputBytes` bytes (output cap);
//! - `trap`: panics (a trap);
//! - `refuse`: returns a policy error;
//! - `adopt`: applies a Secret, a kind it did not declare (the host must refuse);
//! - `call-stranger`: app-calls a pod it does not own and reports the outcome in status;
//! - `call-own`: the same with its own pod `own-0` (granted port `http`), `spec.calls` times in
//!   a row (default 1; a reconcile that blocks on a slow app longer than one call may take);
//! - `log-split`: logs one line of `"a"` then `spec.count` two-byte characters (and the same
//!   as a field), so a cut at any even byte offset falls inside a character;
//! - `privileged-pod`: applies a Pod `<parent>-priv` with a privileged container (above the
//!   baseline pod security a grant allows by default);
//! - `log-flood`: logs `spec.count` short lines (default 100,000) in one decision;
//! - `refuse-huge`: refuses with a reason of `spec.count` bytes (default 100,000) and a
//!   message ten times that;
//! - `steady`: a parent at steady state: re-applies `spec.applies` unchanged ConfigMaps
//!   `<parent>-steady-<n>` (default none; guest-etcd's steady decision re-applies three
//!   objects), writes no status and requeues after `spec.requeueMs` (default 30,000, guest-etcd's
//!   steady requeue): the background of the reconcile latency bench. `spec.sleepMs` makes the
//!   decision take that long without using a CPU (a slow decision: overload with few cores), and
//!   `spec.recordEvent: true` records an Event `Decided` per decision, whose note names
//!   `spec.change` and the observation's time (a test counts decisions per parent).
//! - `credential`: reads the credential `spec.key` (default `token`) of the Secret
//!   `spec.secret` (default `<parent>-auth`) and writes `status.credential` (`read <n> bytes`,
//!   or the error); with `spec.leak` = `status`, `event` or `log` it also puts the value
//!   there (the host must refuse the first two and cut it out of the third).
//!
//! - `metrics`: reports its domain metrics (contract 0.2.3): the gauge `lag_seconds` (label
//!   `replica`) at `spec.lag` (default 1.5) for each name of `spec.replicas`, and 1 more
//!   `decisions`; with `spec.undeclared: true` also a gauge `undeclared_metric` and a
//!   `lag_seconds` with an undeclared label `zone` (the host must refuse both). Each import's
//!   answer goes into `status.metrics` (`ok` or `refused: <why>`).
//!
//! It declares those two metrics in `describe`, whatever the behaviour.
//!
//! `spec.finalize: trap` makes `finalize` panic (a parent that can never be finalized), and
//! `spec.trapIn: <version>` makes `reconcile` panic in that version only, whatever the
//! behaviour (a bad build: a staged rollout test gives every parent `trapIn` and sees which
//! parents ever ran that version).
//!
//! Its version is `MISBEHAVING_POLICY_VERSION` at build time (default: the crate version), and
//! `ok` writes it into `status.pluginVersion`, so a hot-swap test can tell which build decided
//! (see `policy_host_test_plugins::build_version`).

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

// The generated export glue is `unsafe` (raw canonical-ABI pointers); wit-bindgen owns its
// soundness, and nothing else in this crate uses unsafe.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod plugin {
    use serde_json::{Value, json};

    wit_bindgen::generate!({ path: "../../../wit", world: "policy-plugin" });

    use exports::policy_host::policy::policy::Guest;
    use policy_host::policy::types::{
        Action, Capability, Decision, Event, EventType, FinalizeDecision, KindRef, Observation,
        PolicyError, PolicyInfo,
    };
    use policy_host::policy::{app_call, credentials, log, metrics};

    struct Misbehaving;

    /// The version this build reports (and writes into status), set by the build.
    const VERSION: &str = match option_env!("MISBEHAVING_POLICY_VERSION") {
        Some(version) => version,
        None => env!("CARGO_PKG_VERSION"),
    };

    fn target() -> KindRef {
        KindRef {
            group: "test.policy-host.io".into(),
            version: "v1".into(),
            kind: "Probe".into(),
            plural: "probes".into(),
            namespaced: true,
        }
    }

    fn config_maps() -> KindRef {
        KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        }
    }

    fn pods() -> KindRef {
        KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
            namespaced: true,
        }
    }

    fn refuse(reason: &str, message: String) -> PolicyError {
        PolicyError {
            reason: reason.into(),
            message,
        }
    }

    impl Guest for Misbehaving {
        fn describe() -> PolicyInfo {
            for (name, kind, labels) in [
                (
                    "lag_seconds",
                    metrics::MetricKind::Gauge,
                    vec!["replica".to_string()],
                ),
                ("decisions", metrics::MetricKind::Counter, Vec::new()),
            ] {
                let _ = metrics::declare(&metrics::Metric {
                    name: name.into(),
                    kind,
                    help: format!("{name} of the probe"),
                    labels,
                });
            }
            PolicyInfo {
                name: "misbehaving".into(),
                version: VERSION.into(),
                target: target(),
                children: vec![config_maps(), pods()],
                capabilities: vec![Capability::AppCall("http".into())],
                wants_finalizer: true,
            }
        }

        fn reconcile(observation: Observation) -> Result<Decision, PolicyError> {
            let parent: Value = serde_json::from_str(&observation.parent)
                .map_err(|e| refuse("BadParent", format!("parent is not JSON: {e}")))?;
            let name = parent["metadata"]["name"]
                .as_str()
                .unwrap_or("unnamed")
                .to_string();
            let behaviour = parent["spec"]["behaviour"].as_str().unwrap_or("ok");
            if parent["spec"]["trapIn"].as_str() == Some(VERSION) {
                panic!("deliberate trap for {name}: version {VERSION} is the bad build");
            }
            match behaviour {
                "loop" => {
                    let mut n: u64 = 0;
                    loop {
                        n = n.wrapping_add(1);
                        core::hint::black_box(n);
                    }
                }
                "memory" => {
                    let mut hoard: Vec<Vec<u8>> = Vec::new();
                    loop {
                        hoard.push(vec![1u8; 1 << 20]);
                        core::hint::black_box(&hoard);
                    }
                }
                "output" => {
                    let size = parent["spec"]["outputBytes"].as_u64().unwrap_or(8 << 20) as usize;
                    let status = json!({ "blob": "x".repeat(size) });
                    Ok(Decision {
                        actions: vec![Action::SetStatus(status.to_string())],
                        requeue_after_ms: None,
                    })
                }
                "trap" => panic!("deliberate trap for {name}"),
                "refuse" => Err(refuse(
                    "InvalidSpec",
                    format!("{name}: behaviour `refuse` always refuses; change spec.behaviour"),
                )),
                "adopt" => Ok(Decision {
                    actions: vec![Action::Apply(
                        json!({
                            "apiVersion": "v1", "kind": "Secret",
                            "metadata": { "name": format!("{name}-stolen") },
                        })
                        .to_string(),
                    )],
                    requeue_after_ms: None,
                }),
                "call-stranger" | "call-own" => {
                    // `call-own` calls its own pod `own-0`: a test makes it answer slowly,
                    // so the instance stays alive, waiting, while others start.
                    let pod = if behaviour == "call-own" {
                        "own-0"
                    } else {
                        "someone-elses-pod"
                    };
                    let calls = parent["spec"]["calls"].as_u64().unwrap_or(1).max(1);
                    let mut text = String::new();
                    for _ in 0..calls {
                        let outcome = app_call::call(&app_call::Request {
                            pod: pod.into(),
                            port: "http".into(),
                            method: app_call::Method::Get,
                            path: "/".into(),
                            body: None,
                        });
                        text = match outcome {
                            Ok(response) => format!("answered {}", response.status),
                            Err(app_call::CallError::Refused(why)) => format!("refused: {why}"),
                            Err(app_call::CallError::Unreachable(why)) => {
                                format!("unreachable: {why}")
                            }
                            Err(app_call::CallError::Timeout) => "timeout".into(),
                        };
                    }
                    Ok(Decision {
                        actions: vec![Action::SetStatus(
                            json!({ "appCall": text, "calls": calls }).to_string(),
                        )],
                        requeue_after_ms: None,
                    })
                }
                "privileged-pod" => Ok(Decision {
                    actions: vec![Action::Apply(
                        json!({
                            "apiVersion": "v1", "kind": "Pod",
                            "metadata": { "name": format!("{name}-priv") },
                            "spec": { "containers": [{ "name": "app", "image": "pause",
                                "securityContext": { "privileged": true } }] },
                        })
                        .to_string(),
                    )],
                    requeue_after_ms: None,
                }),
                "log-flood" => {
                    let count = parent["spec"]["count"].as_u64().unwrap_or(100_000);
                    for n in 0..count {
                        log::log(log::Level::Info, &format!("line {n}"), &[]);
                    }
                    Ok(Decision {
                        actions: vec![Action::SetStatus(json!({ "logged": count }).to_string())],
                        requeue_after_ms: None,
                    })
                }
                "refuse-huge" => {
                    let count = parent["spec"]["count"].as_u64().unwrap_or(100_000) as usize;
                    Err(refuse(&"R".repeat(count), "m".repeat(count * 10)))
                }
                "log-split" => {
                    let count = parent["spec"]["count"].as_u64().unwrap_or(600_000) as usize;
                    let line = format!("a{}", "é".repeat(count));
                    log::log(log::Level::Info, &line, &[("field".into(), line.clone())]);
                    Ok(Decision {
                        actions: vec![Action::SetStatus(
                            json!({ "logged": line.len() }).to_string(),
                        )],
                        requeue_after_ms: None,
                    })
                }
                "credential" => {
                    let secret = parent["spec"]["secret"]
                        .as_str()
                        .map_or_else(|| format!("{name}-auth"), str::to_owned);
                    let key = parent["spec"]["key"].as_str().unwrap_or("token");
                    let (text, value) = match credentials::read(&secret, key) {
                        Ok(value) => (
                            format!("read {} bytes", value.len()),
                            String::from_utf8_lossy(&value).into_owned(),
                        ),
                        Err(credentials::CredentialError::Refused(why)) => {
                            (format!("refused: {why}"), String::new())
                        }
                        Err(credentials::CredentialError::Missing(why)) => {
                            (format!("missing: {why}"), String::new())
                        }
                        Err(credentials::CredentialError::Unavailable(why)) => {
                            (format!("unavailable: {why}"), String::new())
                        }
                    };
                    let mut status = json!({ "credential": text });
                    let mut actions = Vec::new();
                    match parent["spec"]["leak"].as_str() {
                        Some("status") => status["leaked"] = json!(value),
                        Some("event") => actions.push(Action::RecordEvent(Event {
                            event_type: EventType::Normal,
                            reason: "Leaking".into(),
                            message: format!("the value is {value}"),
                        })),
                        Some("log") => {
                            log::log(
                                log::Level::Info,
                                &format!("the value is {value}"),
                                &[("value".into(), value.clone())],
                            );
                            status["logged"] = json!(true);
                        }
                        _ => {}
                    }
                    actions.push(Action::SetStatus(status.to_string()));
                    Ok(Decision {
                        actions,
                        requeue_after_ms: None,
                    })
                }
                "metrics" => {
                    let answer = |outcome: Result<(), String>| match outcome {
                        Ok(()) => "ok".to_string(),
                        Err(why) => format!("refused: {why}"),
                    };
                    let lag = parent["spec"]["lag"].as_f64().unwrap_or(1.5);
                    let mut said = Vec::new();
                    for replica in parent["spec"]["replicas"].as_array().into_iter().flatten() {
                        let replica = replica.as_str().unwrap_or_default().to_string();
                        said.push(answer(metrics::set_gauge(
                            "lag_seconds",
                            &[("replica".into(), replica)],
                            lag,
                        )));
                    }
                    said.push(answer(metrics::add_counter("decisions", &[], 1)));
                    if parent["spec"]["undeclared"].as_bool() == Some(true) {
                        said.push(answer(metrics::set_gauge("undeclared_metric", &[], 1.0)));
                        said.push(answer(metrics::set_gauge(
                            "lag_seconds",
                            &[("replica".into(), "x".into()), ("zone".into(), "a".into())],
                            1.0,
                        )));
                    }
                    Ok(Decision {
                        actions: vec![Action::SetStatus(json!({ "metrics": said }).to_string())],
                        requeue_after_ms: None,
                    })
                }
                "steady" => {
                    let applies = parent["spec"]["applies"].as_u64().unwrap_or(0);
                    if let Some(sleep) = parent["spec"]["sleepMs"].as_u64().filter(|ms| *ms > 0) {
                        std::thread::sleep(std::time::Duration::from_millis(sleep));
                    }
                    let mut actions: Vec<Action> = (0..applies)
                        .map(|n| {
                            Action::Apply(
                                json!({
                                    "apiVersion": "v1",
                                    "kind": "ConfigMap",
                                    "metadata": { "name": format!("{name}-steady-{n}") },
                                    "data": { "behaviour": "steady" },
                                })
                                .to_string(),
                            )
                        })
                        .collect();
                    if parent["spec"]["recordEvent"].as_bool() == Some(true) {
                        actions.push(Action::RecordEvent(Event {
                            event_type: EventType::Normal,
                            reason: "Decided".into(),
                            message: format!(
                                "{name} decided: change={} at {}.{:09}",
                                parent["spec"]["change"],
                                observation.now.seconds,
                                observation.now.nanoseconds
                            ),
                        }));
                    }
                    Ok(Decision {
                        actions,
                        requeue_after_ms: Some(
                            parent["spec"]["requeueMs"].as_u64().unwrap_or(30_000),
                        ),
                    })
                }
                _ => {
                    let child = json!({
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": { "name": format!("{name}-out") },
                        "data": { "behaviour": behaviour, "now": observation.now.seconds.to_string() },
                    });
                    // The count of the first observation since `status` was last cleared:
                    // a host that decided on a partial view (children not yet listed) leaves
                    // a lower number here than `observedChildren` later shows.
                    let first = parent["status"]["firstObservedChildren"]
                        .as_u64()
                        .unwrap_or(observation.children.len() as u64);
                    let status = json!({
                        "observedChildren": observation.children.len(),
                        "firstObservedChildren": first,
                        "observedGeneration": parent["metadata"]["generation"].as_u64().unwrap_or(0),
                        "pluginVersion": VERSION,
                    });
                    Ok(Decision {
                        actions: vec![
                            Action::Apply(child.to_string()),
                            Action::SetStatus(status.to_string()),
                            Action::RecordEvent(Event {
                                event_type: EventType::Normal,
                                reason: "Reconciled".into(),
                                message: format!("{name} reconciled"),
                            }),
                        ],
                        requeue_after_ms: None,
                    })
                }
            }
        }

        fn finalize(observation: Observation) -> Result<FinalizeDecision, PolicyError> {
            let parent: Value = serde_json::from_str(&observation.parent)
                .map_err(|e| refuse("BadParent", format!("parent is not JSON: {e}")))?;
            if parent["spec"]["finalize"].as_str() == Some("trap") {
                panic!("deliberate trap while finalizing");
            }
            Ok(FinalizeDecision {
                actions: Vec::new(),
                done: true,
                requeue_after_ms: None,
            })
        }
    }

    export!(Misbehaving);
}
