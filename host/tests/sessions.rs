//! Sessions in the sandbox: a plugin written on the SDK alone (`session-toy`) holds a
//! server-first conversation (greeting, authentication, two queries) with two real TCP servers
//! on 127.0.0.1 at once; the host's recording of it replays without the network in the sandbox,
//! in `simulate` (as responder rows) and in the SDK's native fake, each to the same decision.

use std::collections::HashMap;

use policy_host::capability::http::http_client;
use policy_host::capability::replay::AppCallRecorder;
use policy_host::capability::scope::{AppCallScope, Grants, PodEndpoint};
use policy_host::contract::{Action, Observation, Timestamp};
use policy_host::decide::{Limits, Plugin, Sandbox};
use policy_host::plugin_cli::simulate::{Responses, SessionRow, SimulateRequest, simulate};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const TOKEN: &str = "s3cret";

async fn toy_plugin() -> Plugin {
    let path = policy_host_test_plugins::build("session-toy-policy").expect("plugin builds");
    let bytes = std::fs::read(&path).expect("plugin file readable");
    Sandbox::new()
        .expect("sandbox")
        .load("session-toy.wasm", &bytes, Limits::default())
        .await
        .expect("plugin loads")
}

/// A toy server (the protocol of `tests/plugins/session-toy`) answering `role`; returns its
/// port. It greets first, checks the proof of its salt, and writes each answer in two pieces,
/// so the plugin's frame check, not the chunking, decides where a reply ends.
async fn toy_server(salt: &'static str, role: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a local port");
    let port = listener.local_addr().map(|a| a.port()).expect("a port");
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read);
                let _ = write.write_all(format!("TOY 1 {salt}\n").as_bytes()).await;
                let mut line = String::new();
                while matches!(lines.read_line(&mut line).await, Ok(n) if n > 0) {
                    let reply = match line.trim_end() {
                        auth if auth.starts_with("AUTH ") => {
                            if auth == format!("AUTH {}", session_toy_policy::proof(salt, TOKEN)) {
                                "OK\n".to_owned()
                            } else {
                                "ERR bad proof\n".to_owned()
                            }
                        }
                        "GET role" => format!("={}\n{role}", role.len()),
                        "GET version" => "=6\n1.2\n.3".to_owned(),
                        _ => "ERR unknown\n".to_owned(),
                    };
                    let (head, tail) = reply.split_at(reply.len() / 2);
                    if write.write_all(head.as_bytes()).await.is_err()
                        || write.flush().await.is_err()
                        || write.write_all(tail.as_bytes()).await.is_err()
                    {
                        break;
                    }
                    line.clear();
                }
                // Drain until the client closes, so the plugin sees no reset.
                let mut rest = Vec::new();
                let _ = lines.read_to_end(&mut rest).await;
            });
        }
    });
    port
}

fn probe() -> Observation {
    Observation {
        parent: json!({
            "apiVersion": "test.policy-host.io/v1",
            "kind": "Probe",
            "metadata": { "name": "toy", "namespace": "default", "uid": "u-1" },
            "spec": { "token": TOKEN, "replicas": 2 },
        })
        .to_string(),
        children: Vec::new(),
        now: Timestamp {
            seconds: 1_700_000_000,
            nanoseconds: 0,
        },
    }
}

fn live_scope(ports: [u16; 2]) -> AppCallScope {
    let pods = ports
        .iter()
        .enumerate()
        .map(|(ordinal, &port)| {
            (
                format!("toy-{ordinal}"),
                PodEndpoint {
                    ip: Some("127.0.0.1".into()),
                    named_ports: HashMap::from([("admin".to_string(), port)]),
                    declared_ports: vec![port],
                    ..PodEndpoint::default()
                },
            )
        })
        .collect();
    let grants = Grants {
        exchange_ports: vec!["admin".into()],
        ..Grants::default()
    };
    AppCallScope::new(
        "default/toy".into(),
        pods,
        grants,
        http_client().expect("the app-call client"),
    )
}

fn status_of(actions: &[Action]) -> Value {
    match actions {
        [Action::SetStatus(status)] => serde_json::from_str(status).expect("status is JSON"),
        other => panic!("expected one set-status, got {other:?}"),
    }
}

fn expected() -> Value {
    json!({
        "toy-0": { "role": "primary", "version": "1.2\n.3" },
        "toy-1": { "role": "replica", "version": "1.2\n.3" },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_on_the_sdk_holds_two_server_first_sessions_over_real_tcp() {
    let plugin = toy_plugin().await;
    let ports = [
        toy_server("4242", "primary").await,
        toy_server("77", "replica").await,
    ];
    let decision = plugin
        .reconcile(&probe(), live_scope(ports), "testing")
        .await
        .expect("decides");
    assert_eq!(status_of(&decision.actions), expected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_session_replays_in_the_sandbox_in_simulate_and_in_the_sdk_fake() {
    let plugin = toy_plugin().await;
    let ports = [
        toy_server("4242", "primary").await,
        toy_server("77", "replica").await,
    ];
    let recorder = AppCallRecorder::new();
    let live = plugin
        .reconcile(
            &probe(),
            live_scope(ports).recorded_by(recorder.clone()),
            "testing",
        )
        .await
        .expect("decides live");
    assert_eq!(status_of(&live.actions), expected());
    assert!(recorder.is_complete());
    let greetings = recorder
        .exchanges()
        .iter()
        .filter(|round| round.request.is_empty())
        .count();
    assert_eq!(
        greetings,
        2,
        "each server spoke first: {:?}",
        recorder.exchanges()
    );

    // 1. The sandbox, without the network (shadow mode's replay).
    let replayed = plugin
        .reconcile(
            &probe(),
            AppCallScope::scripted("default/toy".into(), recorder.replay()),
            "replaying",
        )
        .await
        .expect("decides on the replay");
    assert_eq!(status_of(&replayed.actions), expected());

    // 2. The recording as responder rows: `simulate` reads them...
    let responses = Responses {
        sessions: recorder
            .exchanges()
            .iter()
            .map(SessionRow::from_round)
            .collect(),
        ..Responses::default()
    };
    let rows = serde_json::to_string_pretty(&responses).expect("rows serialize");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sessions-replay");
    std::fs::create_dir_all(&dir).expect("temp dir creatable");
    let (cr, answers) = (dir.join("cr.json"), dir.join("responses.json"));
    std::fs::write(&cr, probe().parent).expect("cr writable");
    std::fs::write(&answers, &rows).expect("responses writable");
    let steps = simulate(
        &plugin,
        &SimulateRequest {
            cr,
            responses: Some(answers),
            steps: 1,
            json: false,
        },
        |_| {},
    )
    .await
    .expect("simulation runs");
    assert_eq!(steps[0].status.as_ref(), Some(&expected()), "{rows}");
    assert_eq!(steps[0].sessions.len(), 8, "{:?}", steps[0].sessions);

    // ... and so does the SDK's fake, natively.
    let fake = policy_host_sdk::testing::ScriptedAppCall::from_responses(&rows)
        .expect("the SDK reads the host's rows");
    let mut harness =
        policy_host_sdk::testing::Harness::<session_toy_policy::SessionToy>::with_app(fake);
    let native = harness
        .reconcile(
            &policy_host_sdk::testing::observation(
                serde_json::from_str(&probe().parent).expect("JSON"),
            )
            .build(),
        )
        .expect("decides natively");
    assert_eq!(native.status(), Some(&expected()));
}

/// The fixture the toy plugin's native tests read drives `simulate` too: one responder file.
#[tokio::test]
async fn simulate_reads_the_responder_file_the_native_tests_read() {
    let plugin = toy_plugin().await;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sessions-fixture");
    std::fs::create_dir_all(&dir).expect("temp dir creatable");
    let cr = dir.join("cr.yaml");
    std::fs::write(
        &cr,
        "apiVersion: test.policy-host.io/v1\nkind: Probe\nmetadata:\n  name: toy\nspec:\n  token: s3cret\n",
    )
    .expect("cr writable");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/plugins/session-toy/responses.json");
    let steps = simulate(
        &plugin,
        &SimulateRequest {
            cr,
            responses: Some(fixture),
            steps: 1,
            json: false,
        },
        |_| {},
    )
    .await
    .expect("simulation runs");
    assert_eq!(
        steps[0].status.as_ref(),
        Some(&json!({ "toy-0": { "role": "replica", "version": "9.9" } }))
    );
}
