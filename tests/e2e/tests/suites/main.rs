//! The end-to-end suites that keep to namespaces of their own, in one test binary: they share
//! one control plane and real node (`shared_node()`, one per test process) and run side by side
//! (`--test-threads`), each test in its own namespace, deleted when the test ends.
//!
//! Why one binary: each test binary starts its own control plane and node (13–15 s) and links
//! the host, kube and wasmtime again; one binary for 27 suites takes minutes off every CI run
//! (BENCHMARKS.md). A suite that changes what every namespace sees (a CRD deleted, a host
//! installed cluster-wide) stays a binary of its own in `tests/e2e/tests/`: `finalizer_crd`,
//! `install`, `plugin_bundle`. (`helm_chart` is here: its apply is a server-side dry run, and the
//! RBAC it applies for real stays in its own namespace.)

mod bounded_caches;
mod controller_safety;
mod crd_validation;
mod etcd_backup;
mod etcd_backup_restore;
mod etcd_chaos;
mod etcd_classic;
mod etcd_classic_suite;
mod etcd_cluster;
mod etcd_lifecycle;
mod etcd_maintenance;
mod etcd_partition;
mod etcd_paused;
mod etcd_real_node;
mod etcd_s3;
mod etcd_tenant;
mod etcd_tls;
mod helm_chart;
mod host_contract;
mod kubectl_plugin;
mod leader_election;
mod mariadb_cluster;
mod mariadb_image;
mod memcached_js;
mod newcomer;
mod ownership;
mod plugin_credentials;
mod plugin_grants;
mod plugin_loading;
mod plugin_metrics;
mod plugin_oci;
mod plugin_trust;
mod real_node;
mod redis_replication;
mod sharding;
mod staged_rollout;
mod steady_state;

/// The MariaDB scenarios in turn (see `mariadb_cluster::every_scenario_in_turn`): one test,
/// named so that libtest starts it first, holding one thread for the whole chain while the other
/// suites run on the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_cluster_scenarios_in_turn() -> anyhow::Result<()> {
    mariadb_cluster::every_scenario_in_turn().await
}
