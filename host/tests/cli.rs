//! The `policy-host` command line refuses, at start and before it reaches any cluster, a shard
//! combination that names no shard, and says what to write instead.

use std::process::Command;

/// Runs `policy-host run` with `args` and no reachable cluster; returns (success, stderr).
fn run(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_policy-host"))
        .arg("run")
        .args(args)
        .args(["--policy", "/nonexistent/plugin.wasm"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("POD_NAMESPACE")
        .env_remove("POLICY_HOST_SHARDS")
        .env_remove("POLICY_HOST_SHARD")
        .output()
        .expect("the policy-host binary runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_shard_past_the_last_fails_at_start_and_says_what_to_write() {
    let (succeeded, stderr) = run(&["--shards", "2", "--shard", "2"]);
    assert!(!succeeded, "--shard 2 of 2 started");
    assert!(
        stderr.contains("--shard 2 is not a shard of --shards 2")
            && stderr.contains("one of --shard 0 to --shard 1"),
        "{stderr}"
    );
}

#[test]
fn zero_shards_fail_at_start_and_say_what_to_write() {
    let (succeeded, stderr) = run(&["--shards", "0"]);
    assert!(!succeeded, "--shards 0 started");
    assert!(stderr.contains("write --shards 1"), "{stderr}");
}

#[test]
fn the_shard_can_come_from_the_environment() {
    let output = Command::new(env!("CARGO_BIN_EXE_policy-host"))
        .args(["run", "--policy", "/nonexistent/plugin.wasm"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("POLICY_HOST_SHARDS", "3")
        .env("POLICY_HOST_SHARD", "5")
        .env_remove("POD_NAMESPACE")
        .output()
        .expect("the policy-host binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("--shard 5 is not a shard of --shards 3"),
        "{stderr}"
    );
}

/// `policy-host validate` on a component that imports an `async` function (hand-made: no
/// toolchain here builds one) refuses it and names the build flags of a synchronous one.
#[test]
fn validate_refuses_a_component_that_needs_async_and_names_the_synchronous_build() {
    let mut types = wasm_encoder::ComponentTypeSection::new();
    types
        .function()
        .async_(true)
        .params::<_, wasm_encoder::ComponentValType>([])
        .result(None);
    let mut imports = wasm_encoder::ComponentImportSection::new();
    imports.import("run", wasm_encoder::ComponentTypeRef::Func(0));
    let mut component = wasm_encoder::Component::new();
    component.section(&types).section(&imports);
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("async-plugin.wasm");
    std::fs::write(&path, component.finish()).expect("temp file writable");
    let output = Command::new(env!("CARGO_BIN_EXE_policy-host"))
        .arg("validate")
        .arg(&path)
        .output()
        .expect("the policy-host binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "an async component validated");
    assert!(
        stderr.contains("needs component-model async") && stderr.contains("--target wasm32-wasip2"),
        "{stderr}"
    );
}
