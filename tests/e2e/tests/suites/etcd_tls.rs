//! A TLS etcd cluster on real etcd: members serve their peer and client ports with
//! certificates from Secrets and require client certificates on both; the host reaches them
//! through `call-tls` with the operator's certificate (read from a Secret it never hands to the
//! plugin, checking each member's certificate for its DNS name), and manages the cluster:
//! bootstrap, a learner joining and promoted, a member removed, data kept throughout.
//!
//! Asserted through a real etcd client (`etcdctl` with the operator's certificate): member list,
//! endpoint health, keys; that neither plain HTTP nor TLS without a client certificate gets an
//! answer; and that a snapshot is saved and verified over TLS, its hashKV the live one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host_e2e::etcd::{etcd_clusters, etcd_version, eventually, run_etcdctl};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::shared_node;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    SanType,
};
use serde_json::{Value, json};

/// How long bootstrap or one membership change may take.
const CONVERGE: Duration = Duration::from_secs(150);
const NAME: &str = "secure";

/// PEM files of one test CA: the members' certificate and the operator's client certificate.
struct Certificates {
    dir: PathBuf,
    ca: String,
    member: (String, String),
    operator: (String, String),
}

impl Certificates {
    /// A CA; a member certificate valid for every member's DNS name (server and client use:
    /// members present it to each other); an operator client certificate.
    fn new(namespace: &str, dir: PathBuf) -> anyhow::Result<Self> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

        let mut member = CertificateParams::new(vec![
            format!("*.{NAME}.{namespace}.svc"),
            format!("*.{NAME}.{namespace}.svc.cluster.local"),
        ])?;
        // etcd checks a peer's client certificate against the address the peer connects
        // from. Here every pod shares the machine's network namespace, so peers connect from
        // 127.0.0.1; in a cluster they connect from their pod IP, whose reverse DNS name the
        // wildcard covers.
        member
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse()?));
        member.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let member_key = KeyPair::generate()?;
        let member_cert = member.signed_by(&member_key, &ca)?;

        let mut operator = CertificateParams::new(Vec::<String>::new())?;
        operator.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let operator_key = KeyPair::generate()?;
        let operator_cert = operator.signed_by(&operator_key, &ca)?;

        let certificates = Certificates {
            dir,
            ca: ca.pem(),
            member: (member_cert.pem(), member_key.serialize_pem()),
            operator: (operator_cert.pem(), operator_key.serialize_pem()),
        };
        std::fs::create_dir_all(&certificates.dir)?;
        for (file, text) in [
            ("ca.crt", &certificates.ca),
            ("operator.crt", &certificates.operator.0),
            ("operator.key", &certificates.operator.1),
        ] {
            std::fs::write(certificates.dir.join(file), text)?;
        }
        Ok(certificates)
    }

    fn secret(&self, name: &str, (cert, key): &(String, String)) -> Secret {
        let data = BTreeMap::from(
            [("ca.crt", &self.ca), ("tls.crt", cert), ("tls.key", key)]
                .map(|(k, v)| (k.to_owned(), ByteString(v.clone().into_bytes()))),
        );
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                // Opted in for the etcd plugin's pods (its members and backup pods mount it).
                labels: Some(BTreeMap::from([(
                    "mountable-by.policy-host.io/etcd".to_owned(),
                    "true".to_owned(),
                )])),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(data),
            ..Default::default()
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

struct Fixture {
    namespace: String,
    clusters: Api<DynamicObject>,
    pods: Api<Pod>,
    etcdctl: PathBuf,
    certificates: Certificates,
}

impl Fixture {
    async fn cluster(&self) -> Result<Value, String> {
        match self.clusters.get_opt(NAME).await {
            Ok(Some(object)) => serde_json::to_value(&object).map_err(|e| e.to_string()),
            Ok(None) => Err("the EtcdCluster does not exist".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// `https://<pod IP>:2379` of every live member pod, and the pods' names.
    async fn endpoints(&self) -> Result<(Vec<String>, Vec<String>), String> {
        let list = self
            .pods
            .list(&ListParams::default().labels(&format!(
                "app.kubernetes.io/instance={NAME},!etcd.database.coreos.com/role"
            )))
            .await
            .map_err(|e| e.to_string())?;
        let mut pods: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let names = pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let endpoints = pods
            .iter()
            .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
            .map(|ip| format!("https://{ip}:2379"))
            .collect();
        Ok((endpoints, names))
    }

    /// etcdctl with the operator's client certificate. The test reaches members by pod IP, for
    /// which their certificates are not issued, so it does not check the server's name; the
    /// host's calls, which this test is about, do (by DNS name, through `call-tls`).
    async fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        let tls = [
            format!("--cacert={}", self.certificates.path("ca.crt")),
            format!("--cert={}", self.certificates.path("operator.crt")),
            format!("--key={}", self.certificates.path("operator.key")),
            "--insecure-skip-tls-verify".to_owned(),
        ];
        let all: Vec<&str> = tls
            .iter()
            .map(String::as_str)
            .chain(args.iter().copied())
            .collect();
        run_etcdctl(&self.etcdctl, endpoints, &all).await
    }

    /// Waits until status, pods and etcd agree on `size` started voting members with https
    /// peer URLs, every endpoint healthy over TLS. Returns the member list.
    async fn wait_converged(&self, size: usize) -> anyhow::Result<Vec<Value>> {
        let started = Instant::now();
        let members = eventually(
            &format!("{}/{NAME} to converge to {size} members", self.namespace),
            CONVERGE,
            || async {
                let cluster = self.cluster().await?;
                let status = &cluster["status"];
                if status["ready"] != json!(format!("{size}/{size}"))
                    || status["phase"] != json!("Running")
                    || status["observedGeneration"] != cluster["metadata"]["generation"]
                {
                    return Err(format!("status: {status}"));
                }
                let (endpoints, names) = self.endpoints().await?;
                if endpoints.len() != size {
                    return Err(format!("pods with an IP: {names:?}"));
                }
                let text = self
                    .etcdctl(&endpoints[..1], &["member", "list", "-w", "json"])
                    .await?;
                let list: Value =
                    serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
                let members = list["members"].as_array().cloned().unwrap_or_default();
                let mut member_names: Vec<String> = members
                    .iter()
                    .filter_map(|m| m["name"].as_str().map(str::to_owned))
                    .collect();
                member_names.sort();
                let all_https = members.iter().all(|m| {
                    m["peerURLs"].as_array().is_some_and(|urls| {
                        !urls.is_empty()
                            && urls
                                .iter()
                                .all(|u| u.as_str().is_some_and(|u| u.starts_with("https://")))
                    })
                });
                if member_names != names
                    || members.iter().any(|m| m["isLearner"] == json!(true))
                    || !all_https
                {
                    return Err(format!("members {members:?}; pods {names:?}"));
                }
                let health = self.etcdctl(&endpoints, &["endpoint", "health"]).await?;
                if health.matches("is healthy").count() != size {
                    return Err(health);
                }
                Ok(members)
            },
        )
        .await?;
        eprintln!(
            "[{}] converged to {size} TLS members in {:.1} s",
            self.namespace,
            started.elapsed().as_secs_f64()
        );
        Ok(members)
    }

    async fn put(&self, key: &str, value: &str) -> anyhow::Result<()> {
        let (endpoints, _) = self.endpoints().await.map_err(anyhow::Error::msg)?;
        self.etcdctl(&endpoints, &["put", key, value])
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(())
    }

    /// Reads `key` from every member's own copy (serializable reads).
    async fn assert_key_everywhere(&self, key: &str, want: &str) -> anyhow::Result<()> {
        let (endpoints, _) = self.endpoints().await.map_err(anyhow::Error::msg)?;
        for endpoint in endpoints {
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

    async fn scale(&self, size: usize) -> anyhow::Result<()> {
        self.clusters
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"size": size}})),
            )
            .await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_comes_up_and_the_host_manages_it() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("etcd-tls").await?;
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let host = HostUnderTest::start(
        env,
        std::slice::from_ref(&plugin),
        &namespace,
        Limits::default(),
    )
    .await?;
    let version = etcd_version(env, "3.6")?;
    let etcdctl = policy_host_e2e::apps::etcd_dir(env, &format!("v{version}"))
        .ok_or_else(|| anyhow::anyhow!("etcd {version} is not in the test environment"))?
        .join("etcdctl");
    let certificates = Certificates::new(
        &namespace,
        std::env::temp_dir().join(format!("policy-host-{namespace}-certs")),
    )?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for (name, pair) in [
        ("secure-peer", &certificates.member),
        ("secure-server", &certificates.member),
        ("secure-operator", &certificates.operator),
    ] {
        secrets
            .create(&Default::default(), &certificates.secret(name, pair))
            .await?;
    }
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &etcd_clusters());
    let fixture = Fixture {
        namespace: namespace.to_string(),
        clusters,
        pods: Api::namespaced(client.clone(), &namespace),
        etcdctl,
        certificates,
    };

    let outcome = async {
        let cluster = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2",
            "kind": "EtcdCluster",
            "metadata": {"name": NAME},
            "spec": {
                "size": 3, "version": version,
                "tls": {
                    "peerSecret": "secure-peer",
                    "serverSecret": "secure-server",
                    "operatorSecret": "secure-operator",
                },
            },
        });
        fixture
            .clusters
            .patch(
                NAME,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&cluster),
            )
            .await?;
        fixture.wait_converged(3).await?;
        fixture.put("over-tls", "kept").await?;

        // Nothing answers without TLS, or with TLS but no client certificate.
        let (endpoints, _) = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        let plain: Vec<String> = endpoints
            .iter()
            .map(|e| e.replace("https://", "http://"))
            .collect();
        let refused = run_etcdctl(&fixture.etcdctl, &plain[..1], &["get", "over-tls"]).await;
        anyhow::ensure!(refused.is_err(), "plain HTTP was answered: {refused:?}");
        let ca = format!("--cacert={}", fixture.certificates.path("ca.crt"));
        let refused = run_etcdctl(
            &fixture.etcdctl,
            &endpoints[..1],
            &[&ca, "--insecure-skip-tls-verify", "get", "over-tls"],
        )
        .await;
        anyhow::ensure!(
            refused.is_err(),
            "TLS without a client certificate was answered: {refused:?}"
        );

        // The host manages it: a learner joins and is promoted, then a member is removed; each
        // a member call over TLS.
        fixture.scale(4).await?;
        fixture.wait_converged(4).await?;
        fixture.assert_key_everywhere("over-tls", "kept").await?;
        fixture.scale(3).await?;
        fixture.wait_converged(3).await?;
        fixture.assert_key_everywhere("over-tls", "kept").await?;

        // A snapshot of a TLS cluster: saved with the operator's certificate, verified by the
        // plugin over TLS on the backup pod's throwaway etcd; its hashKV is the live one.
        fixture
            .clusters
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(
                    &json!({"spec": {"backup": {"storage": {"size": "1Gi"}, "trigger": "tls"}}}),
                ),
            )
            .await?;
        let snapshot = eventually("a verified snapshot", CONVERGE, || async {
            let cluster = fixture.cluster().await?;
            let backup = &cluster["status"]["backup"];
            match backup["snapshots"].get(0) {
                Some(s) if backup["phase"] == "Succeeded" && s["hashKV"].is_u64() => Ok(s.clone()),
                _ => Err(format!("status.backup: {backup}")),
            }
        })
        .await?;
        let revision = snapshot["revision"].as_i64().unwrap_or_default();
        let (endpoints, _) = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        let text = fixture
            .etcdctl(
                &endpoints[..1],
                &[
                    "endpoint",
                    "hashkv",
                    &format!("--rev={revision}"),
                    "-w",
                    "json",
                ],
            )
            .await
            .map_err(anyhow::Error::msg)?;
        let live: Value = serde_json::from_str(&text)?;
        anyhow::ensure!(
            live[0]["HashKV"]["hash"].as_u64() == snapshot["hashKV"].as_u64(),
            "snapshot {snapshot} vs live {live}"
        );
        Ok(())
    }
    .await;

    if outcome.is_err() {
        if let Ok(cluster) = fixture.cluster().await {
            eprintln!("[{namespace}] EtcdCluster status: {}", cluster["status"]);
        }
        if let Ok((_, names)) = fixture.endpoints().await {
            for name in names {
                let logs = env.pod_logs(&namespace, &name).await;
                let tail: Vec<&str> = logs.lines().rev().take(15).collect();
                eprintln!("[{namespace}] {name} (newest first):\n{}", tail.join("\n"));
            }
        }
    }
    host.stop().await;
    let _ = fixture
        .clusters
        .delete(NAME, &DeleteParams::background())
        .await;
    let _ = std::fs::remove_dir_all(&fixture.certificates.dir);
    outcome
}
