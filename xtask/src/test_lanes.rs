//! Runs the workspace's built test binaries in two lanes at once: those that start a real node
//! one after another (the machine has one node at a time), and the rest beside them.
//!
//! Why not `cargo test`: it runs its binaries one after another and holds the target
//! directory's lock while they run, so the host crate's tests (minutes, mostly CPU: the sandbox,
//! the template's nested build) waited for the end-to-end suites (minutes, mostly waiting on the
//! node and the API server) and a cold CI run took their sum. The binaries and their
//! environment are the ones `cargo test` would use: cargo's own list of what it built
//! (`--message-format=json`), run from the package's directory with the variables cargo sets.

use std::io::{BufRead as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// Test binaries outside [`NODE_PACKAGES`] that start a real node, by package and target.
/// A binary in the other lane that tries fails at once, naming this list
/// (`policy_host_testenv::node::NO_NODE_VARIABLE`).
const NODE_TESTS: &[(&str, &str)] = &[("policy-host", "signals")];

/// Packages whose every test binary may start a real node: the test environment's own and the
/// end-to-end suites.
const NODE_PACKAGES: &[&str] = &["policy-host-testenv", "policy-host-e2e"];

/// The binaries the node lane runs first, longest first: `suites` is most of the run.
const NODE_FIRST: &[&str] = &["suites"];

/// The binaries the other lane runs first, longest first, so that the lane ends early.
const OTHERS_FIRST: &[&str] = &["template", "sandbox", "rbac"];

/// One test binary as cargo built it.
#[derive(Debug, Clone, PartialEq)]
pub struct TestBinary {
    pub package: String,
    pub target: String,
    /// `lib`, `bin` or `test`: how `cargo test` would select it again.
    pub kind: String,
    pub executable: PathBuf,
    pub manifest_path: PathBuf,
}

impl TestBinary {
    fn needs_node(&self) -> bool {
        NODE_PACKAGES.contains(&self.package.as_str())
            || NODE_TESTS.contains(&(self.package.as_str(), self.target.as_str()))
    }

    fn name(&self) -> String {
        format!("{} {} {}", self.package, self.kind, self.target)
    }

    /// The command that runs this binary alone, for the failure summary.
    fn rerun(&self) -> String {
        let select = match self.kind.as_str() {
            "lib" => "--lib".to_owned(),
            "test" => format!("--test {}", self.target),
            kind => format!("--{kind} {}", self.target),
        };
        format!("cargo test -p {} {select}", self.package)
    }

    fn command(&self, args: &[String]) -> Command {
        let mut command = Command::new(&self.executable);
        policy_host_test_plugins::as_top_level(&mut command);
        let dir = self.manifest_path.parent().unwrap_or(Path::new("."));
        command
            .args(args)
            .current_dir(dir)
            .env("CARGO_MANIFEST_DIR", dir)
            .env("CARGO_MANIFEST_PATH", &self.manifest_path)
            .env("CARGO_PKG_NAME", &self.package)
            .env("CARGO_CRATE_NAME", self.target.replace('-', "_"));
        command
    }
}

/// The test binaries in cargo's JSON messages (`cargo test --no-run --message-format=json`):
/// each artifact built with the test profile that has an executable.
pub fn parse_cargo_messages(messages: &str) -> Vec<TestBinary> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .filter_map(|m| {
            let kind = m["target"]["kind"][0].as_str()?;
            Some(TestBinary {
                package: package_name(m["package_id"].as_str()?)?,
                target: m["target"]["name"].as_str()?.to_owned(),
                kind: if kind.ends_with("lib") { "lib" } else { kind }.to_owned(),
                executable: PathBuf::from(m["executable"].as_str()?),
                manifest_path: PathBuf::from(m["manifest_path"].as_str()?),
            })
        })
        .collect()
}

/// The package's name in a package id: `path+file:///w/host#policy-host@0.1.0`, or
/// `path+file:///w/xtask#0.1.0` when the name is the directory's.
fn package_name(id: &str) -> Option<String> {
    let (url, fragment) = id.split_once('#')?;
    match fragment.split_once('@') {
        Some((name, _)) => Some(name.to_owned()),
        None => Some(url.rsplit('/').next()?.to_owned()),
    }
}

/// Builds the workspace's test binaries (`cargo test --workspace --no-run`), printing cargo's
/// diagnostics as usual, and returns them.
pub fn build() -> anyhow::Result<Vec<TestBinary>> {
    let mut child = policy_host_test_plugins::cargo_command()
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo test --no-run")?;
    let mut messages = String::new();
    if let Some(stdout) = child.stdout.as_mut() {
        stdout
            .read_to_string(&mut messages)
            .context("reading cargo's messages")?;
    }
    let status = child.wait().context("waiting for cargo test --no-run")?;
    if !status.success() {
        anyhow::bail!("cargo test --workspace --no-run failed with {status}: its output says why");
    }
    let binaries = parse_cargo_messages(&messages);
    if binaries.is_empty() {
        anyhow::bail!(
            "cargo test --no-run reported no test binary; its messages were:\n{messages}"
        );
    }
    Ok(binaries)
}

/// How one binary's run went.
struct Outcome {
    binary: TestBinary,
    passed: bool,
    took: Duration,
}

/// Runs `binaries` with `args` in two lanes (module doc), and the documentation tests
/// (`cargo test --doc`) in the lane without a node. The lane without a node runs at a lower
/// priority: the suites have timeouts, those tests do not. Every binary runs even when one
/// fails; the error names each failure and how to run it alone.
pub fn run(binaries: Vec<TestBinary>, args: &[String], logs: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let (mut node, mut others): (Vec<_>, Vec<_>) =
        binaries.into_iter().partition(TestBinary::needs_node);
    order(&mut node, NODE_FIRST);
    order(&mut others, OTHERS_FIRST);
    let printing = Mutex::new(());
    let started = Instant::now();
    let (node_outcomes, (other_outcomes, doc)) = std::thread::scope(|scope| {
        let others = scope.spawn(|| {
            let doc = doc_tests(args, logs, &printing);
            let outcomes: Vec<Outcome> = others
                .into_iter()
                .map(|binary| run_captured(binary, args, logs, &printing))
                .collect();
            (outcomes, doc)
        });
        let node: Vec<Outcome> = node
            .into_iter()
            .map(|binary| run_streamed(binary, args))
            .collect();
        let others = others
            .join()
            .unwrap_or_else(|_| (Vec::new(), Err(anyhow::anyhow!("the test lane panicked"))));
        (node, others)
    });
    let outcomes: Vec<Outcome> = node_outcomes.into_iter().chain(other_outcomes).collect();
    eprintln!(
        "\n==> test binaries: {} run in {:.0} s (two lanes)",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    for outcome in &outcomes {
        eprintln!(
            "  {} {} ({:.1} s)",
            if outcome.passed { "ok    " } else { "FAILED" },
            outcome.binary.name(),
            outcome.took.as_secs_f64()
        );
    }
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed)
        .map(|o| format!("{} (alone: {})", o.binary.name(), o.binary.rerun()))
        .collect();
    doc?;
    if !failed.is_empty() {
        anyhow::bail!(
            "{} test binaries failed (their output is above): {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

/// Puts the binaries named in `first` at the front, in that order; the rest keep cargo's order.
fn order(binaries: &mut [TestBinary], first: &[&str]) {
    binaries.sort_by_key(|b| {
        first
            .iter()
            .position(|name| *name == b.target && b.kind == "test")
            .unwrap_or(first.len())
    });
}

/// A node-lane binary, its output straight to this process's.
fn run_streamed(binary: TestBinary, args: &[String]) -> Outcome {
    eprintln!("\n==> {} (a real node)", binary.name());
    let started = Instant::now();
    let passed = match binary.command(args).status() {
        Ok(status) => status.success(),
        Err(e) => {
            eprintln!("cannot start {}: {e}", binary.executable.display());
            false
        }
    };
    Outcome {
        binary,
        passed,
        took: started.elapsed(),
    }
}

/// A binary of the lane without a node, at a lower priority, with the node variable set; its
/// output goes to a file under `logs`, printed whole when it ends so that it does not
/// interleave with the suites'.
fn run_captured(binary: TestBinary, args: &[String], logs: &Path, printing: &Mutex<()>) -> Outcome {
    let log = logs.join(format!(
        "{}-{}-{}.log",
        binary.package, binary.kind, binary.target
    ));
    let started = Instant::now();
    let mut command = binary.command(args);
    let passed = lower_priority_with_log(&mut command, &log);
    print_log(&binary.name(), &log, printing);
    Outcome {
        binary,
        passed,
        took: started.elapsed(),
    }
}

/// The documentation tests (`cargo test --workspace --doc`): cargo builds and runs them, so
/// they go through cargo, in the lane without a node.
fn doc_tests(args: &[String], logs: &Path, printing: &Mutex<()>) -> anyhow::Result<()> {
    let log = logs.join("doc-tests.log");
    let mut command = policy_host_test_plugins::cargo_command();
    command
        .args(["test", "--workspace", "--doc", "--"])
        .args(args);
    let passed = lower_priority_with_log(&mut command, &log);
    print_log("documentation tests", &log, printing);
    if !passed {
        anyhow::bail!("the documentation tests failed (their output is above): cargo test --doc");
    }
    Ok(())
}

/// Runs `command` under `nice -n 10` with the node variable set, its output into `log`.
fn lower_priority_with_log(command: &mut Command, log: &Path) -> bool {
    let file = match std::fs::File::create(log) {
        Ok(file) => file,
        Err(e) => {
            eprintln!("cannot create {}: {e}", log.display());
            return false;
        }
    };
    let Ok(stderr) = file.try_clone() else {
        eprintln!("cannot share {} between stdout and stderr", log.display());
        return false;
    };
    let mut niced = Command::new("nice");
    niced
        .args(["-n", "10"])
        .arg(command.get_program())
        .args(command.get_args())
        .env(policy_host_testenv::node::NO_NODE_VARIABLE, "1")
        .stdout(file)
        .stderr(stderr);
    if let Some(dir) = command.get_current_dir() {
        niced.current_dir(dir);
    }
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => niced.env(name, value),
            None => niced.env_remove(name),
        };
    }
    match niced.status() {
        Ok(status) => status.success(),
        Err(e) => {
            eprintln!("cannot start {:?}: {e}", command.get_program());
            false
        }
    }
}

fn print_log(what: &str, log: &Path, printing: &Mutex<()>) {
    let _turn = printing.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = std::io::stderr().lock();
    let _ = writeln!(out, "\n==> {what} (beside the suites; {})", log.display());
    match std::fs::File::open(log) {
        Ok(file) => {
            for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
                let _ = writeln!(out, "{line}");
            }
        }
        Err(e) => {
            let _ = writeln!(out, "cannot read {}: {e}", log.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two lines as cargo 1.95 writes them for `cargo test --no-run --message-format=json`:
    /// an integration test and a library dependency (not a test).
    const MESSAGES: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/host#policy-host@0.1.0","manifest_path":"/w/host/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"sandbox","src_path":"/w/host/tests/sandbox.rs","edition":"2024","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/w/target/debug/deps/sandbox-1"],"executable":"/w/target/debug/deps/sandbox-1","fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///w/tests#policy-host-testenv@0.1.0","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"policy_host_testenv","src_path":"/w/tests/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":false},"features":[],"filenames":["/w/target/debug/deps/libpolicy_host_testenv-2.rlib"],"executable":null,"fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///w/xtask#0.1.0","manifest_path":"/w/xtask/Cargo.toml","target":{"kind":["bin"],"crate_types":["bin"],"name":"xtask","src_path":"/w/xtask/src/main.rs","edition":"2024","doc":true,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/w/target/debug/deps/xtask-3"],"executable":"/w/target/debug/deps/xtask-3","fresh":true}
{"reason":"build-finished","success":true}"#;

    #[test]
    fn the_test_binaries_are_cargos_test_artifacts_with_their_packages() {
        let binaries = parse_cargo_messages(MESSAGES);
        assert_eq!(
            binaries,
            vec![
                TestBinary {
                    package: "policy-host".into(),
                    target: "sandbox".into(),
                    kind: "test".into(),
                    executable: "/w/target/debug/deps/sandbox-1".into(),
                    manifest_path: "/w/host/Cargo.toml".into(),
                },
                TestBinary {
                    package: "xtask".into(),
                    target: "xtask".into(),
                    kind: "bin".into(),
                    executable: "/w/target/debug/deps/xtask-3".into(),
                    manifest_path: "/w/xtask/Cargo.toml".into(),
                },
            ]
        );
        assert_eq!(
            binaries[0].rerun(),
            "cargo test -p policy-host --test sandbox"
        );
        assert_eq!(binaries[1].rerun(), "cargo test -p xtask --bin xtask");
    }

    #[test]
    fn the_suites_and_the_node_tests_go_to_the_node_lane_the_rest_beside_them() {
        let binary = |package: &str, target: &str| TestBinary {
            package: package.into(),
            target: target.into(),
            kind: "test".into(),
            executable: PathBuf::new(),
            manifest_path: PathBuf::new(),
        };
        assert!(binary("policy-host-e2e", "suites").needs_node());
        assert!(binary("policy-host-testenv", "end_to_end").needs_node());
        assert!(binary("policy-host", "signals").needs_node());
        assert!(!binary("policy-host", "sandbox").needs_node());
        assert!(!binary("guest-mariadb", "guest_mariadb").needs_node());
        let mut lane = vec![
            binary("policy-host", "cli"),
            binary("policy-host", "sandbox"),
            binary("policy-host", "template"),
        ];
        order(&mut lane, OTHERS_FIRST);
        let targets: Vec<&str> = lane.iter().map(|b| b.target.as_str()).collect();
        assert_eq!(targets, ["template", "sandbox", "cli"]);
    }
}
