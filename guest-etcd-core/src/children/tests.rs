//! Tests of the children's names and JSON.

use super::member::with_operator_tls;
use super::*;
use crate::spec::{
    DEFAULT_MC_IMAGE, EtcdClusterSpec, Quantity, RestoreSpec, StorageSpec, TlsSpec, ValidSpec,
};

fn cluster() -> ClusterRef {
    ClusterRef {
        name: "ex".into(),
        namespace: "ns".into(),
        tls: false,
    }
}

fn spec(storage: bool) -> ValidSpec {
    EtcdClusterSpec {
        size: 3,
        version: "3.6.16".into(),
        storage: storage.then(|| StorageSpec {
            size: Quantity("1Gi".into()),
            storage_class_name: None,
        }),
        ..Default::default()
    }
    .validate()
    .expect("valid")
}

#[test]
fn names_round_trip() {
    let c = cluster();
    let cases = [
        ("ex-0", Some(0)),
        ("ex-12", Some(12)),
        ("ex-01", None),
        ("ex-", None),
        ("ex-client", None),
        ("other-1", None),
        ("ex-1-2", None),
    ];
    for (pod, want) in cases {
        assert_eq!(c.member_index(pod), want, "{pod}");
    }
    assert_eq!(
        c.pod_of_peer_url("http://ex-3.ex.ns.svc:2380").as_deref(),
        Some("ex-3")
    );
    assert_eq!(c.pod_of_peer_url("http://ex-3.ex.other.svc:2380"), None);
    assert_eq!(c.pod_of_peer_url("http://10.0.0.1:2380"), None);
    assert_eq!(c.claim_member("data-ex-2").as_deref(), Some("ex-2"));
}

#[test]
fn member_pod_has_the_etcd_flags() {
    let c = cluster();
    let pod = member_pod(
        &c,
        &spec(false),
        &MemberPod {
            name: "ex-1".into(),
            initial_cluster: vec![
                ("ex-0".into(), c.peer_url("ex-0")),
                ("ex-1".into(), c.peer_url("ex-1")),
            ],
            state: ClusterState::Existing,
        },
    );
    let args: Vec<String> =
        serde_json::from_value(pod["spec"]["containers"][0]["args"].clone()).expect("args");
    for want in [
        "--name=ex-1",
        "--listen-client-urls=http://$(POD_IP):2379",
        "--advertise-client-urls=http://ex-1.ex.ns.svc:2379",
        "--initial-cluster=ex-0=http://ex-0.ex.ns.svc:2380,ex-1=http://ex-1.ex.ns.svc:2380",
        "--initial-cluster-state=existing",
        "--initial-cluster-token=ex",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert!(!args.iter().any(|a| a.contains("0.0.0.0")));
    assert_eq!(pod["spec"]["subdomain"], "ex");
    assert_eq!(pod["metadata"]["labels"][LABEL_MEMBER], "ex-1");
    assert_eq!(pod["spec"]["volumes"][0]["emptyDir"], json!({}));
    assert!(pod["metadata"].get("namespace").is_none());
    assert!(pod["metadata"].get("ownerReferences").is_none());
}

#[test]
fn storage_mounts_a_claim_per_member() {
    let c = cluster();
    let s = spec(true);
    let pod = member_pod(
        &c,
        &s,
        &MemberPod {
            name: "ex-0".into(),
            initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
            state: ClusterState::New,
        },
    );
    assert_eq!(
        pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "data-ex-0"
    );
    let claim = member_claim(&c, &s, "ex-0").expect("claim");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
}

#[test]
fn with_image_keeps_everything_but_the_image() {
    let c = cluster();
    let mut pod = member_pod(
        &c,
        &spec(false),
        &MemberPod {
            name: "ex-0".into(),
            initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
            state: ClusterState::New,
        },
    );
    // What admission adds must not be re-applied.
    pod["spec"]["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(json!({"name": "kube-api-access-x", "projected": {}}));
    let upgraded = with_image(
        &pod,
        "repo:v3.6.17",
        &Default::default(),
        &Default::default(),
    )
    .expect("etcd container");
    assert_eq!(upgraded["spec"]["containers"][0]["image"], "repo:v3.6.17");
    assert_eq!(
        upgraded["spec"]["containers"][0]["args"],
        pod["spec"]["containers"][0]["args"]
    );
    assert_eq!(
        upgraded["spec"]["volumes"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(upgraded["metadata"]["labels"], pod["metadata"]["labels"]);
}

#[test]
fn a_restoring_seed_keeps_its_init_container_through_an_upgrade() {
    let c = cluster();
    let s = spec(false);
    let pod = member_pod(
        &c,
        &s,
        &MemberPod {
            name: "ex-0".into(),
            initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
            state: ClusterState::New,
        },
    );
    let restore = RestoreSpec {
        claim_name: "backup-old".into(),
        snapshot: "old-1.db".into(),
        s3: None,
    };
    let restoring = with_restore(pod, &c, &s, &restore);
    assert_eq!(
        restoring["spec"]["initContainers"][0]["command"][0],
        "/usr/local/bin/etcdutl"
    );
    // Init containers of a running pod are immutable: an upgrade re-applies them as
    // they are, with the snapshot's volume.
    let upgraded = with_image(
        &restoring,
        "repo:v3.6.17",
        &Default::default(),
        &Default::default(),
    )
    .expect("etcd container");
    assert_eq!(
        upgraded["spec"]["initContainers"],
        restoring["spec"]["initContainers"]
    );
    assert_eq!(upgraded["spec"]["volumes"], restoring["spec"]["volumes"]);
}

#[test]
fn a_seed_restoring_from_s3_downloads_the_object_then_restores_it() {
    let c = cluster();
    let s = spec(false);
    let pod = member_pod(
        &c,
        &s,
        &MemberPod {
            name: "ex-0".into(),
            initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
            state: ClusterState::New,
        },
    );
    let restore = RestoreSpec {
        s3: Some(crate::spec::S3RestoreSpec {
            endpoint: "https://s3.example.com".into(),
            bucket: "etcd".into(),
            key: "prod/old-1.db".into(),
            credentials_secret: "s3-credentials".into(),
            image: None,
        }),
        ..Default::default()
    };
    let restoring = with_restore(pod, &c, &s, &restore);
    let init = &restoring["spec"]["initContainers"];
    assert_eq!(init[0]["name"], "download");
    assert_eq!(init[0]["image"], DEFAULT_MC_IMAGE);
    assert_eq!(
        init[0]["command"],
        json!([
            "mc",
            "--config-dir",
            "/restore/.mc",
            "cp",
            "s3/etcd/prod/old-1.db",
            "/restore/old-1.db"
        ])
    );
    assert_eq!(
        init[0]["env"][2]["value"],
        "https://$(S3_ACCESS_KEY_ID):$(S3_SECRET_ACCESS_KEY)@s3.example.com"
    );
    assert_eq!(
        init[0]["env"][0]["valueFrom"]["secretKeyRef"],
        json!({"name": "s3-credentials", "key": "accessKeyID"})
    );
    assert_eq!(init[1]["name"], "restore");
    assert_eq!(init[1]["command"][3], "/restore/old-1.db");
    assert!(
        init[1]["command"]
            .as_array()
            .is_some_and(|c| c.contains(&json!("--initial-cluster-token=ex-from-old-1"))),
        "{init}"
    );
    let volumes = restoring["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        volumes.contains(&json!({"name": "restore", "emptyDir": {}})),
        "{volumes:?}"
    );
    // An upgrade re-applies the init containers as they are, credentials included.
    let upgraded = with_image(
        &restoring,
        "repo:v3.6.17",
        &Default::default(),
        &Default::default(),
    )
    .expect("etcd container");
    assert_eq!(
        upgraded["spec"]["initContainers"],
        restoring["spec"]["initContainers"]
    );
    assert_eq!(upgraded["spec"]["volumes"], restoring["spec"]["volumes"]);
    assert_eq!(
        restore.source(),
        "object s3://etcd/prod/old-1.db at https://s3.example.com"
    );
}

#[test]
fn scheduling_settings_reach_the_pod_and_survive_an_upgrade() {
    let c = cluster();
    let s = EtcdClusterSpec {
        size: 3,
        version: "3.6.16".into(),
        pod: Some(crate::spec::PodPolicy {
            node_selector: [("disk".to_owned(), "ssd".to_owned())].into(),
            affinity: Some(json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}})),
            tolerations: vec![json!({"key": "dedicated", "operator": "Equal", "value": "etcd", "effect": "NoSchedule"})],
            ..Default::default()
        }),
        ..Default::default()
    }
    .validate()
    .expect("valid");
    let pod = member_pod(
        &c,
        &s,
        &MemberPod {
            name: "ex-0".into(),
            initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
            state: ClusterState::New,
        },
    );
    assert_eq!(pod["spec"]["nodeSelector"], json!({"disk": "ssd"}));
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "dedicated");
    assert!(pod["spec"]["affinity"]["podAntiAffinity"].is_object());
    let upgraded = with_image(
        &pod,
        "repo:v3.6.17",
        &Default::default(),
        &Default::default(),
    )
    .expect("etcd container");
    for key in ["nodeSelector", "affinity", "tolerations"] {
        assert_eq!(upgraded["spec"][key], pod["spec"][key], "{key}");
    }
}

#[test]
fn services() {
    let c = cluster();
    let headless = headless_service(&c);
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(client_service(&c)["metadata"]["name"], "ex-client");
    assert_eq!(pod_disruption_budget(&c, 3)["spec"]["minAvailable"], 2);
}

/// What tools, NetworkPolicies and ServiceMonitors written for the classic operator select:
/// `app=etcd,etcd_cluster=<cluster>` on the members and the Services, `etcd_node=<pod>` on a
/// member; never on the backup pod, which is no member.
#[test]
fn members_and_services_carry_the_classic_labels_and_the_backup_pod_does_not() {
    let c = cluster();
    let pod = member_pod(
        &c,
        &spec(false),
        &MemberPod {
            name: "ex-1".into(),
            initial_cluster: vec![("ex-1".into(), c.peer_url("ex-1"))],
            state: ClusterState::New,
        },
    );
    let labels = &pod["metadata"]["labels"];
    assert_eq!(labels["app"], "etcd", "{labels}");
    assert_eq!(labels["etcd_cluster"], "ex", "{labels}");
    assert_eq!(labels["etcd_node"], "ex-1", "{labels}");
    assert_eq!(
        labels[LABEL_INSTANCE], "ex",
        "the current labels are kept: {labels}"
    );
    for service in [headless_service(&c), client_service(&c)] {
        let labels = &service["metadata"]["labels"];
        assert_eq!(labels["app"], "etcd", "{labels}");
        assert_eq!(labels["etcd_cluster"], "ex", "{labels}");
    }
    let backup = backup_pod(
        &c,
        &spec(false),
        "ex-0",
        "ex-0.db",
        &SnapshotCause::OnDemand("now".into()),
    );
    let labels = &backup["metadata"]["labels"];
    assert!(
        labels.get("app").is_none() && labels.get("etcd_cluster").is_none(),
        "{labels}"
    );
}

/// A pod made by an earlier version of the plugin, without the classic labels, gets them
/// when it is next written (its upgrade).
#[test]
fn an_upgrade_gives_a_pod_made_before_the_classic_labels_those_labels() {
    let c = cluster();
    let mut pod = member_pod(
        &c,
        &spec(false),
        &MemberPod {
            name: "ex-0".into(),
            initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
            state: ClusterState::New,
        },
    );
    if let Some(labels) = pod["metadata"]["labels"].as_object_mut() {
        for key in ["app", "etcd_cluster", "etcd_node"] {
            labels.remove(key);
        }
    }
    let upgraded = with_image(
        &pod,
        "repo:v3.6.17",
        &Default::default(),
        &Default::default(),
    )
    .expect("etcd container");
    let labels = &upgraded["metadata"]["labels"];
    assert_eq!(labels["app"], "etcd", "{labels}");
    assert_eq!(labels["etcd_cluster"], "ex", "{labels}");
    assert_eq!(labels["etcd_node"], "ex-0", "{labels}");
}

fn tls() -> TlsSpec {
    TlsSpec {
        peer_secret: "ex-peer".into(),
        server_secret: "ex-server".into(),
        operator_secret: "ex-operator".into(),
    }
}

#[test]
fn a_tls_member_serves_https_on_both_ports_and_is_probed_on_plain_metrics() {
    let c = ClusterRef {
        tls: true,
        ..cluster()
    };
    let mut tls_spec = spec(false);
    tls_spec.tls = Some(tls());
    let pod = member_pod(
        &c,
        &tls_spec,
        &MemberPod {
            name: "ex-0".into(),
            initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
            state: ClusterState::New,
        },
    );
    let container = &pod["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for wanted in [
        "--listen-client-urls=https://$(POD_IP):2379",
        "--listen-peer-urls=https://$(POD_IP):2380",
        "--advertise-client-urls=https://ex-0.ex.ns.svc:2379",
        "--initial-advertise-peer-urls=https://ex-0.ex.ns.svc:2380",
        "--initial-cluster=ex-0=https://ex-0.ex.ns.svc:2380",
        "--cert-file=/etc/etcd/tls/server/tls.crt",
        "--trusted-ca-file=/etc/etcd/tls/server/ca.crt",
        "--client-cert-auth=true",
        "--peer-cert-file=/etc/etcd/tls/peer/tls.crt",
        "--peer-client-cert-auth=true",
        "--listen-metrics-urls=http://$(POD_IP):2381",
    ] {
        assert!(args.contains(&wanted), "{wanted} in {args:?}");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(
        pod["spec"]["volumes"],
        json!([
            {"name": "data", "emptyDir": {}},
            {"name": "server-tls", "secret": {"secretName": "ex-server"}},
            {"name": "peer-tls", "secret": {"secretName": "ex-peer"}},
        ])
    );
    // Without TLS nothing of it is there.
    let plain = member_pod(
        &cluster(),
        &spec(false),
        &MemberPod {
            name: "ex-0".into(),
            initial_cluster: vec![("ex-0".into(), cluster().peer_url("ex-0"))],
            state: ClusterState::New,
        },
    );
    let plain_args = plain["spec"]["containers"][0]["args"].to_string();
    assert!(
        !plain_args.contains("https") && !plain_args.contains("cert"),
        "{plain_args}"
    );
    assert_eq!(
        plain["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"],
        "client"
    );
}

#[test]
fn etcdctl_containers_get_the_operator_certificate_and_others_do_not() {
    let pod = json!({"spec": {
        "initContainers": [{"name": "save", "command": ["/usr/local/bin/etcdctl", "snapshot", "save", "/b/x.db"],
            "env": [{"name": "ETCDCTL_ENDPOINTS", "value": "https://ex-0.ex.ns.svc:2379"}]}],
        "containers": [{"name": "serve", "command": ["/usr/local/bin/etcd"]}],
        "volumes": [{"name": "backup", "emptyDir": {}}],
    }});
    let pod = with_operator_tls(pod, &tls());
    let save = &pod["spec"]["initContainers"][0];
    assert_eq!(
        save["env"],
        json!([
            {"name": "ETCDCTL_ENDPOINTS", "value": "https://ex-0.ex.ns.svc:2379"},
            {"name": "ETCDCTL_CACERT", "value": "/etc/etcd/tls/operator/ca.crt"},
            {"name": "ETCDCTL_CERT", "value": "/etc/etcd/tls/operator/tls.crt"},
            {"name": "ETCDCTL_KEY", "value": "/etc/etcd/tls/operator/tls.key"},
        ])
    );
    assert_eq!(
        save["volumeMounts"],
        json!([{"name": "operator-tls", "mountPath": "/etc/etcd/tls/operator", "readOnly": true}])
    );
    assert!(pod["spec"]["containers"][0].get("env").is_none());
    assert_eq!(
        pod["spec"]["volumes"][1],
        json!({"name": "operator-tls", "secret": {"secretName": "ex-operator"}})
    );
}

#[test]
fn a_tls_cluster_s_backup_pod_saves_with_the_operator_certificate_and_verifies_over_tls() {
    let c = ClusterRef {
        tls: true,
        ..cluster()
    };
    let mut tls_spec = spec(false);
    tls_spec.tls = Some(tls());
    let pod = backup_pod(
        &c,
        &tls_spec,
        "ex-0",
        "ex-0.db",
        &SnapshotCause::OnDemand("now".into()),
    );
    let save = &pod["spec"]["initContainers"][0];
    assert_eq!(
        save["env"][0],
        json!({"name": "ETCDCTL_ENDPOINTS", "value": "https://ex-0.ex.ns.svc:2379"})
    );
    assert!(
        save["env"]
            .to_string()
            .contains("/etc/etcd/tls/operator/tls.crt"),
        "{save}"
    );
    let serve = &pod["spec"]["containers"][0];
    let args = serve["args"].to_string();
    for wanted in [
        "--listen-client-urls=https://$(POD_IP):2379",
        "--cert-file=/etc/etcd/tls/server/tls.crt",
        "--client-cert-auth=true",
    ] {
        assert!(args.contains(wanted), "{wanted} in {args}");
    }
    assert!(!args.contains("--peer-cert-file"), "{args}");
    assert_eq!(serve["readinessProbe"]["httpGet"]["port"], "metrics");
    let volumes = pod["spec"]["volumes"].to_string();
    assert!(
        volumes.contains("ex-operator") && volumes.contains("ex-server"),
        "{volumes}"
    );
    // A plain cluster's backup pod has none of it.
    let plain = backup_pod(
        &cluster(),
        &spec(false),
        "ex-0",
        "ex-0.db",
        &SnapshotCause::OnDemand("now".into()),
    );
    assert!(!plain.to_string().contains("tls"), "{plain}");
}

#[test]
fn a_tls_cluster_s_upload_gets_the_store_s_credentials_not_the_operator_certificate() {
    let c = ClusterRef {
        tls: true,
        ..cluster()
    };
    let mut s = spec(false);
    s.tls = Some(tls());
    s.backup = crate::spec::BackupSpec {
        storage: StorageSpec {
            size: Quantity("1Gi".into()),
            storage_class_name: None,
        },
        s3: Some(crate::spec::S3BackupSpec {
            endpoint: "https://s3.example.com".into(),
            bucket: "etcd".into(),
            credentials_secret: "s3-credentials".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .validate()
    .ok();
    let pod = backup_pod(
        &c,
        &s,
        "ex-0",
        "ex-1.db",
        &SnapshotCause::OnDemand("now".into()),
    );
    let init = pod["spec"]["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = init.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["save", "restore", "upload"]);
    let upload = init[2].to_string();
    assert!(
        !upload.contains("ETCDCTL") && !upload.contains("operator-tls"),
        "{upload}"
    );
    assert!(upload.contains("s3/etcd/ns/ex-1.db"), "{upload}");
    // The etcd steps keep their TLS.
    assert!(init[0].to_string().contains("operator-tls"), "{}", init[0]);
    assert!(
        pod["spec"]["containers"][0]["args"]
            .to_string()
            .contains("--client-cert-auth=true")
    );
}
