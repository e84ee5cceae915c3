//! The authoring path, end to end, as the commands a newcomer types: `policy-host new-plugin`
//! writes a new plugin crate from the template compiled into the CLI, outside the workspace,
//! naming no path of this checkout (it carries its own copy of the SDK), which passes its own
//! native tests (its session against the SDK's fake among them), builds for `wasm32-wasip2`,
//! loads in the sandbox with the description it declared, decides, packs with `policy-host
//! pack`, and simulates with the responder file its tests read.
//!
//! The plugin builds with its own target directory (`target/template-test`), so it neither
//! waits for nor invalidates the workspace's builds; the first run compiles the SDK's
//! dependencies there (a minute or two), later runs reuse them.

use std::path::{Path, PathBuf};
use std::process::Command;

use policy_host::capability::scope::AppCallScope;
use policy_host::contract::{Action, Observation, Timestamp};
use policy_host::decide::{Limits, Sandbox};
use serde_json::json;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs cargo in `dir` with `args`, failing the test with the command line if it fails.
fn cargo(dir: &Path, args: &[&str], target_dir: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(dir)
        .args(args)
        .arg("--target-dir")
        .arg(target_dir)
        // The outer test's cargo settings are not the new plugin's.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    assert!(
        status.success(),
        "`cargo {}` in the new plugin {} failed ({status}); its output is above",
        args.join(" "),
        dir.display()
    );
}

#[tokio::test]
async fn a_plugin_from_the_template_tests_builds_loads_decides_and_packs() {
    let root = workspace_root();
    let work = root.join("target/template-test");
    let dir = work.join("hello-world");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("old generated plugin removable");
    }
    let created = Command::new(env!("CARGO_BIN_EXE_policy-host"))
        .args(["new-plugin", "hello-world", "--dir"])
        .arg(&dir)
        .output()
        .expect("policy-host new-plugin runs");
    assert!(
        created.status.success(),
        "policy-host new-plugin failed: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let target_dir = work.join("target");

    // Out of the tree: nothing it wrote names a path of this checkout, so it builds wherever
    // the author moves it (it carries its own copy of the SDK and the contract).
    let checkout = root.canonicalize().expect("the checkout's path");
    let mut pending = vec![dir.clone()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("generated dir readable") {
                pending.push(entry.expect("an entry").path());
            }
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            assert!(
                !text.contains(checkout.to_str().unwrap_or("/")),
                "{} names the checkout {}",
                path.display(),
                checkout.display()
            );
        }
    }
    assert!(dir.join("policy-host-sdk/policy.wit").is_file());
    assert!(dir.join("README.md").is_file());
    assert!(dir.join("e2e/tests/real_node.rs").is_file());

    // Its own native tests (the SDK harness), as the author runs them.
    cargo(&dir, &["test", "--quiet"], &target_dir);
    // Its CRD is generated from its spec type, as the in-tree plugins' are, and current:
    // `crd.yaml` under the new name is what `crdgen` makes of the renamed type.
    cargo(
        &dir,
        &["test", "--quiet", "--features", "crd", "--test", "crd"],
        &target_dir,
    );
    // The component, as the guide builds it.
    cargo(
        &dir,
        &[
            "build",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--profile",
            "plugin",
        ],
        &target_dir,
    );
    let wasm = target_dir.join("wasm32-wasip2/plugin/hello_world.wasm");
    let bytes = std::fs::read(&wasm).unwrap_or_else(|e| panic!("{}: {e}", wasm.display()));

    // Loads in the sandbox and describes itself under its new name.
    let sandbox = Sandbox::new().expect("sandbox");
    let plugin = sandbox
        .load("hello-world.wasm", &bytes, Limits::default())
        .await
        .expect("the generated plugin loads");
    let info = plugin.info();
    assert_eq!(info.name, "hello-world");
    assert_eq!(info.target.kind, "HelloWorld");
    assert_eq!(info.target.group, "hello-world.example.com");
    assert_eq!(info.target.plural, "helloworlds");
    let children: Vec<&str> = info.children.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!(children, ["ConfigMap", "Pod"]);

    // Decides through the real contract: its ConfigMap, then its status.
    let observation = Observation {
        parent: json!({
            "apiVersion": "hello-world.example.com/v1",
            "kind": "HelloWorld",
            "metadata": { "name": "demo", "namespace": "default", "uid": "u-1", "generation": 1 },
            "spec": { "greeting": "hi" },
        })
        .to_string(),
        children: Vec::new(),
        now: Timestamp {
            seconds: 1_700_000_000,
            nanoseconds: 0,
        },
    };
    let decision = plugin
        .reconcile(&observation, AppCallScope::none(), "testing")
        .await
        .expect("the generated plugin decides");
    let applied: Vec<serde_json::Value> = decision
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply(object) => serde_json::from_str(object).ok(),
            _ => None,
        })
        .collect();
    assert_eq!(applied.len(), 1, "{:?}", decision.actions);
    assert_eq!(applied[0]["metadata"]["name"], "demo-config");
    assert_eq!(applied[0]["data"]["greeting"], "hi");
    assert!(
        decision
            .actions
            .iter()
            .any(|a| matches!(a, Action::SetStatus(_)))
    );

    // Packs with the host's own CLI as the guide's step 4 does: one bundle of its CRD, the
    // ClusterRole the host needs on its kinds, and a ConfigMap that pins the component's sha256.
    let packed = Command::new(env!("CARGO_BIN_EXE_policy-host"))
        .arg("pack")
        .arg(&wasm)
        .args(["--grant-exchange", "app", "--bundle", "--crd"])
        .arg(dir.join("crd.yaml"))
        .output()
        .expect("policy-host pack runs");
    assert!(
        packed.status.success(),
        "policy-host pack failed: {}",
        String::from_utf8_lossy(&packed.stderr)
    );
    let documents: Vec<serde_json::Value> = serde_yaml::Deserializer::from_slice(&packed.stdout)
        .map(|document| serde::Deserialize::deserialize(document).expect("a YAML document"))
        .collect();
    let kinds: Vec<&str> = documents
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["CustomResourceDefinition", "ClusterRole", "ConfigMap"],
        "the bundle's documents"
    );
    assert_eq!(
        documents[0]["metadata"]["name"],
        "helloworlds.hello-world.example.com"
    );
    let config_map: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(documents[2].clone()).expect("the bundle's ConfigMap");
    assert_eq!(
        config_map.metadata.name.as_deref(),
        Some("plugin-hello-world")
    );
    let sha = policy_host::load::pack::sha256_hex(&bytes);
    let data = config_map.data.unwrap_or_default();
    assert!(
        data.values().any(|v| v == &sha),
        "the pack pins sha256 {sha}: {data:?}"
    );

    // Simulates offline with the host's CLI: its example converges (ConfigMap and app Pod, then
    // Ready once the Pod answers its session from the responder file the native tests read).
    let simulated = Command::new(env!("CARGO_BIN_EXE_policy-host"))
        .args(["simulate", "--json", "--cr"])
        .arg(dir.join("example.yaml"))
        .arg("--responses")
        .arg(dir.join("responses.json"))
        .arg(&wasm)
        .output()
        .expect("policy-host simulate runs");
    let stdout = String::from_utf8_lossy(&simulated.stdout);
    assert!(
        simulated.status.success(),
        "policy-host simulate did not converge: {stdout}{}",
        String::from_utf8_lossy(&simulated.stderr)
    );
    let steps: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON step per line"))
        .collect();
    assert_eq!(steps[0]["actions"][0], "create ConfigMap demo-config");
    assert_eq!(steps[0]["actions"][1], "create Pod demo-0");
    let ready = |step: &serde_json::Value| step["status"]["conditions"][0]["status"] == "True";
    assert!(!ready(&steps[0]), "not Ready before the ConfigMap is seen");
    assert!(
        steps
            .iter()
            .any(|s| s["sessions"][0] == "demo-0:app sent 6 bytes, got 7 bytes"),
        "the Pod was asked over a session: {steps:?}"
    );
    assert!(steps.iter().any(ready), "Ready once it is: {steps:?}");
    assert_eq!(
        steps.last().map(|s| s["converged"].clone()),
        Some(json!(true))
    );
}
