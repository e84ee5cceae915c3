//! `policy-host simulate` on a real component (the `misbehaving` test plugin): the in-memory
//! model carries out what the host would and refuses what the host would refuse, app-calls are
//! answered from the responder file, and a plugin that never settles runs out of steps.

use std::path::PathBuf;

use policy_host::decide::{Limits, Plugin, Sandbox};
use policy_host::plugin_cli::simulate::{SimulateRequest, Step, simulate};

async fn misbehaving() -> Plugin {
    let path = policy_host_test_plugins::build("misbehaving-policy").expect("plugin builds");
    let bytes = std::fs::read(&path).expect("plugin file readable");
    Sandbox::new()
        .expect("sandbox")
        .load("misbehaving.wasm", &bytes, Limits::default())
        .await
        .expect("plugin loads")
}

/// Writes `text` to `name` in a directory of this test's own (cargo's temp dir for tests).
fn file(dir: &str, name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("simulate-{dir}"));
    std::fs::create_dir_all(&dir).expect("temp dir creatable");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("temp file writable");
    path
}

async fn run(behaviour: &str, responses: Option<&str>, steps: u32) -> Vec<Step> {
    run_with(behaviour, "", responses, steps).await
}

/// As [`run`], with more lines of `spec` (each `  key: value\n`).
async fn run_with(behaviour: &str, spec: &str, responses: Option<&str>, steps: u32) -> Vec<Step> {
    let dir = format!("{behaviour}-{}-{}", responses.is_some(), spec.len());
    let cr = file(
        &dir,
        "cr.yaml",
        &format!(
            "apiVersion: test.policy-host.io/v1\nkind: Probe\nmetadata:\n  name: sim\nspec:\n  behaviour: {behaviour}\n{spec}"
        ),
    );
    let request = SimulateRequest {
        cr,
        responses: responses.map(|text| file(&dir, "responses.yaml", text)),
        steps,
        json: false,
    };
    simulate(&misbehaving().await, &request, |_| {})
        .await
        .expect("simulation runs")
}

#[tokio::test]
async fn each_step_applies_the_decision_to_the_model_and_a_changing_plugin_runs_out_of_steps() {
    // `ok` writes the observation's time into its child: every step changes the model.
    let steps = run("ok", None, 3).await;
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[0].children, 0);
    assert_eq!(steps[0].actions[0], "create ConfigMap sim-out");
    assert!(
        steps[0]
            .actions
            .iter()
            .any(|a| a.starts_with("event Normal Reconciled"))
    );
    assert_eq!(
        steps[1].children, 1,
        "the created child is observed next step"
    );
    assert_eq!(steps[1].actions[0], "apply ConfigMap sim-out");
    assert_eq!(steps[1].now, "2026-01-01T00:00:30Z", "the clock moved on");
    assert!(steps.iter().all(|s| !s.converged && s.error.is_none()));
}

#[tokio::test]
async fn what_the_host_refuses_stops_the_simulation_with_its_reason() {
    let refused = run("refuse", None, 5).await;
    assert_eq!(refused.len(), 1);
    let error = refused[0].error.clone().unwrap_or_default();
    assert!(error.contains("InvalidSpec"), "{error}");

    let adopted = run("adopt", None, 5).await;
    let error = adopted[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("Secret") && error.contains("not a child kind the plugin declared"),
        "{error}"
    );
}

#[tokio::test]
async fn app_calls_are_answered_from_the_responder_file() {
    let responses = "appCalls:\n  - { pod: someone-elses-pod, path: /, status: 204 }\n";
    let steps = run("call-stranger", Some(responses), 2).await;
    assert_eq!(steps[0].app_calls, ["GET / on someone-elses-pod:http"]);
    let status = steps[0].status.clone().unwrap_or_default();
    assert_eq!(status["appCall"], "answered 204", "{status}");

    let unanswered = run("call-stranger", None, 2).await;
    let status = unanswered[0].status.clone().unwrap_or_default();
    assert!(
        status["appCall"]
            .as_str()
            .is_some_and(|s| s.starts_with("unreachable: no scripted answer")),
        "{status}"
    );
}

#[tokio::test]
async fn credentials_are_answered_from_the_responder_file_and_never_printed() {
    let value = "simulated-password-1";
    let responses =
        format!("credentials:\n  - {{ secret: sim-auth, key: token, value: {value} }}\n");
    let steps = run("credential", Some(&responses), 1).await;
    let status = steps[0].status.clone().unwrap_or_default();
    assert_eq!(status["credential"], "read 20 bytes", "{status}");

    let unscripted = run("credential", None, 1).await;
    let status = unscripted[0].status.clone().unwrap_or_default();
    assert!(
        status["credential"]
            .as_str()
            .is_some_and(|s| s.starts_with("missing:")),
        "{status}"
    );

    let leaked = run_with("credential", "  leak: status\n", Some(&responses), 1).await;
    let error = leaked[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("PluginLeaksCredential") || error.contains("sim-auth` key `token"),
        "{error}"
    );
    let printed = serde_json::to_string(&leaked).expect("steps serialize");
    assert!(
        !printed.contains(value),
        "the simulation printed the value: {printed}"
    );
}
