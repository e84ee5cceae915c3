//! plugin-template on a real Kubernetes node: policy-host's test environment (a control plane
//! and a node with kubelet and containerd, built from source on first use and cached) runs the
//! component this crate builds, packed into its bundle by the `policy-host` CLI and loaded by a
//! `policy-host` host, and the example resource becomes Ready with its app Pod on the image
//! `../test-images.yaml` declares.
//!
//! Run it from the plugin's directory: `cargo test --manifest-path e2e/Cargo.toml`. It needs
//! the `policy-host` CLI (on `PATH`, or its path in `POLICY_HOST`), the `wasm32-wasip2` target,
//! Go (the first run builds the control plane and node, about half an hour on 2 cores), and
//! root (the node makes a bridge and network namespaces). With `POLICY_HOST_TESTENV_ATTACH` set
//! to a running environment's attach file it uses that environment instead of starting one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

/// The plugin's crate, beside this one.
fn plugin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where cargo builds the plugin: `CARGO_TARGET_DIR`, else its `target/`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| plugin_dir().join("target"))
}

/// The `policy-host` CLI: `POLICY_HOST`, else the one on `PATH`.
fn policy_host() -> PathBuf {
    std::env::var_os("POLICY_HOST")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("policy-host"))
}

/// Runs `command`, failing with its output if it fails; returns its standard output.
fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test]
async fn the_example_becomes_ready_on_a_real_node() -> anyhow::Result<()> {
    let env = policy_host_testenv::shared_node().await?;
    let images = env
        .provide_images(&plugin_dir().join("test-images.yaml"))
        .await?;
    let image = images
        .first()
        .context("../test-images.yaml declares no image")?
        .name()
        .to_owned();
    let namespace = env.create_namespace("plugin-template").await?;
    let kubectl = |args: &[&str]| -> anyhow::Result<String> {
        run(Command::new(env.binaries().kubectl())
            .env("KUBECONFIG", env.kubeconfig_path())
            .args(args))
    };

    // The component, as the guide builds it.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo)
        .current_dir(plugin_dir())
        .args(["build", "--quiet", "--target", "wasm32-wasip2", "--profile", "plugin"]))?;
    let wasm = target_dir().join("wasm32-wasip2/plugin/plugin_template.wasm");

    // Its bundle, as an admin packs it: the CRD, the ClusterRole, the plugin ConfigMap.
    let bundle = target_dir().join("plugin-template-bundle.yaml");
    let packed = run(Command::new(policy_host())
        .arg("pack")
        .arg(&wasm)
        .args(["--grant-exchange", "app", "--bundle", "--crd"])
        .arg(plugin_dir().join("crd.yaml")))?;
    std::fs::write(&bundle, packed).with_context(|| format!("writing {}", bundle.display()))?;
    kubectl(&[
        "-n",
        &namespace,
        "apply",
        "--server-side",
        "-f",
        &bundle.display().to_string(),
    ])?;
    kubectl(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/plugintemplates.plugin-template.example.com",
    ])?;

    // A host, the same binary an admin deploys, run here: it loads the plugin ConfigMaps of
    // this namespace and reconciles there.
    let log = target_dir().join("plugin-template-host.log");
    let log_file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut host = tokio::process::Command::new(policy_host())
        .args(["run", "--plugin-namespace", &namespace, "--namespace", &namespace])
        .args(["--leader-election", "false", "--admin-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", env.kubeconfig_path())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", policy_host().display()))?;

    // The example, on the declared image.
    let mut example: Value = serde_json::from_str(&kubectl(&[
        "create",
        "--dry-run=client",
        "-o",
        "json",
        "-f",
        &plugin_dir().join("example.yaml").display().to_string(),
    ])?)?;
    example["spec"]["image"] = Value::String(image.clone());
    example["metadata"]["namespace"] = Value::String(namespace.to_string());
    let example_file = target_dir().join("plugin-template-example.json");
    std::fs::write(&example_file, example.to_string())?;
    kubectl(&["-n", &namespace, "apply", "-f", &example_file.display().to_string()])?;

    // Ready: the ConfigMap in place and every app Pod answering its session.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let ready = kubectl(&[
            "-n",
            &namespace,
            "get",
            "plugintemplates",
            "demo",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])?;
        if ready == "True" {
            break;
        }
        if let Some(status) = host.try_wait()? {
            bail!(
                "the host exited ({status}); its log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "demo not Ready within 180 s (Ready: {ready:?}); status: {}; host log: {}",
                kubectl(&["-n", &namespace, "get", "plugintemplates", "demo", "-o", "jsonpath={.status}"])?,
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let pod_image = kubectl(&[
        "-n",
        &namespace,
        "get",
        "pod",
        "demo-0",
        "-o",
        "jsonpath={.spec.containers[0].image}",
    ])?;
    assert_eq!(pod_image, image, "the app Pod runs the declared image");
    let greeting = kubectl(&[
        "-n",
        &namespace,
        "get",
        "configmap",
        "demo-config",
        "-o",
        "jsonpath={.data.greeting}",
    ])?;
    assert_eq!(greeting, example["spec"]["greeting"].as_str().unwrap_or_default());
    host.kill().await?;
    Ok(())
}
