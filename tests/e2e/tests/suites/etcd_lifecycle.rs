//! The etcd plugin's whole lifecycle on real etcd: scaling up and down, a failed member
//! replaced, host restarts at the crash points of a membership change, and a rolling upgrade
//! across one minor version with a client writing throughout.
//!
//! Every test runs policy-host in-process against the shared control plane, scoped to a
//! namespace of its own, and asserts through a real etcd client (`etcdctl`): the member list,
//! endpoint health, and keys written before a change and read after it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use policy_host::decide::Limits;
use policy_host_e2e::etcd::{
    etcd_clusters, etcd_version, eventually, pod_endpoint, pod_ready, run_etcdctl,
};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::{TestEnv, TestNamespace, shared_node};
use serde_json::{Value, json};

/// How long one membership change (or the creation of a cluster) may take to converge.
const CONVERGE: Duration = Duration::from_secs(150);
/// Name of the EtcdCluster in every test (each test has its own namespace).
const NAME: &str = "lifecycle";
/// Name of the cluster restored from a snapshot of `NAME`.
const RESTORED: &str = "restored";

/// One test's EtcdCluster, its namespace, the host reconciling it and an etcd client.
struct Fixture {
    env: &'static TestEnv,
    /// The EtcdCluster the helpers look at.
    name: String,
    /// When the test started (after the shared environment was up).
    started: Instant,
    client: kube::Client,
    namespace: TestNamespace,
    plugin: PathBuf,
    host: Option<HostUnderTest>,
    clusters: Api<DynamicObject>,
    pods: Api<Pod>,
    etcdctl: PathBuf,
}

impl Fixture {
    /// A namespace, the CRD, the etcd plugin and a host; no cluster yet. `etcdctl_minor`
    /// picks the client version.
    async fn start(prefix: &str, etcdctl_minor: &str) -> anyhow::Result<Fixture> {
        init_logging();
        let env = shared_node().await?;
        let client = env.client().await?;
        install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
        let namespace = env.create_namespace(prefix).await?;
        let plugin =
            policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
        let host = HostUnderTest::start(
            env,
            std::slice::from_ref(&plugin),
            &namespace,
            Limits::default(),
        )
        .await?;
        let version = etcd_version(env, etcdctl_minor)?;
        let etcdctl = policy_host_e2e::apps::etcd_dir(env, &format!("v{version}"))
            .ok_or_else(|| anyhow::anyhow!("etcd {version} is not in the test environment"))?
            .join("etcdctl");
        Ok(Fixture {
            env,
            name: NAME.to_owned(),
            started: Instant::now(),
            clusters: Api::namespaced_with(client.clone(), &namespace, &etcd_clusters()),
            pods: Api::namespaced(client.clone(), &namespace),
            client,
            namespace,
            plugin,
            host: Some(host),
            etcdctl,
        })
    }

    /// Stops the host like a process exit: whatever it was doing is cut short.
    async fn stop_host(&mut self) {
        if let Some(host) = self.host.take() {
            host.stop().await;
        }
    }

    /// Starts a fresh host (no memory of the previous one).
    async fn start_host(&mut self) -> anyhow::Result<()> {
        self.stop_host().await;
        let host = HostUnderTest::start(
            self.env,
            std::slice::from_ref(&self.plugin),
            &self.namespace,
            Limits::default(),
        )
        .await?;
        self.host = Some(host);
        Ok(())
    }

    async fn create_cluster(&self, size: i64, version: &str) -> anyhow::Result<()> {
        self.create_cluster_with(json!({"size": size, "version": version}))
            .await
    }

    async fn create_cluster_with(&self, spec: Value) -> anyhow::Result<()> {
        let cluster = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2",
            "kind": "EtcdCluster",
            "metadata": {"name": self.name},
            "spec": spec,
        });
        self.clusters
            .patch(
                &self.name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&cluster),
            )
            .await?;
        Ok(())
    }

    async fn patch_spec(&self, spec: Value) -> anyhow::Result<()> {
        self.clusters
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await?;
        Ok(())
    }

    async fn cluster(&self) -> Result<Value, String> {
        match self.clusters.get_opt(&self.name).await {
            Ok(Some(object)) => serde_json::to_value(&object).map_err(|e| e.to_string()),
            Ok(None) => Err("the EtcdCluster does not exist".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Member pods that are not being deleted, by name.
    async fn live_pods(&self) -> Result<Vec<Pod>, String> {
        let list = self
            .pods
            .list(&ListParams::default().labels(&format!(
                "app.kubernetes.io/instance={},!etcd.database.coreos.com/role",
                self.name
            )))
            .await
            .map_err(|e| e.to_string())?;
        let mut pods: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// Client endpoints of the member pods that have an IP.
    async fn endpoints(&self) -> Result<Vec<String>, String> {
        Ok(self
            .live_pods()
            .await?
            .iter()
            .filter_map(pod_endpoint)
            .collect())
    }

    async fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        run_etcdctl(&self.etcdctl, endpoints, args).await
    }

    /// The member list as one member sees it (linearizable: through the leader).
    async fn member_list(&self, endpoint: &str) -> Result<Vec<Value>, String> {
        let text = self
            .etcdctl(&[endpoint.to_owned()], &["member", "list", "-w", "json"])
            .await?;
        let list: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        Ok(list["members"].as_array().cloned().unwrap_or_default())
    }

    /// The member list from whichever member answers first.
    async fn any_member_list(&self) -> Result<Vec<Value>, String> {
        let mut errors = Vec::new();
        for endpoint in self.endpoints().await? {
            match self.member_list(&endpoint).await {
                Ok(members) => return Ok(members),
                Err(e) => errors.push(e),
            }
        }
        Err(format!("no member answered: {errors:?}"))
    }

    async fn put(&self, key: &str, value: &str) -> anyhow::Result<()> {
        let endpoints = self.endpoints().await.map_err(anyhow::Error::msg)?;
        self.etcdctl(&endpoints, &["put", key, value])
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(())
    }

    /// Reads `key` through every member, serializably (each member's own copy), so a member
    /// that lost data would show it.
    async fn assert_key_everywhere(&self, key: &str, want: &str) -> anyhow::Result<()> {
        for endpoint in self.endpoints().await.map_err(anyhow::Error::msg)? {
            let got = self
                .etcdctl(
                    std::slice::from_ref(&endpoint),
                    &["get", key, "--print-value-only", "--consistency=s"],
                )
                .await
                .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(
                got.trim() == want,
                "{key} through {endpoint}: {got:?}, want {want:?}"
            );
        }
        Ok(())
    }

    /// Waits until the cluster has exactly `size` members, as the status, the pods and etcd
    /// itself all agree: status `size/size` Ready and Running for the current generation;
    /// exactly `size` live pods, Ready; every member started, a voter, named after one of
    /// those pods, seen alike from every member; every endpoint healthy. Returns the member
    /// list.
    async fn wait_converged(&self, size: usize) -> anyhow::Result<Vec<Value>> {
        let started = Instant::now();
        let members = eventually(
            &format!(
                "{}/{} to converge to {size} members",
                self.namespace, self.name
            ),
            CONVERGE,
            || async {
                let cluster = self.cluster().await?;
                let status = &cluster["status"];
                let ready = format!("{size}/{size}");
                if status["ready"] != json!(ready)
                    || status["phase"] != json!("Running")
                    || status["observedGeneration"] != cluster["metadata"]["generation"]
                    || status["etcdMembers"].as_array().map(Vec::len) != Some(size)
                {
                    return Err(format!("status: {status}"));
                }
                let pods = self.live_pods().await?;
                let names: BTreeSet<String> = pods
                    .iter()
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                if pods.len() != size || !pods.iter().all(pod_ready) {
                    return Err(format!("pods: {names:?}, not all Ready or not {size}"));
                }
                let endpoints: Vec<String> = pods.iter().filter_map(pod_endpoint).collect();
                if endpoints.len() != size {
                    return Err(format!("pods without an IP: {names:?}"));
                }
                let mut seen: Option<(BTreeSet<String>, Vec<Value>)> = None;
                for endpoint in &endpoints {
                    let members = self.member_list(endpoint).await?;
                    let member_names: BTreeSet<String> = members
                        .iter()
                        .filter_map(|m| m["name"].as_str().map(str::to_owned))
                        .collect();
                    if members.len() != size
                        || member_names != names
                        || members.iter().any(|m| m["isLearner"] == json!(true))
                    {
                        return Err(format!(
                            "member list from {endpoint}: {members:?}; pods {names:?}"
                        ));
                    }
                    let ids = member_ids(&members);
                    if let Some((other, _)) = &seen
                        && other != &ids
                    {
                        return Err(format!("members disagree: {other:?} vs {ids:?}"));
                    }
                    let health = self
                        .etcdctl(std::slice::from_ref(endpoint), &["endpoint", "health"])
                        .await?;
                    if !health.contains("is healthy") {
                        return Err(health);
                    }
                    seen = Some((ids, members));
                }
                seen.map(|(_, members)| members)
                    .ok_or_else(|| "no member".to_owned())
            },
        )
        .await?;
        eprintln!(
            "[{}] converged to {size} members in {:.1} s",
            self.namespace,
            started.elapsed().as_secs_f64()
        );
        Ok(members)
    }

    /// The status condition of this type, once it has these status and reason.
    async fn wait_condition(
        &self,
        type_: &str,
        status: &str,
        reason: &str,
    ) -> anyhow::Result<Value> {
        eventually(
            &format!("condition {type_}={status} ({reason})"),
            CONVERGE,
            || async {
                let cluster = self.cluster().await?;
                let conditions = cluster["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                conditions
                    .iter()
                    .find(|c| {
                        c["type"] == json!(type_)
                            && c["status"] == json!(status)
                            && c["reason"] == json!(reason)
                    })
                    .cloned()
                    .ok_or_else(|| format!("conditions: {conditions:?}"))
            },
        )
        .await
    }

    /// Member pod logs, for a failing test's output.
    async fn dump(&self) {
        if let Ok(cluster) = self.cluster().await {
            eprintln!(
                "[{}] EtcdCluster status: {}",
                self.namespace, cluster["status"]
            );
        }
        if let Ok(pods) = self.live_pods().await {
            for pod in pods {
                let name = pod.metadata.name.unwrap_or_default();
                let logs = self.env.pod_logs(&self.namespace, &name).await;
                let tail: Vec<&str> = logs.lines().rev().take(15).collect();
                eprintln!(
                    "[{}] {name} last log lines (newest first):\n{}",
                    self.namespace,
                    tail.join("\n")
                );
            }
        }
    }

    async fn finish(mut self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        if outcome.is_err() {
            self.dump().await;
        }
        eprintln!(
            "[{}] test took {:.1} s",
            self.namespace,
            self.started.elapsed().as_secs_f64()
        );
        self.stop_host().await;
        let _ = self
            .clusters
            .delete(&self.name, &DeleteParams::background())
            .await;
        outcome
    }
}

fn member_ids(members: &[Value]) -> BTreeSet<String> {
    members.iter().map(|m| m["ID"].to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_3_5_3_1_3_keeps_the_data() -> anyhow::Result<()> {
    let fixture = Fixture::start("etcd-scale", "3.6").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture.create_cluster(3, &version).await?;
        fixture.wait_converged(3).await?;
        fixture.put("before-scaling", "kept").await?;
        for (step, size) in [5usize, 3, 1, 3].into_iter().enumerate() {
            fixture.patch_spec(json!({"size": size})).await?;
            fixture.wait_converged(size).await?;
            fixture
                .assert_key_everywhere("before-scaling", "kept")
                .await?;
            for earlier in 0..step {
                fixture
                    .assert_key_everywhere(&format!("step-{earlier}"), "kept")
                    .await?;
            }
            fixture.put(&format!("step-{step}"), "kept").await?;
        }
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_member_is_replaced_and_a_crashed_one_restarts() -> anyhow::Result<()> {
    let fixture = Fixture::start("etcd-replace", "3.6").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture.create_cluster(3, &version).await?;
        let before = fixture.wait_converged(3).await?;
        fixture.put("survivor", "yes").await?;
        let victim = format!("{NAME}-1");

        // A crash with restartPolicy Always: the process comes back on its data directory
        // and is the same member.
        fixture.env.kill_pod(&fixture.namespace, &victim).await?;
        eventually("the killed member to restart", CONVERGE, || async {
            let pod = fixture.pods.get(&victim).await.map_err(|e| e.to_string())?;
            let restarts = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map_or(0, |c| c.restart_count);
            (restarts > 0 && pod_ready(&pod))
                .then_some(())
                .ok_or(format!("restarts {restarts}"))
        })
        .await?;
        let after_crash = fixture.wait_converged(3).await?;
        assert_eq!(
            member_ids(&after_crash),
            member_ids(&before),
            "a restarted member keeps its identity"
        );

        // The pod fails for good: its member (emptyDir, data gone with the pod) is removed
        // and a fresh member replaces it.
        let victim_id = before
            .iter()
            .find(|m| m["name"] == json!(victim))
            .map(|m| m["ID"].to_string())
            .ok_or_else(|| anyhow::anyhow!("{victim} is not a member: {before:?}"))?;
        fixture.env.fail_pod(&fixture.namespace, &victim).await?;
        eventually("the failed member to leave etcd", CONVERGE, || async {
            let members = fixture.any_member_list().await?;
            (!member_ids(&members).contains(&victim_id))
                .then_some(())
                .ok_or(format!("{members:?}"))
        })
        .await?;
        let after = fixture.wait_converged(3).await?;
        let ids = member_ids(&after);
        assert!(
            !ids.contains(&victim_id),
            "the failed member is gone: {after:?}"
        );
        assert_eq!(
            ids.intersection(&member_ids(&before)).count(),
            2,
            "two original members remain"
        );
        fixture.assert_key_everywhere("survivor", "yes").await?;
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}

/// A cluster-scoped ValidatingAdmissionPolicy that refuses `operation` on Pods in one
/// namespace: the host's write at a crash point fails, exactly as if it had stopped there.
struct PodWriteBlock {
    policies: Api<DynamicObject>,
    bindings: Api<DynamicObject>,
    name: String,
}

impl PodWriteBlock {
    async fn install(fixture: &Fixture, operation: &str) -> anyhow::Result<PodWriteBlock> {
        let resource = |kind: &str, plural: &str| {
            ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
                plural,
            )
        };
        let policies: Api<DynamicObject> = Api::all_with(
            fixture.client.clone(),
            &resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
        );
        let bindings: Api<DynamicObject> = Api::all_with(
            fixture.client.clone(),
            &resource(
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
            ),
        );
        let name = format!(
            "{}-block-pod-{}",
            fixture.namespace,
            operation.to_lowercase()
        );
        let selector =
            json!({"matchLabels": {"kubernetes.io/metadata.name": fixture.namespace.name()}});
        let policy = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "namespaceSelector": selector,
                    "resourceRules": [{
                        "apiGroups": [""], "apiVersions": ["v1"],
                        "operations": [operation], "resources": ["pods"],
                    }],
                },
                "validations": [{
                    "expression": "false",
                    "message": "e2e fault injection: this pod write is refused, as if the host had stopped before it",
                }],
            },
        });
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": selector},
            },
        });
        let apply = PatchParams::apply("e2e").force();
        policies
            .patch(&name, &apply, &Patch::Apply(&policy))
            .await?;
        bindings
            .patch(&name, &apply, &Patch::Apply(&binding))
            .await?;
        Ok(PodWriteBlock {
            policies,
            bindings,
            name,
        })
    }

    async fn remove(self) -> anyhow::Result<()> {
        self.bindings
            .delete(&self.name, &DeleteParams::default())
            .await?;
        self.policies
            .delete(&self.name, &DeleteParams::default())
            .await?;
        Ok(())
    }
}

/// Whether the API server refuses a dry-run write: a policy becomes active a moment after it
/// is created, and the fault must be in place before the host acts.
fn refused(result: Result<(), kube::Error>) -> Result<(), String> {
    match result {
        Err(kube::Error::Api(status)) if status.message.contains("e2e fault injection") => Ok(()),
        Err(e) => Err(format!("not refused by the policy yet: {e}")),
        Ok(()) => Err("not refused yet".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_restarts_at_the_crash_points_of_scaling_converge() -> anyhow::Result<()> {
    let mut fixture = Fixture::start("etcd-restart", "3.6").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture.create_cluster(1, &version).await?;
        fixture.wait_converged(1).await?;
        fixture.put("through-restarts", "kept").await?;

        // Scale up, crash point "member added, pod not created": pod creation is refused,
        // so the host's reconcile stops right after `member add`.
        let block = PodWriteBlock::install(&fixture, "CREATE").await?;
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let probe: Pod = serde_json::from_value(json!({
            "metadata": {"name": "e2e-probe"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }))?;
        eventually(
            "the pod-create block to be active",
            Duration::from_secs(60),
            || async { refused(fixture.pods.create(&dry_run, &probe).await.map(|_| ())) },
        )
        .await?;
        fixture.patch_spec(json!({"size": 3})).await?;
        let added = eventually("member add to be observed in etcd", CONVERGE, || async {
            let members = fixture.any_member_list().await?;
            (members.len() == 2)
                .then_some(members.clone())
                .ok_or(format!("{members:?}"))
        })
        .await?;
        fixture.stop_host().await;
        let pods = fixture.live_pods().await.map_err(anyhow::Error::msg)?;
        assert_eq!(pods.len(), 1, "the new member's pod was not created");
        assert!(
            added.iter().any(|m| m["isLearner"] == json!(true)
                && m["name"].as_str().unwrap_or_default().is_empty()),
            "the new member is an unstarted learner: {added:?}"
        );
        block.remove().await?;
        fixture.start_host().await?;
        let grown = fixture.wait_converged(3).await?;
        let added_id = added
            .iter()
            .find(|m| m["name"].as_str().unwrap_or_default().is_empty())
            .map(|m| m["ID"].to_string())
            .unwrap_or_default();
        assert!(
            member_ids(&grown).contains(&added_id),
            "the member added before the restart got its pod, no second member was added: {grown:?}"
        );
        fixture
            .assert_key_everywhere("through-restarts", "kept")
            .await?;

        // Scale down, crash point "member removed, pod not deleted": pod deletion is refused,
        // so the host's reconcile stops right after `member remove`.
        let block = PodWriteBlock::install(&fixture, "DELETE").await?;
        let victim = format!("{NAME}-2");
        let dry_delete = DeleteParams {
            dry_run: true,
            ..DeleteParams::default()
        };
        eventually(
            "the pod-delete block to be active",
            Duration::from_secs(60),
            || async { refused(fixture.pods.delete(&victim, &dry_delete).await.map(|_| ())) },
        )
        .await?;
        fixture.patch_spec(json!({"size": 1})).await?;
        let removed = eventually("member remove to be observed in etcd", CONVERGE, || async {
            let members = fixture.any_member_list().await?;
            (members.len() == 2)
                .then_some(members.clone())
                .ok_or(format!("{members:?}"))
        })
        .await?;
        fixture.stop_host().await;
        let pods = fixture.live_pods().await.map_err(anyhow::Error::msg)?;
        assert_eq!(
            pods.len(),
            3,
            "the removed member's pod is still there: {removed:?}"
        );
        block.remove().await?;
        fixture.start_host().await?;
        let shrunk = fixture.wait_converged(1).await?;
        assert!(
            member_ids(&shrunk).is_subset(&member_ids(&removed)),
            "no member was added while shrinking: {shrunk:?}"
        );
        fixture
            .assert_key_everywhere("through-restarts", "kept")
            .await?;
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}

/// Writes `writer-<n>` keys one after another through every endpoint until stopped, and
/// returns the keys etcd acknowledged.
async fn write_continuously(
    etcdctl: PathBuf,
    endpoints: Vec<String>,
    stop: Arc<AtomicBool>,
) -> (Vec<String>, usize) {
    let mut acknowledged = Vec::new();
    let mut failures = 0;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("writer-{n:06}");
        match run_etcdctl(&etcdctl, &endpoints, &["put", &key, "v"]).await {
            Ok(_) => {
                acknowledged.push(key);
                n += 1;
            }
            Err(_) => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    (acknowledged, failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_one_minor_loses_no_write_and_refuses_two() -> anyhow::Result<()> {
    let fixture = Fixture::start("etcd-upgrade", "3.5").await?;
    let outcome = async {
        let old = etcd_version(fixture.env, "3.5")?;
        let new = etcd_version(fixture.env, "3.6")?;
        // Scheduling settings ride along: an in-place upgrade must re-apply them unchanged.
        fixture
            .create_cluster_with(json!({
                "size": 3, "version": old,
                "pod": {
                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "etcd", "effect": "NoSchedule"}],
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": NAME}},
                        },
                    }]}},
                },
            }))
            .await?;
        fixture.wait_converged(3).await?;
        fixture.put("before-upgrade", "kept").await?;

        // Two minors at once (3.5 → 3.7) is refused, and nothing is touched.
        fixture.patch_spec(json!({"version": "3.7.0"})).await?;
        let refused = fixture
            .wait_condition("Degraded", "True", "InvalidSpec")
            .await?;
        assert!(
            refused["message"]
                .as_str()
                .is_some_and(|m| m.contains("3.7")),
            "the condition names the version: {refused}"
        );
        let images: Vec<String> = fixture
            .live_pods()
            .await
            .map_err(anyhow::Error::msg)?
            .iter()
            .filter_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
            .collect();
        assert!(
            images.iter().all(|i| i.ends_with(&format!(":v{old}"))),
            "{images:?}"
        );

        // One minor: every member restarted on the new version, leader last, while a client
        // keeps writing.
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn(write_continuously(
            fixture.etcdctl.clone(),
            endpoints.clone(),
            stop.clone(),
        ));
        fixture.patch_spec(json!({"version": new})).await?;
        let started = Instant::now();
        eventually(
            &format!("every member to run etcd {new}"),
            Duration::from_secs(240),
            || async {
                let cluster = fixture.cluster().await?;
                let status = &cluster["status"];
                if status["currentVersion"] != json!(new) || status["phase"] != json!("Running") {
                    return Err(format!("status: {status}"));
                }
                for endpoint in fixture.endpoints().await? {
                    let text = fixture
                        .etcdctl(
                            std::slice::from_ref(&endpoint),
                            &["endpoint", "status", "-w", "json"],
                        )
                        .await?;
                    if !text.contains(&format!("\"version\":\"{new}\"")) {
                        return Err(format!("{endpoint}: {text}"));
                    }
                }
                Ok(())
            },
        )
        .await?;
        eprintln!(
            "[{}] upgraded to {new} in {:.1} s",
            fixture.namespace,
            started.elapsed().as_secs_f64()
        );
        fixture.wait_converged(3).await?;
        stop.store(true, Ordering::Relaxed);
        let (acknowledged, failures) = writer.await?;
        eprintln!(
            "[{}] writer: {} writes acknowledged, {failures} failed attempts during the upgrade",
            fixture.namespace,
            acknowledged.len()
        );
        anyhow::ensure!(
            acknowledged.len() > 10,
            "the writer kept writing: {}",
            acknowledged.len()
        );
        let keys = fixture
            .etcdctl(&endpoints, &["get", "writer-", "--prefix", "--keys-only"])
            .await
            .map_err(anyhow::Error::msg)?;
        let stored: BTreeSet<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
        let lost: Vec<&String> = acknowledged
            .iter()
            .filter(|k| !stored.contains(k.as_str()))
            .collect();
        assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
        fixture
            .assert_key_everywhere("before-upgrade", "kept")
            .await?;

        // One restart per member, each named in its own Event, and leadership moved away
        // from the leader before it restarted.
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(fixture.client.clone(), &fixture.namespace);
        eventually("the upgrade's Events", Duration::from_secs(30), || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let notes = |reason: &str| -> Vec<String> {
                list.items
                    .iter()
                    .filter(|e| {
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NAME)
                            && e.reason.as_deref() == Some(reason)
                    })
                    .filter_map(|e| e.note.clone())
                    .collect()
            };
            // "restarting member <pod> with image <image>"
            let restarted: BTreeSet<String> = notes("MemberUpgrading")
                .iter()
                .filter_map(|n| n.split_whitespace().nth(2).map(str::to_owned))
                .collect();
            let moved = notes("LeaderMoved");
            (restarted.len() == 3 && !moved.is_empty())
                .then_some(())
                .ok_or(format!("restarted {restarted:?}, leader moves {moved:?}"))
        })
        .await?;

        // Back down a minor is refused too.
        fixture.patch_spec(json!({"version": old})).await?;
        fixture
            .wait_condition("Degraded", "True", "DowngradeNotSupported")
            .await?;
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_into_a_new_cluster() -> anyhow::Result<()> {
    let mut fixture = Fixture::start("etcd-backup", "3.6").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture
            .create_cluster_with(json!({
                "size": 3, "version": version, "backup": {"storage": {"size": "1Gi"}},
            }))
            .await?;
        fixture.wait_converged(3).await?;
        fixture.put("in-the-snapshot", "yes").await?;

        fixture
            .patch_spec(json!({"backup": {"trigger": "first"}}))
            .await?;
        let backup = eventually("the snapshot to succeed", CONVERGE, || async {
            let cluster = fixture.cluster().await?;
            let backup = cluster["status"]["backup"].clone();
            (backup["trigger"] == json!("first") && backup["phase"] == json!("Succeeded"))
                .then_some(backup.clone())
                .ok_or(format!("status.backup: {backup}"))
        })
        .await?;
        let snapshot = backup["lastSnapshot"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no lastSnapshot: {backup}"))?
            .to_owned();
        assert!(backup["lastSuccessTime"].is_string(), "{backup}");
        let file = fixture
            .env
            .claim_dir(&fixture.namespace, &format!("backup-{NAME}"))
            .await?
            .join(&snapshot);
        let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        assert!(size > 0, "{} holds the snapshot", file.display());
        fixture.put("after-the-snapshot", "yes").await?;

        // A new cluster from that snapshot: its keys are there, later writes are not.
        fixture.name = RESTORED.to_owned();
        fixture
            .create_cluster_with(json!({
                "size": 3, "version": version,
                "restore": {"claimName": format!("backup-{NAME}"), "snapshot": snapshot},
            }))
            .await?;
        let members = fixture.wait_converged(3).await?;
        fixture
            .assert_key_everywhere("in-the-snapshot", "yes")
            .await?;
        fixture
            .assert_key_everywhere("after-the-snapshot", "")
            .await?;
        let original = fixture.clusters.get(NAME).await?;
        let restored = fixture.cluster().await.map_err(anyhow::Error::msg)?;
        assert_ne!(
            restored["status"]["clusterID"],
            serde_json::to_value(&original)?["status"]["clusterID"],
            "a new cluster, not a member of the old one: {members:?}"
        );
        fixture
            .clusters
            .delete(NAME, &DeleteParams::background())
            .await?;
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_is_reported_and_recovered_from_the_last_snapshot() -> anyhow::Result<()> {
    let fixture = Fixture::start("etcd-quorum", "3.6").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture
            .create_cluster_with(json!({
                "size": 3, "version": version,
                "backup": {"storage": {"size": "1Gi"}, "restoreOnQuorumLoss": true},
            }))
            .await?;
        let before = fixture.wait_converged(3).await?;
        fixture.put("in-the-snapshot", "yes").await?;
        fixture
            .patch_spec(json!({"backup": {"trigger": "before-the-loss"}}))
            .await?;
        eventually("the snapshot to succeed", CONVERGE, || async {
            let cluster = fixture.cluster().await?;
            let backup = cluster["status"]["backup"].clone();
            (backup["phase"] == json!("Succeeded"))
                .then_some(())
                .ok_or(format!("status.backup: {backup}"))
        })
        .await?;
        let old_cluster_id =
            fixture.cluster().await.map_err(anyhow::Error::msg)?["status"]["clusterID"].clone();

        // Two of three members fail for good at once, with their emptyDir data: no quorum,
        // ever. (One after the other, the first would be removed from a still-quorate
        // cluster.)
        let (first, second) = (format!("{NAME}-1"), format!("{NAME}-2"));
        let (first, second) = tokio::join!(
            fixture.env.fail_pod(&fixture.namespace, &first),
            fixture.env.fail_pod(&fixture.namespace, &second),
        );
        first?;
        second?;
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(fixture.client.clone(), &fixture.namespace);
        let reported = eventually("a QuorumLost Warning event", CONVERGE, || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("QuorumLost")
                        && e.type_.as_deref() == Some("Warning")
                })
                .and_then(|e| e.note)
                .ok_or("no QuorumLost event yet".to_owned())
        })
        .await?;
        assert!(reported.contains("2 of 3"), "{reported}");

        // Back from the snapshot: a new cluster of 3, the snapshot's keys in it.
        let after = fixture.wait_converged(3).await?;
        let cluster = fixture.cluster().await.map_err(anyhow::Error::msg)?;
        assert_ne!(
            cluster["status"]["clusterID"], old_cluster_id,
            "a new cluster"
        );
        assert!(
            member_ids(&after).is_disjoint(&member_ids(&before)),
            "every member is new: {after:?}"
        );
        assert!(
            cluster["status"].get("restoring").is_none(),
            "{}",
            cluster["status"]
        );
        fixture
            .assert_key_everywhere("in-the-snapshot", "yes")
            .await?;
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_member_is_replaced() -> anyhow::Result<()> {
    let mut fixture = Fixture::start("etcd-crashloop", "3.6").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture.create_cluster(3, &version).await?;
        let before = fixture.wait_converged(3).await?;
        fixture.put("survivor", "yes").await?;
        let victim = format!("{NAME}-2");
        let victim_id = before
            .iter()
            .find(|m| m["name"] == json!(victim))
            .map(|m| m["ID"].to_string())
            .ok_or_else(|| anyhow::anyhow!("{victim} is not a member: {before:?}"))?;

        // Its etcd keeps dying at start and never becomes Ready: the container runs the
        // previous minor's etcd, which exits on the newer cluster's data (a downgrade). The
        // plugin replaces it once it has crash-looped, not Ready, for CRASH_LOOP_SECONDS (two
        // minutes), not after a few restarts. The image is changed while the host is stopped:
        // a running host would see a Ready member on another image and restart it on the
        // spec's, as in an upgrade.
        fixture.stop_host().await;
        let older = etcd_version(fixture.env, "3.5")?;
        let running = fixture.pods.get(&victim).await?;
        let repository = running
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.as_deref())
            .and_then(|image| image.rsplit_once(':'))
            .map(|(repository, _)| repository.to_owned())
            .ok_or_else(|| anyhow::anyhow!("{victim} has no tagged etcd image"))?;
        fixture
            .pods
            .patch(
                &victim,
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {"containers": [{
                    "name": "etcd",
                    "image": format!("{repository}:v{older}"),
                }]}})),
            )
            .await?;
        eventually(&format!("{victim} to crash-loop"), CONVERGE, || async {
            let pod = fixture.pods.get(&victim).await.map_err(|e| e.to_string())?;
            let status = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .cloned()
                .ok_or("no container status")?;
            let waiting = status
                .state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.clone());
            (waiting.as_deref() == Some("CrashLoopBackOff") && !pod_ready(&pod))
                .then_some(())
                .ok_or(format!(
                    "restarts {}, waiting {waiting:?}",
                    status.restart_count
                ))
        })
        .await?;
        fixture.start_host().await?;
        eventually(
            "the crash-looping member to leave etcd",
            CONVERGE + Duration::from_secs(120),
            || async {
                let members = fixture.any_member_list().await?;
                (!member_ids(&members).contains(&victim_id))
                    .then_some(())
                    .ok_or(format!("{members:?}"))
            },
        )
        .await?;
        let after = fixture.wait_converged(3).await?;
        assert!(!member_ids(&after).contains(&victim_id), "{after:?}");
        fixture.assert_key_everywhere("survivor", "yes").await?;
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(fixture.client.clone(), &fixture.namespace);
        let list = events.list(&ListParams::default()).await?;
        assert!(
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("MemberCrashLooping")),
            "a MemberCrashLooping Warning"
        );
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}

/// Issue 24: a learner whose pod was created to join a membership that changed before it
/// started. Built by hand, with the host stopped, in the order the fault run produced it:
/// `member add` of learner `-4`, a member's pod deleted (grace 0) and that member removed, and
/// `-4`'s pod created with the `--initial-cluster` of the earlier membership. etcd refuses to
/// start it ("member count is unequal"), so it crash-loops as an unstarted learner; the host,
/// started again, removes it from etcd (a learner: quorum untouched) and adds a fresh member,
/// and the cluster heals to its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_whose_pod_joined_a_stale_membership_is_replaced() -> anyhow::Result<()> {
    let mut fixture = Fixture::start("etcd-stale-learner", "3.5").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.5")?;
        fixture.create_cluster(3, &version).await?;
        let before = fixture.wait_converged(3).await?;
        fixture.put("survivor", "yes").await?;
        fixture.stop_host().await;

        let peer_url = |pod: &str| format!("http://{pod}.{NAME}.{}.svc:2380", fixture.namespace);
        let (learner, lost) = (format!("{NAME}-4"), format!("{NAME}-2"));
        // etcd refuses a member add until the member asked has been connected to every voter
        // for 5 s: retried until it is in the list (an add that timed out may have landed).
        eventually(&format!("learner {learner} added"), CONVERGE, || async {
            let members = fixture.any_member_list().await?;
            if members
                .iter()
                .any(|m| m["peerURLs"][0] == json!(peer_url(&learner)))
            {
                return Ok(());
            }
            let endpoints = fixture.endpoints().await?;
            fixture
                .etcdctl(
                    &endpoints,
                    &[
                        "member",
                        "add",
                        &learner,
                        "--learner",
                        "--peer-urls",
                        &peer_url(&learner),
                    ],
                )
                .await
                .map(|_| ())
        })
        .await?;
        // A member's pod deleted at once (its emptyDir data with it), and the member removed,
        // as the plugin removes a lost member.
        let template = fixture.pods.get(&lost).await?;
        let lost_id = before
            .iter()
            .find(|m| m["name"] == json!(lost))
            .and_then(|m| m["ID"].as_u64())
            .ok_or_else(|| anyhow::anyhow!("{lost} is not a member: {before:?}"))?;
        fixture
            .pods
            .delete(
                &lost,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await?;
        eventually(&format!("member {lost} removed"), CONVERGE, || async {
            let members = fixture.any_member_list().await?;
            if !members.iter().any(|m| m["ID"].as_u64() == Some(lost_id)) {
                return Ok(());
            }
            let endpoints = fixture.endpoints().await?;
            fixture
                .etcdctl(&endpoints, &["member", "remove", &format!("{lost_id:x}")])
                .await
                .map(|_| ())
        })
        .await?;

        // The learner's pod as the plugin created it before the member was removed: the
        // lost member's pod with the learner's name, joining the old membership.
        let mut pod = serde_json::to_value(&template)?;
        let initial = [0, 1, 2, 4]
            .map(|n| format!("{NAME}-{n}={}", peer_url(&format!("{NAME}-{n}"))))
            .join(",");
        let args: Vec<String> = pod["spec"]["containers"][0]["args"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .map(|a| {
                if a.starts_with("--initial-cluster=") {
                    format!("--initial-cluster={initial}")
                } else {
                    a.replace(&lost, &learner)
                }
            })
            .collect();
        pod["spec"]["containers"][0]["args"] = json!(args);
        pod["spec"]["hostname"] = json!(learner);
        if let Some(spec) = pod["spec"].as_object_mut() {
            spec.remove("nodeName");
        }
        pod["metadata"] = json!({
            "name": learner,
            "labels": pod["metadata"]["labels"],
            "ownerReferences": pod["metadata"]["ownerReferences"],
        });
        pod["metadata"]["labels"]["etcd.database.coreos.com/member"] = json!(learner);
        if let Some(object) = pod.as_object_mut() {
            object.remove("status");
        }
        let pod: Pod = serde_json::from_value(pod)?;
        fixture.pods.create(&PostParams::default(), &pod).await?;
        eventually("the stale learner's etcd to exit", CONVERGE, || async {
            let pod = fixture
                .pods
                .get(&learner)
                .await
                .map_err(|e| e.to_string())?;
            let restarts = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map_or(0, |c| c.restart_count);
            (restarts > 0)
                .then_some(())
                .ok_or(format!("restarts {restarts}"))
        })
        .await?;
        let logs = fixture.env.pod_logs(&fixture.namespace, &learner).await;
        assert!(
            logs.contains("member count is unequal"),
            "etcd refuses the stale initial cluster: {logs}"
        );
        let stuck = fixture
            .any_member_list()
            .await
            .map_err(anyhow::Error::msg)?;
        let learner_id = stuck
            .iter()
            .find(|m| m["isLearner"] == json!(true))
            .map(|m| m["ID"].to_string())
            .ok_or_else(|| anyhow::anyhow!("no learner: {stuck:?}"))?;

        fixture.start_host().await?;
        let after = fixture.wait_converged(3).await?;
        assert!(
            !member_ids(&after).contains(&learner_id),
            "the stale learner was removed: {after:?}"
        );
        assert_eq!(
            member_ids(&after)
                .intersection(&member_ids(&before))
                .count(),
            2,
            "both surviving voters kept: {after:?}"
        );
        fixture.assert_key_everywhere("survivor", "yes").await?;
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(fixture.client.clone(), &fixture.namespace);
        let list = events.list(&ListParams::default()).await?;
        assert!(
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("LearnerRemoved")),
            "a LearnerRemoved Warning"
        );
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}
