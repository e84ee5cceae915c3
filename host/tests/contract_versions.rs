//! The host serves every contract version it promises: a plugin built against the frozen 0.1.0
//! WIT (`tests/plugins/contract-v0-1`), one built against the frozen 0.2.0
//! (`tests/plugins/contract-v0-2`) and one built against the current 0.2.3 (`guest-redis`) all
//! pass the load check, describe themselves and decide; 0.1 through its own bindings, 0.2.0
//! through the current ones (wasmtime links semver-compatible names; 0.2.1 and 0.2.2 plugins,
//! which import no `metrics`, take the same path). The 0.2.3 plugin's
//! exchanges are answered by a scripted scope, as in `simulate` and shadow mode.

use policy_host::capability::replay::AppCallScript;
use policy_host::capability::replay::ExchangeRound;
use policy_host::capability::scope::AppCallScope;
use policy_host::contract::app_call::Response;
use policy_host::contract::{
    Action, CONTRACT_VERSION, Capability, Child, KindRef, Observation, Timestamp,
};
use policy_host::decide::{Limits, Plugin, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::pack::sha256_hex;
use serde_json::{Value, json};

async fn load(package: &str) -> Plugin {
    let path = policy_host_test_plugins::build(package).expect("plugin builds");
    let bytes = std::fs::read(&path).expect("plugin file readable");
    let loader = PluginLoader::new(Sandbox::new().expect("sandbox"), None);
    let (plugin, _) = loader
        .load(package, &bytes, &sha256_hex(&bytes), Limits::default())
        .await
        .unwrap_or_else(|e| panic!("{package} loads: {e}"));
    plugin
}

fn now() -> Timestamp {
    Timestamp {
        seconds: 1_700_000_000,
        nanoseconds: 0,
    }
}

fn applied(actions: &[Action]) -> Vec<Value> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply(json) => serde_json::from_str(json).ok(),
            _ => None,
        })
        .collect()
}

/// Loads `package`, checks its contract and name, and runs one reconcile whose one app-call is
/// answered by a script: the ConfigMap it applies carries that answer.
async fn decides_with_one_app_call(package: &str, contract: &str, name: &str, suffix: &str) {
    let plugin = load(package).await;
    assert_eq!(plugin.contract_version(), contract);
    assert_eq!(plugin.info().name, name);
    assert_eq!(
        plugin.info().capabilities,
        [Capability::AppCall("http".into())]
    );

    let script = AppCallScript::new([(
        "app-0".to_string(),
        "/v1".to_string(),
        Ok(Response {
            status: 200,
            body: "hello".into(),
        }),
    )]);
    let observation = Observation {
        parent: json!({"apiVersion": "test.policy-host.io/v1", "kind": "Probe",
            "metadata": {"name": "old", "namespace": "default"}})
        .to_string(),
        children: Vec::new(),
        now: now(),
    };
    let decision = plugin
        .reconcile(
            &observation,
            AppCallScope::scripted("default/old".into(), script.clone()),
            "testing",
        )
        .await
        .unwrap_or_else(|e| panic!("the {contract} plugin decides: {e}"));
    let objects = applied(&decision.actions);
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(objects[0]["metadata"]["name"], format!("old-{suffix}"));
    assert_eq!(
        objects[0]["data"]["appCall"], "200 hello",
        "its {contract} app-call import reached the host's app-call scope"
    );
    assert_eq!(script.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_against_0_1_loads_and_decides_unchanged() {
    assert_eq!(CONTRACT_VERSION, "0.2.3");
    decides_with_one_app_call("contract-v0-1-policy", "0.1.0", "legacy-v01", "v01").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_against_0_2_0_loads_and_decides_unchanged() {
    decides_with_one_app_call("contract-v0-2-policy", "0.2.0", "legacy-v020", "v020").await;
}

fn pod(name: &str, ip: &str) -> Child {
    Child {
        kind: KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
            namespaced: true,
        },
        object: json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/instance": "r"}},
            "spec": {"containers": [{"name": "redis", "image": "redis:7.0.15"}]},
            "status": {"phase": "Running", "podIP": ip}})
        .to_string(),
    }
}

fn bulk(text: &str) -> Vec<u8> {
    format!("${}\r\n{text}\r\n", text.len()).into_bytes()
}

fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

fn round(pod: &str, request: Vec<u8>, reply: Vec<u8>) -> ExchangeRound {
    ExchangeRound {
        pod: pod.into(),
        port: None,
        request,
        reply: Ok(reply),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_against_0_2_exchanges_bytes_through_a_scripted_scope() {
    let plugin = load("guest-redis").await;
    assert_eq!(plugin.contract_version(), "0.2.3");
    assert_eq!(
        plugin.info().capabilities,
        [Capability::Exchange("redis".into())]
    );

    let info = command(&["INFO", "replication"]);
    let master = bulk("# Replication\r\nrole:master\r\nmaster_repl_offset:0\r\n");
    let script = AppCallScript::default().with_exchanges([
        round("r-0", info.clone(), master.clone()),
        round("r-1", info.clone(), master.clone()),
        round(
            "r-1",
            command(&["REPLICAOF", "10.0.0.1", "6379"]),
            b"+OK\r\n".to_vec(),
        ),
    ]);
    let observation = Observation {
        parent: json!({"apiVersion": "redis.policy-host.io/v1alpha1", "kind": "RedisReplication",
            "metadata": {"name": "r", "namespace": "default", "generation": 1},
            "spec": {"replicas": 2, "version": "7.0.15"}})
        .to_string(),
        children: vec![pod("r-0", "10.0.0.1"), pod("r-1", "10.0.0.2")],
        now: now(),
    };
    let decision = plugin
        .reconcile(
            &observation,
            AppCallScope::scripted("default/r".into(), script.clone()),
            "testing",
        )
        .await
        .expect("the 0.2 plugin decides");
    let sent: Vec<(String, String)> = script
        .exchanges()
        .into_iter()
        .map(|r| (r.pod, String::from_utf8_lossy(&r.request).into_owned()))
        .collect();
    assert_eq!(
        sent,
        [
            (
                "r-0".to_owned(),
                String::from_utf8_lossy(&info).into_owned()
            ),
            (
                "r-1".to_owned(),
                String::from_utf8_lossy(&info).into_owned()
            ),
            (
                "r-1".to_owned(),
                "*3\r\n$9\r\nREPLICAOF\r\n$8\r\n10.0.0.1\r\n$4\r\n6379\r\n".to_owned()
            ),
        ],
        "INFO to each server, then REPLICAOF to the one that is not the primary"
    );
    let status = decision.actions.iter().find_map(|a| match a {
        Action::SetStatus(json) => serde_json::from_str::<Value>(json).ok(),
        _ => None,
    });
    assert_eq!(
        status.as_ref().map(|s| s["primary"].clone()),
        Some(json!("r-0"))
    );
}
