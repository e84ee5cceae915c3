//! The MariaDB policy plugin for policy-host: a primary and GTID replicas, failover that loses
//! no acknowledged write, switchover on request.
//!
//! policy-host watches `MariaDBCluster` resources (`mariadb.policy-host.io/v1alpha1`) and
//! hands this plugin each one with its Pods, claims, Services, budget and ConfigMap. The
//! plugin speaks the MySQL protocol to its own servers over SDK sessions (the granted `mysql`
//! port): it probes each server (read-only? GTIDs? whom does it replicate from?), decides,
//! and sends `SET GLOBAL`, `STOP SLAVE`, `CHANGE MASTER TO`. The host knows nothing of MySQL.
//!
//! - [`spec`] — the custom resource types (and, with feature `crd`, the CRD).
//! - [`wire`] — the MySQL client protocol over a session (`mysql_common`'s packets).
//! - [`gtid`] — MariaDB GTID positions: containment, errant transactions.
//! - [`probe`] — what each server is asked, and its answer as facts.
//! - [`credentials`] — the passwords, from the host's credential call.
//! - [`children`] — the Pods, claims, Services, budget and server configuration.
//! - [`backup`] — backups: when one is due, the Pod that takes it, its result in status.
//! - [`reconcile`] — the decisions (pure; table-tested natively).
//! - [`metrics`] — the domain metrics each decision reports (failovers, errant replicas, lag).
//!
//! This file is the only one that talks to the servers: it gathers [`reconcile::Facts`]
//! through sessions and carries out the [`reconcile::Plan`]'s commands.

pub mod backup;
pub mod children;
pub mod credentials;
pub mod gtid;
pub mod metrics;
pub mod probe;
pub mod reconcile;
pub mod spec;
pub mod wire;

#[cfg(test)]
mod model;

use std::collections::BTreeMap;

use policy_host_sdk::log;
use policy_host_sdk::prelude::*;
use serde::Deserialize;

use crate::credentials::Credentials;
use crate::reconcile::{Command, Facts, PodState, Server};
use crate::spec::{MariaDBClusterSpec, MariaDBClusterStatus};
use crate::wire::{Client, WireError};

/// The plugin's name, as the host knows it.
pub const PLUGIN_NAME: &str = "mariadb";

/// How long `MASTER_GTID_WAIT` waits for a switchover target to catch up, in seconds: inside
/// the host's 5 s per wait.
const CATCH_UP_SECONDS: u32 = 3;

/// The custom resource this plugin reconciles: `mariadbclusters.mariadb.policy-host.io`.
pub fn target_kind() -> KindRef {
    KindRef::namespaced(
        "mariadb.policy-host.io",
        "v1alpha1",
        "MariaDBCluster",
        "mariadbclusters",
    )
}

/// The MariaDB plugin, as the host calls it.
pub struct MariaDbPlugin;

policy_host_sdk::export_plugin!(MariaDbPlugin);

impl Plugin for MariaDbPlugin {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: PLUGIN_NAME.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            target: target_kind(),
            children: vec![
                children::pod_kind(),
                children::pvc_kind(),
                children::service_kind(),
                children::pdb_kind(),
                policy_host_sdk::children::config_map_kind(),
            ],
            capabilities: vec![Capability::Exchange(children::MYSQL_PORT_NAME.to_owned())],
            wants_finalizer: false,
        }
    }

    fn metrics() -> Vec<policy_host_sdk::metrics::Metric> {
        metrics::declared()
    }

    fn reconcile(
        observation: &Observation,
        app: &mut dyn AppCall,
    ) -> Result<Decision, PolicyError> {
        let Gathered {
            facts,
            mut clients,
            credentials,
        } = gather(observation, app)?;
        let plan = reconcile::decide(&facts);
        for command in &plan.commands {
            run(command, &facts.name, credentials.as_ref(), &mut clients)?;
        }
        if !plan.commands.is_empty() {
            let done: Vec<String> = plan.commands.iter().map(|c| format!("{c:?}")).collect();
            log::info("mariadb commands sent", &[("commands", &done.join(", "))]);
        }
        Ok(Decision {
            actions: plan.actions,
            requeue_after_ms: plan.requeue_after_ms,
            metrics: plan.metrics,
        })
    }
}

#[derive(Deserialize)]
struct Parent {
    metadata: ParentMeta,
    #[serde(default)]
    spec: MariaDBClusterSpec,
    #[serde(default)]
    status: Option<MariaDBClusterStatus>,
}

#[derive(Deserialize)]
struct ParentMeta {
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// What a decision starts from: the facts, the sessions opened to gather them (kept for the
/// commands) and the passwords.
#[derive(Debug)]
pub struct Gathered {
    /// The facts of the observation and the servers' answers.
    pub facts: Facts,
    /// An authenticated session with each server that answered.
    pub clients: BTreeMap<String, Client>,
    /// The passwords, if the host handed them out.
    pub credentials: Option<Credentials>,
}

/// The facts of one observation: the passwords first (from the host), then each running
/// server probed over its own session.
pub fn gather(observation: &Observation, app: &mut dyn AppCall) -> Result<Gathered, PolicyError> {
    let parent: Parent = observation.parent()?;
    let name = parent.metadata.name;
    let credentials = credentials::read(app, &parent.spec.secret(&name));
    let mut servers = Vec::new();
    let mut clients = BTreeMap::new();
    // The recorded primary is asked last: under writes a replica asked after the primary
    // would hold the primary's newest transactions and look errant (holding what the
    // primary's older answer lacks). Asked last, the primary's answer holds all its own
    // writes that any replica's does.
    let recorded_primary = parent
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone());
    let mut pods = observation.pods()?;
    pods.sort_by_key(|pod| recorded_primary.as_deref() == Some(pod.name.as_str()));
    let mut backup_pod = None;
    for pod in pods {
        if pod.name == children::backup_pod_name(&name) {
            backup_pod = Some(backup::BackupPod {
                phase: pod.phase.clone(),
                terminating: pod.terminating,
                reason: pod
                    .annotation(children::BACKUP_REASON_ANNOTATION)
                    .map(str::to_owned),
                started: pod
                    .annotation(children::BACKUP_STARTED_ANNOTATION)
                    .map(str::to_owned),
                message: pod
                    .termination_message(children::BACKUP_CONTAINER)
                    .map(str::to_owned),
                upload_message: pod
                    .termination_message(children::UPLOAD_CONTAINER)
                    .map(str::to_owned),
                location: pod
                    .annotation(children::BACKUP_LOCATION_ANNOTATION)
                    .map(str::to_owned),
            });
            continue;
        }
        if children::ordinal(&name, &pod.name).is_none() {
            continue;
        }
        let state = if pod.terminating {
            PodState::Terminating
        } else if pod.is_gone() {
            PodState::Ended
        } else if pod.phase == "Running" {
            PodState::Running { ready: pod.ready }
        } else {
            PodState::Pending
        };
        let probe = match (&credentials, state) {
            (Ok(c), PodState::Running { .. }) => probe(app, &pod.name, c).map(|(probe, client)| {
                clients.insert(pod.name.clone(), client);
                probe
            }),
            (Err(e), _) => Err(e.to_string()),
            _ => Err(format!("the Pod is {}", pod.phase)),
        };
        if let Err(error) = &probe {
            log::debug(
                "server does not answer",
                &[("pod", &pod.name), ("error", error)],
            );
        }
        servers.push(Server {
            name: pod.name.clone(),
            image: pod.image("mariadb").unwrap_or_default().to_owned(),
            // A Pod made before revisions were recorded started with the plugin's own
            // configuration alone: not a change, so a plugin upgrade restarts nothing.
            config_revision: pod
                .annotation(children::CONFIG_REVISION_ANNOTATION)
                .map_or_else(children::base_config_revision, str::to_owned),
            seed: pod
                .annotation(children::SEED_ANNOTATION)
                .map(|donor| children::Seed {
                    donor: donor.to_owned(),
                    required: pod.annotation(children::SEED_REQUIRED_ANNOTATION) == Some("true"),
                    restore: pod
                        .annotation(children::RESTORE_ANNOTATION)
                        .and_then(children::RestoreSource::parse),
                }),
            seed_failing: ["download", "seed"]
                .into_iter()
                .find(|step| pod.init_waiting_reason(step) == Some("CrashLoopBackOff"))
                .map(str::to_owned),
            pod: state,
            probe,
        });
    }
    servers.sort_by_key(|s| children::ordinal(&name, &s.name));
    let facts = Facts {
        generation: parent.metadata.generation,
        switchover: parent
            .metadata
            .annotations
            .get(children::SWITCHOVER_ANNOTATION)
            .cloned(),
        spec: parent.spec,
        status: parent.status.unwrap_or_default(),
        servers,
        credentials_unavailable: credentials.as_ref().err().map(|e| e.to_string()),
        now: observation.now,
        backup_pod,
        name,
        namespace: parent.metadata.namespace,
    };
    Ok(Gathered {
        facts,
        clients,
        credentials: credentials.ok(),
    })
}

/// Logs in to `pod` and asks it the probe's two statements.
fn probe(
    app: &mut dyn AppCall,
    pod: &str,
    credentials: &Credentials,
) -> Result<(probe::Probe, Client), String> {
    let mut client = Client::connect(
        app,
        pod,
        children::MYSQL_PORT_NAME,
        "root",
        credentials.root_password.as_str().unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    let variables = client
        .query(probe::VARIABLES_SQL)
        .map_err(|e| e.to_string())?;
    let link = client
        .query(probe::REPLICA_STATUS_SQL)
        .map_err(|e| e.to_string())?;
    let probe = probe::from_answers(&variables, &link).map_err(|e| e.to_string())?;
    Ok((probe, client))
}

/// The connections [`Command::Disconnect`] kills: clients, not the server's own threads, not
/// replicas reading its binlog, not this session.
pub const CLIENTS_SQL: &str = "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND USER NOT IN ('system user', 'event_scheduler') AND COMMAND NOT IN ('Binlog Dump', 'Daemon', 'Slave_IO', 'Slave_SQL', 'Slave_worker')";

/// `text` as a SQL string literal.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The statements a command sends, in order.
pub fn statements(command: &Command, parent: &str, replication_password: &str) -> Vec<String> {
    match command {
        Command::SetReadOnly { read_only, .. } => vec![format!(
            "SET GLOBAL read_only = {}",
            if *read_only { "ON" } else { "OFF" }
        )],
        Command::StopIo { .. } => vec!["STOP SLAVE IO_THREAD".into()],
        Command::StopReplication { .. } => vec!["STOP SLAVE".into()],
        Command::Promote { reset_link, .. } => {
            let mut sql: Vec<String> = Vec::new();
            if *reset_link {
                sql.extend(["STOP SLAVE".into(), "RESET SLAVE ALL".into()]);
            }
            sql.push("SET GLOBAL read_only = OFF".into());
            sql
        }
        Command::SemiSync { on, .. } => vec![format!(
            "SET GLOBAL rpl_semi_sync_master_enabled = {}",
            if *on { "ON" } else { "OFF" }
        )],
        Command::Replicate { source, demote, .. } => vec![
            "STOP SLAVE".into(),
            format!(
                "CHANGE MASTER TO MASTER_HOST = {}, MASTER_PORT = {}, MASTER_USER = {}, MASTER_PASSWORD = {}, MASTER_USE_GTID = slave_pos{}",
                quoted(&children::host_of(parent, source)),
                children::MYSQL_PORT,
                quoted(children::REPLICATION_USER),
                quoted(replication_password),
                if *demote {
                    ", MASTER_DEMOTE_TO_SLAVE = 1"
                } else {
                    ""
                }
            ),
            "START SLAVE".into(),
        ],
        Command::StartReplication { .. } => vec!["START SLAVE".into()],
        Command::StartApplying { .. } => vec!["START SLAVE SQL_THREAD".into()],
        // Built at run time from the source's position, or the pod's own.
        Command::CatchUp { .. } | Command::ApplyRetrieved { .. } | Command::Disconnect { .. } => {
            Vec::new()
        }
    }
}

fn command_pod(command: &Command) -> &str {
    match command {
        Command::SetReadOnly { pod, .. }
        | Command::StopIo { pod }
        | Command::StopReplication { pod }
        | Command::Promote { pod, .. }
        | Command::SemiSync { pod, .. }
        | Command::Replicate { pod, .. }
        | Command::StartReplication { pod }
        | Command::StartApplying { pod }
        | Command::CatchUp { pod, .. }
        | Command::ApplyRetrieved { pod }
        | Command::Disconnect { pod } => pod,
    }
}

fn run(
    command: &Command,
    parent: &str,
    credentials: Option<&Credentials>,
    clients: &mut BTreeMap<String, Client>,
) -> Result<(), PolicyError> {
    let pod = command_pod(command);
    let failed = |e: WireError| {
        PolicyError::new(
            "MariaDbCommandFailed",
            format!("{pod} of {parent}: {command:?} failed: {e}; will retry"),
        )
    };
    let password = credentials
        .and_then(|c| c.replication_password.as_str())
        .unwrap_or_default();
    // The position to wait for, and what a miss means.
    let wait = match command {
        Command::CatchUp { source, .. } => Some((
            clients
                .get_mut(source.as_str())
                .ok_or_else(|| not_connected(source, parent))?
                .query("SELECT @@global.gtid_binlog_pos AS pos")
                .map_err(failed)?
                .get(0, "pos")
                .unwrap_or_default()
                .to_owned(),
            format!("{source}'s position"),
            format!("{source} stays read-only and the switchover is retried"),
        )),
        Command::ApplyRetrieved { .. } => Some((
            clients
                .get_mut(pod)
                .ok_or_else(|| not_connected(pod, parent))?
                .query(probe::REPLICA_STATUS_SQL)
                .map_err(failed)?
                .get(0, "Gtid_IO_Pos")
                .unwrap_or_default()
                .to_owned(),
            "what it retrieved".to_owned(),
            "the switchover is retried".to_owned(),
        )),
        _ => None,
    };
    if let Some((position, what, then)) = wait {
        if position.is_empty() {
            return Ok(());
        }
        let waited = clients
            .get_mut(pod)
            .ok_or_else(|| not_connected(pod, parent))?
            .query(&format!(
                "SELECT MASTER_GTID_WAIT({}, {CATCH_UP_SECONDS}) AS waited",
                quoted(&position)
            ))
            .map_err(failed)?;
        if waited.get(0, "waited") != Some("0") {
            return Err(PolicyError::new(
                "SwitchoverCatchUp",
                format!(
                    "{pod} of {parent} did not reach {what} {position} within {CATCH_UP_SECONDS} s; {then}"
                ),
            ));
        }
        return Ok(());
    }
    let client = clients
        .get_mut(pod)
        .ok_or_else(|| not_connected(pod, parent))?;
    if let Command::Disconnect { .. } = command {
        let connected = client.query(CLIENTS_SQL).map_err(failed)?;
        for id in (0..connected.rows.len()).filter_map(|row| connected.get(row, "ID")) {
            // A client gone meanwhile (1094, unknown thread) is what was wanted.
            match client.execute(&format!("KILL CONNECTION {id}")) {
                Err(WireError::Server { code: 1094, .. }) | Ok(()) => {}
                Err(e) => return Err(failed(e)),
            }
        }
        return Ok(());
    }
    for sql in statements(command, parent, password) {
        client.execute(&sql).map_err(failed)?;
    }
    Ok(())
}

fn not_connected(pod: &str, parent: &str) -> PolicyError {
    PolicyError::new(
        "MariaDbUnreachable",
        format!("{pod} of {parent} stopped answering during the decision; will retry"),
    )
}

#[cfg(test)]
mod tests {
    use policy_host_sdk::testing::{Harness, ScriptedAppCall, observation};
    use serde_json::{Value, json};

    use super::*;
    use crate::wire::fixtures::{com_query, greeting, login, ok, result_set};

    const VARIABLE_COLUMNS: &[&str] = &[
        "read_only",
        "binlog_pos",
        "binlog_state",
        "current_pos",
        "slave_pos",
        "semi_sync",
        "semi_sync_status",
    ];

    /// A session with a fresh server: greeting, login, the probe's two answers (read-only,
    /// no GTIDs, no link), then OK to `statements`.
    fn fresh_server(app: ScriptedAppCall, pod: &str, statements: &[&str]) -> ScriptedAppCall {
        let mut app = app
            .greets(pod, "mysql", greeting())
            .answers(pod, "mysql", login("root", "root-secret"), ok(2))
            .answers(
                pod,
                "mysql",
                com_query(probe::VARIABLES_SQL),
                result_set(
                    VARIABLE_COLUMNS,
                    &[&[
                        Some("1"),
                        Some(""),
                        Some(""),
                        Some(""),
                        Some(""),
                        Some("0"),
                        Some("OFF"),
                    ]],
                ),
            )
            .answers(
                pod,
                "mysql",
                com_query(probe::REPLICA_STATUS_SQL),
                result_set(&["Master_Host"], &[]),
            );
        for sql in statements {
            app = app.answers(pod, "mysql", com_query(sql), ok(1));
        }
        app
    }

    fn running_pod(name: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name },
            "spec": { "containers": [{ "name": "mariadb", "image": "mariadb:10.11" }] },
            "status": {
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True" }]
            }
        })
    }

    fn cluster(replicas: i32) -> Value {
        json!({
            "apiVersion": "mariadb.policy-host.io/v1alpha1",
            "kind": "MariaDBCluster",
            "metadata": { "name": "db", "generation": 1 },
            "spec": { "replicas": replicas }
        })
    }

    /// The passwords of `db-credentials`, as the host hands them out.
    fn with_credentials(app: ScriptedAppCall) -> ScriptedAppCall {
        app.with_credential(
            "db-credentials",
            credentials::ROOT_PASSWORD_KEY,
            "root-secret",
        )
        .with_credential(
            "db-credentials",
            credentials::REPLICATION_PASSWORD_KEY,
            "repl-secret",
        )
    }

    #[test]
    fn a_new_cluster_whose_servers_answer_promotes_db_0_over_its_session() {
        let app = fresh_server(
            with_credentials(ScriptedAppCall::new()),
            "db-0",
            &["SET GLOBAL read_only = OFF"],
        );
        let app = fresh_server(app, "db-1", &[]);
        let mut harness = Harness::<MariaDbPlugin>::with_app(app);
        let observed = observation(cluster(1))
            .child(&children::pod_kind(), running_pod("db-0"))
            .child(&children::pod_kind(), running_pod("db-1"))
            .build();
        let decision = harness.reconcile(&observed).expect("decides");
        let status = decision.status().cloned().unwrap_or_default();
        assert_eq!(status["currentPrimary"], "db-0");
        let sent: Vec<String> = harness
            .app
            .session_log()
            .iter()
            .filter(|r| r.pod == "db-0")
            .map(|r| String::from_utf8_lossy(r.request.get(5..).unwrap_or_default()).into_owned())
            .collect();
        assert_eq!(
            sent.last().map(String::as_str),
            Some("SET GLOBAL read_only = OFF"),
            "{sent:?}"
        );
        assert!(
            harness.app.session_log().iter().all(|r| r.reply.is_ok()),
            "every round was scripted: {:?}",
            harness.app.session_log()
        );
    }

    /// The conversation of `responses.json` (for `policy-host simulate --responses`): fresh,
    /// read-only servers of the example cluster, whichever pod, and db-0's promotion.
    fn responder_file() -> Value {
        let hex = |bytes: Vec<u8>| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
        let secret = "example-db-credentials";
        let round = |send: Option<Vec<u8>>, reply: Vec<u8>| {
            let mut row = json!({ "pod": "*", "port": "mysql", "replyHex": hex(reply) });
            if let Some(send) = send {
                row["sendHex"] = Value::from(hex(send));
            }
            row
        };
        json!({
            "credentials": [
                { "secret": secret, "key": credentials::ROOT_PASSWORD_KEY, "value": "root-secret" },
                { "secret": secret, "key": credentials::REPLICATION_PASSWORD_KEY, "value": "repl-secret" }
            ],
            "sessions": [
                round(None, greeting()),
                round(Some(login("root", "root-secret")), ok(2)),
                round(
                    Some(com_query(probe::VARIABLES_SQL)),
                    result_set(
                        VARIABLE_COLUMNS,
                        &[&[Some("1"), Some(""), Some(""), Some(""), Some(""), Some("0"), Some("OFF")]],
                    ),
                ),
                round(
                    Some(com_query(probe::REPLICA_STATUS_SQL)),
                    result_set(&["Master_Host"], &[]),
                ),
                round(Some(com_query("SET GLOBAL read_only = OFF")), ok(1)),
            ]
        })
    }

    /// Writes `responses.json` from the fixtures (run it after changing the probe).
    #[test]
    #[ignore = "writes guest-mariadb/responses.json"]
    fn write_the_responder_file() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/responses.json");
        let text = serde_json::to_string_pretty(&responder_file()).expect("JSON");
        std::fs::write(path, text + "\n").expect("writes responses.json");
    }

    #[test]
    fn the_responder_file_is_the_fixtures_conversation_and_elects_db_0() {
        let committed: Value = serde_json::from_str(include_str!("../responses.json"))
            .expect("responses.json is JSON");
        assert_eq!(
            committed,
            responder_file(),
            "guest-mariadb/responses.json is out of date with the fixtures; run \
             `cargo test -p guest-mariadb -- --ignored write_the_responder_file`"
        );
        let app = ScriptedAppCall::from_responses(include_str!("../responses.json"))
            .expect("the SDK reads it");
        let mut harness = Harness::<MariaDbPlugin>::with_app(app);
        let mut parent = cluster(2);
        parent["metadata"]["name"] = json!("example-db");
        let observed = ["example-db-0", "example-db-1", "example-db-2"]
            .into_iter()
            .fold(observation(parent), |o, pod| {
                o.child(&children::pod_kind(), running_pod(pod))
            })
            .build();
        let decision = harness.reconcile(&observed).expect("decides");
        let status = decision.status().cloned().unwrap_or_default();
        assert_eq!(status["currentPrimary"], "example-db-0", "{status}");
    }

    #[test]
    fn a_replica_is_told_its_source_and_the_replication_password_but_no_status_carries_it() {
        let command = Command::Replicate {
            pod: "db-1".into(),
            source: "db-0".into(),
            demote: true,
        };
        let sql = statements(&command, "db", "it's");
        assert_eq!(
            sql[1],
            "CHANGE MASTER TO MASTER_HOST = 'db-0.db-headless', MASTER_PORT = 3306, MASTER_USER = 'repl', MASTER_PASSWORD = 'it\\'s', MASTER_USE_GTID = slave_pos, MASTER_DEMOTE_TO_SLAVE = 1"
        );
    }

    #[test]
    fn without_the_credentials_grant_the_servers_are_created_and_none_is_asked_anything() {
        let mut harness = Harness::<MariaDbPlugin>::new();
        let observed = observation(cluster(2))
            .child(&children::pod_kind(), running_pod("db-0"))
            .build();
        let decision = harness.reconcile(&observed).expect("decides");
        assert!(harness.app.session_log().is_empty());
        assert!(decision.applied("Pod", "db-2").is_some());
        let status = decision.status().cloned().unwrap_or_default();
        assert_eq!(status["phase"], "Degraded");
        assert!(status.to_string().contains("CredentialsUnavailable"));
        let progressing = status["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Progressing"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            progressing["status"], "False",
            "nothing progresses without credentials: {progressing}"
        );
        assert_eq!(
            decision.requeue_after_ms,
            Some(reconcile::REQUEUE_STEADY_MS),
            "no busy requeue while waiting for the credential path"
        );
    }
}
