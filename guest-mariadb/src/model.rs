//! A model of MariaDB servers for whole-plugin tests: each server speaks enough of the
//! protocol (greeting, any login, the probe's statements and the plugin's commands) over a fake
//! session, and replicates when the test ticks it, so a test runs the plugin decision after
//! decision through a failover and checks what a scripted session cannot: that no acknowledged
//! write is lost and no two servers take writes at once.
//!
//! One GTID domain (0); a transaction is `(server_id, sequence)`. A write on a writable server
//! is acknowledged when a replica's IO thread retrieves it at once (semi-sync); the model does
//! not decide on acknowledgement by time.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use policy_host_sdk::Session;
use policy_host_sdk::session::Connection;
use policy_host_sdk::{
    AppCall, AppCallError, AppCallRequest, AppCallResponse, Credential, CredentialError,
    ExchangeError,
};

use crate::probe::{REPLICA_STATUS_SQL, VARIABLES_SQL};
use crate::wire::fixtures::{err, greeting, ok, result_set};

type Transaction = (u32, u64);

/// The connection id of the first client waiting on a commit ([`Server::waiting`]).
const WAITING_CLIENT_ID: usize = 100;

/// A replication link.
#[derive(Clone, Debug, Default)]
pub struct Link {
    /// The source's Pod name.
    pub source: String,
    /// IO thread running.
    pub io: bool,
    /// SQL thread running.
    pub sql: bool,
    /// Transactions retrieved (the relay log), in order.
    pub retrieved: Vec<Transaction>,
}

/// One server.
#[derive(Clone, Debug)]
pub struct Server {
    /// `server_id`.
    pub server_id: u32,
    /// Running (its Pod exists and mysqld answers).
    pub up: bool,
    /// `@@read_only`.
    pub read_only: bool,
    /// Executed transactions, in order (its binlog, with `log_slave_updates`).
    pub executed: Vec<Transaction>,
    /// The last transaction applied as a replica (`gtid_slave_pos`).
    pub slave_pos: Option<Transaction>,
    /// Its replication link.
    pub link: Option<Link>,
    /// `@@rpl_semi_sync_master_enabled`.
    pub semi_sync: bool,
    /// Its network is cut: it runs, but neither the plugin nor a replica reaches it.
    pub cut: bool,
    /// Commits waiting for a semi-sync acknowledgement (in its binlog; their clients hold their
    /// connections, waiting for the OK).
    pub waiting: Vec<Transaction>,
}

fn position(t: Option<&Transaction>) -> String {
    t.map(|(s, n)| format!("0-{s}-{n}")).unwrap_or_default()
}

impl Server {
    fn fresh(server_id: u32) -> Self {
        Server {
            server_id,
            up: true,
            read_only: true,
            executed: Vec::new(),
            slave_pos: None,
            link: None,
            semi_sync: false,
            cut: false,
            waiting: Vec::new(),
        }
    }

    /// `@@gtid_binlog_state`: the last sequence per server id.
    fn binlog_state(&self) -> String {
        let mut last: BTreeMap<u32, u64> = BTreeMap::new();
        for (s, n) in &self.executed {
            last.insert(*s, *n);
        }
        last.iter()
            .map(|(s, n)| format!("0-{s}-{n}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Every server, by Pod name, and counters the tests assert on.
#[derive(Debug, Default)]
pub struct Model {
    /// The servers.
    pub servers: BTreeMap<String, Server>,
    /// How many times a server went from read-only to writable.
    pub promotions: u32,
    /// A busy primary: a client writes to the writable server (and replication delivers it)
    /// each time any server is probed, so a server probed later has seen more than one probed
    /// earlier, as on a real cluster under load.
    pub writes_between_probes: bool,
    /// A client whose account has `READ ONLY ADMIN` (root, as the plugin's credentials give)
    /// writing to this Pod's server before each statement the plugin sends to any server:
    /// `read_only` does not stop it.
    pub admin_writes_to: Option<String>,
    /// The admin client's writes that were acknowledged.
    pub admin_acknowledged: Vec<Transaction>,
    /// Writes that waited for a semi-sync acknowledgement and got their OK later: when a
    /// replica retrieved them, or when semi-sync was turned off under them.
    pub acknowledged_late: Vec<Transaction>,
}

/// The model as the plugin's app: clones share it.
#[derive(Clone, Debug, Default)]
pub struct FakeCluster(pub Rc<RefCell<Model>>);

impl FakeCluster {
    /// A server for Pod `pod`, started (fresh, or again on its old data).
    pub fn start(&self, pod: &str, server_id: u32) {
        let mut model = self.0.borrow_mut();
        let server = model
            .servers
            .entry(pod.to_owned())
            .or_insert_with(|| Server::fresh(server_id));
        if !server.up {
            // A restart: the configuration's read_only and skip_slave_start, and semi-sync
            // off on the source side (the plugin turns it on at run time).
            server.up = true;
            server.read_only = true;
            server.semi_sync = false;
            // Its clients lost their connections: nothing waiting was acknowledged.
            server.waiting.clear();
            if let Some(link) = &mut server.link {
                link.io = false;
                link.sql = false;
            }
        }
    }

    /// The server of `pod` stops (killed; its data stays on its claim).
    pub fn kill(&self, pod: &str) {
        if let Some(s) = self.0.borrow_mut().servers.get_mut(pod) {
            s.up = false;
        }
    }

    /// Cuts `pod`'s network (`true`) or heals it: while cut it runs, but no one reaches it.
    pub fn cut(&self, pod: &str, cut: bool) {
        if let Some(s) = self.0.borrow_mut().servers.get_mut(pod) {
            s.cut = cut;
        }
    }

    fn reachable(&self, pod: &str) -> bool {
        self.0
            .borrow()
            .servers
            .get(pod)
            .is_some_and(|s| s.up && !s.cut)
    }

    /// Stops `pod`'s IO thread behind the plugin's back (a slow or cut link).
    pub fn stop_io(&self, pod: &str) {
        if let Some(link) = self
            .0
            .borrow_mut()
            .servers
            .get_mut(pod)
            .and_then(|s| s.link.as_mut())
        {
            link.io = false;
        }
    }

    /// A client write on `pod` (a client beside it: a cut does not stop it): refused when it is
    /// down or read-only; otherwise in its binlog, retrieved at once by every replica whose IO
    /// thread runs from it and reaches it, and acknowledged when one did (or semi-sync is off);
    /// else its commit waits for an acknowledgement ([`Server::waiting`]).
    pub fn write(&self, pod: &str) -> Option<Transaction> {
        self.write_as(pod, false)
    }

    /// [`FakeCluster::write`] by an account that `read_only` does not stop (`admin`) or does.
    fn write_as(&self, pod: &str, admin: bool) -> Option<Transaction> {
        let mut model = self.0.borrow_mut();
        let server = model
            .servers
            .get_mut(pod)
            .filter(|s| s.up && (admin || !s.read_only))?;
        let next = server.executed.iter().map(|t| t.1).max().unwrap_or(0) + 1;
        let transaction = (server.server_id, next);
        server.executed.push(transaction);
        let semi_sync = server.semi_sync;
        let source_cut = server.cut;
        let executed = server.executed.clone();
        let mut acknowledged = false;
        for replica in model.servers.values_mut() {
            if let Some(link) = replica.link.as_mut().filter(|l| l.source == pod && l.io)
                && replica.up
                && !replica.cut
                && !source_cut
            {
                link.retrieved = executed.clone();
                acknowledged = true;
            }
        }
        if acknowledged || !semi_sync {
            return Some(transaction);
        }
        if let Some(server) = model.servers.get_mut(pod) {
            server.waiting.push(transaction);
        }
        None
    }

    /// Replication runs: every running IO thread retrieves its source's binlog (if it extends
    /// what the replica has), every running SQL thread applies what was retrieved.
    pub fn tick(&self) {
        let mut model = self.0.borrow_mut();
        let binlogs: BTreeMap<String, Option<Vec<Transaction>>> = model
            .servers
            .iter()
            .map(|(n, s)| (n.clone(), (s.up && !s.cut).then(|| s.executed.clone())))
            .collect();
        // A server with semi-sync on waits, at each commit, for a replica's acknowledgement —
        // its applier's commits too (`log_slave_updates`): without a replica it applies nothing.
        let acknowledged = sources_acknowledged(&model.servers);
        // A commit that waited gets its OK once a replica retrieves from its server.
        let mut released = Vec::new();
        for (name, server) in model.servers.iter_mut() {
            if acknowledged.contains(name) {
                released.append(&mut server.waiting);
            }
        }
        model.acknowledged_late.extend(released);
        for (name, server) in model.servers.iter_mut().filter(|(_, s)| s.up) {
            let executed = server.executed.clone();
            let blocked = server.semi_sync && !acknowledged.contains(name);
            let cut = server.cut;
            let Some(link) = server.link.as_mut() else {
                continue;
            };
            if link.io
                && !cut
                && let Some(Some(source)) = binlogs.get(&link.source)
                && source.starts_with(&executed)
            {
                link.retrieved = source.clone();
            }
            if link.sql && !blocked && link.retrieved.starts_with(&executed) {
                let applied = link.retrieved.clone();
                server.slave_pos = applied.last().copied().or(server.slave_pos);
                server.executed = applied;
            }
        }
    }

    /// The servers taking writes. A cut-off one is not counted while cut: no client reaches it
    /// but one beside it, whose commits wait for an acknowledgement (semi-sync never falls
    /// back), so nothing it takes is acknowledged.
    pub fn writable(&self) -> Vec<String> {
        self.0
            .borrow()
            .servers
            .iter()
            .filter(|(_, s)| s.up && !s.read_only && !s.cut)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The transactions `pod` executed.
    pub fn executed(&self, pod: &str) -> Vec<Transaction> {
        self.0
            .borrow()
            .servers
            .get(pod)
            .map(|s| s.executed.clone())
            .unwrap_or_default()
    }

    /// The source `pod` replicates from, with both threads running.
    pub fn replicates_from(&self, pod: &str) -> Option<String> {
        let model = self.0.borrow();
        let link = model.servers.get(pod)?.link.as_ref()?;
        (link.io && link.sql).then(|| link.source.clone())
    }

    /// Stops `pod`'s SQL thread behind the plugin's back (applying lags).
    pub fn stop_sql(&self, pod: &str) {
        if let Some(link) = self
            .0
            .borrow_mut()
            .servers
            .get_mut(pod)
            .and_then(|s| s.link.as_mut())
        {
            link.sql = false;
        }
    }

    fn answer(&self, pod: &str, sql: &str) -> Vec<u8> {
        let admin_writes_to = self.0.borrow().admin_writes_to.clone();
        if let Some(written) = admin_writes_to
            && let Some(transaction) = self.write_as(&written, true)
        {
            self.0.borrow_mut().admin_acknowledged.push(transaction);
        }
        if sql == VARIABLES_SQL && self.0.borrow().writes_between_probes {
            for writable in self.writable() {
                self.write(&writable);
            }
            self.tick();
        }
        let mut guard = self.0.borrow_mut();
        let model = &mut *guard;
        let binlogs: BTreeMap<String, Vec<Transaction>> = model
            .servers
            .iter()
            .filter(|(_, s)| s.up && !s.cut)
            .map(|(n, s)| (n.clone(), s.executed.clone()))
            .collect();
        // Which servers have a replica whose IO thread runs from them.
        let semi_sync_replicas: BTreeMap<String, bool> = model
            .servers
            .values()
            .filter(|r| r.up && !r.cut)
            .filter_map(|r| r.link.as_ref().filter(|l| l.io))
            .map(|l| (l.source.clone(), true))
            .collect();
        let promotions = &mut model.promotions;
        let mut late = Vec::new();
        let mut promoted = false;
        let reply = {
            let Some(s) = model.servers.get_mut(pod) else {
                return err(1, 2013, "lost connection");
            };
            if sql == VARIABLES_SQL {
                let acknowledging = semi_sync_replicas.get(pod).copied().unwrap_or(false);
                let last = s.executed.last();
                let flag = |b: bool| if b { "1" } else { "0" };
                let binlog = position(last);
                let state = s.binlog_state();
                let slave = position(s.slave_pos.as_ref());
                result_set(
                    &[
                        "read_only",
                        "binlog_pos",
                        "binlog_state",
                        "current_pos",
                        "slave_pos",
                        "semi_sync",
                        "semi_sync_status",
                    ],
                    &[&[
                        Some(flag(s.read_only)),
                        Some(&binlog),
                        Some(&state),
                        Some(&binlog),
                        Some(&slave),
                        Some(flag(s.semi_sync)),
                        Some(if s.semi_sync && acknowledging {
                            "ON"
                        } else {
                            "OFF"
                        }),
                    ]],
                )
            } else if sql == REPLICA_STATUS_SQL {
                let columns = [
                    "Master_Host",
                    "Slave_IO_Running",
                    "Slave_SQL_Running",
                    "Using_Gtid",
                    "Gtid_IO_Pos",
                    "Last_IO_Error",
                    "Last_SQL_Error",
                ];
                match &s.link {
                    None => result_set(&columns, &[]),
                    Some(l) => {
                        let host = format!("{}.db-headless", l.source);
                        let yes = |b: bool| if b { "Yes" } else { "No" };
                        let io_pos = position(l.retrieved.last());
                        result_set(
                            &columns,
                            &[&[
                                Some(&host),
                                Some(yes(l.io)),
                                Some(yes(l.sql)),
                                Some("Slave_Pos"),
                                Some(&io_pos),
                                Some(""),
                                Some(""),
                            ]],
                        )
                    }
                }
            } else if let Some(value) = sql.strip_prefix("SET GLOBAL read_only = ") {
                let read_only = value == "ON";
                if read_only && !s.waiting.is_empty() {
                    // `read_only` waits for the commits in progress, and these wait for an
                    // acknowledgement that does not come: the real server blocks until the
                    // session's deadline; the model answers at once.
                    err(1, 1205, "Lock wait timeout exceeded")
                } else {
                    promoted = s.read_only && !read_only;
                    s.read_only = read_only;
                    ok(1)
                }
            } else if let Some(value) =
                sql.strip_prefix("SET GLOBAL rpl_semi_sync_master_enabled = ")
            {
                s.semi_sync = value == "ON";
                if !s.semi_sync {
                    // The waiting commits complete: their clients get an OK.
                    late.append(&mut s.waiting);
                }
                ok(1)
            } else if sql == crate::CLIENTS_SQL {
                // One connection per waiting commit (the plugin's own is not listed).
                let ids: Vec<String> = (0..s.waiting.len())
                    .map(|i| (WAITING_CLIENT_ID + i).to_string())
                    .collect();
                let rows: Vec<[Option<&str>; 1]> =
                    ids.iter().map(|id| [Some(id.as_str())]).collect();
                let rows: Vec<&[Option<&str>]> = rows.iter().map(|r| &r[..]).collect();
                result_set(&["ID"], &rows)
            } else if let Some(id) = sql.strip_prefix("KILL CONNECTION ") {
                // Its client sees the connection lost, never an OK; the commit stays in the
                // binlog.
                match id
                    .parse::<usize>()
                    .ok()
                    .and_then(|id| id.checked_sub(WAITING_CLIENT_ID))
                {
                    Some(i) if i < s.waiting.len() => {
                        s.waiting.remove(i);
                        ok(1)
                    }
                    _ => err(1, 1094, &format!("Unknown thread id: {id}")),
                }
            } else if sql == "STOP SLAVE IO_THREAD" {
                if let Some(l) = &mut s.link {
                    l.io = false;
                }
                ok(1)
            } else if sql == "STOP SLAVE" {
                if let Some(l) = &mut s.link {
                    l.io = false;
                    l.sql = false;
                }
                ok(1)
            } else if sql == "START SLAVE SQL_THREAD" {
                if let Some(l) = &mut s.link {
                    l.sql = true;
                }
                ok(1)
            } else if sql == "START SLAVE" {
                if let Some(l) = &mut s.link {
                    l.io = true;
                    l.sql = true;
                }
                ok(1)
            } else if sql == "RESET SLAVE ALL" {
                s.link = None;
                ok(1)
            } else if let Some(rest) = sql.strip_prefix("CHANGE MASTER TO MASTER_HOST = '") {
                let source = rest.split('.').next().unwrap_or_default().to_owned();
                if sql.contains("MASTER_DEMOTE_TO_SLAVE = 1") {
                    s.slave_pos = s.executed.last().copied();
                }
                // The relay log starts again from the replica's own position.
                s.link = Some(Link {
                    source,
                    retrieved: s.executed.clone(),
                    ..Link::default()
                });
                ok(1)
            } else if sql == "SELECT @@global.gtid_binlog_pos AS pos" {
                let pos = position(s.executed.last());
                result_set(&["pos"], &[&[Some(&pos)]])
            } else if let Some(rest) = sql.strip_prefix("SELECT MASTER_GTID_WAIT('") {
                // Replication runs while the client waits; then: is the position executed?
                let wanted: u64 = rest
                    .split('\'')
                    .next()
                    .and_then(|pos| pos.rsplit('-').next())
                    .and_then(|seq| seq.parse().ok())
                    .unwrap_or(0);
                if let Some(link) = s.link.as_mut().filter(|l| l.io)
                    && let Some(source) = binlogs.get(&link.source)
                    && source.starts_with(&s.executed)
                {
                    link.retrieved = source.clone();
                }
                if let Some(link) = s.link.as_ref().filter(|l| l.sql)
                    && (!s.semi_sync || semi_sync_replicas.contains_key(pod))
                    && link.retrieved.starts_with(&s.executed)
                {
                    s.executed = link.retrieved.clone();
                    s.slave_pos = s.executed.last().copied();
                }
                let reached = s.executed.iter().any(|t| t.1 >= wanted);
                result_set(&["waited"], &[&[Some(if reached { "0" } else { "-1" })]])
            } else {
                err(1, 1064, &format!("the model does not know `{sql}`"))
            }
        };
        if promoted {
            *promotions += 1;
        }
        model.acknowledged_late.append(&mut late);
        reply
    }
}

/// The servers that have a running replica whose IO thread retrieves from them.
fn sources_acknowledged(servers: &BTreeMap<String, Server>) -> std::collections::BTreeSet<String> {
    servers
        .values()
        .filter(|r| r.up && !r.cut)
        .filter_map(|r| r.link.as_ref().filter(|l| l.io))
        .map(|l| l.source.clone())
        .filter(|source| servers.get(source).is_some_and(|s| s.up && !s.cut))
        .collect()
}

/// One session with a model server: bytes in, packets parsed, answers queued.
struct ModelConnection {
    pod: String,
    cluster: FakeCluster,
    inbound: Vec<u8>,
    outbound: Vec<u8>,
    logged_in: bool,
}

impl Connection for ModelConnection {
    fn send(&mut self, bytes: &[u8]) -> Result<(), ExchangeError> {
        if !self.cluster.reachable(&self.pod) {
            return Err(ExchangeError::Closed);
        }
        self.inbound.extend_from_slice(bytes);
        while self.inbound.len() >= 4 {
            let length = usize::from(self.inbound[0])
                | usize::from(self.inbound[1]) << 8
                | usize::from(self.inbound[2]) << 16;
            if self.inbound.len() < 4 + length {
                break;
            }
            let payload: Vec<u8> = self.inbound.drain(..4 + length).skip(4).collect();
            if !self.logged_in {
                self.logged_in = true;
                self.outbound.extend(ok(2));
            } else if payload.first() == Some(&0x03) {
                let sql = String::from_utf8_lossy(&payload[1..]).into_owned();
                let reply = self.cluster.answer(&self.pod, &sql);
                self.outbound.extend(reply);
            }
        }
        Ok(())
    }

    fn receive(&mut self, max_bytes: u32, _timeout_ms: u32) -> Result<Vec<u8>, ExchangeError> {
        if self.outbound.is_empty() {
            return Err(ExchangeError::Timeout);
        }
        let n = (max_bytes as usize).min(self.outbound.len());
        Ok(self.outbound.drain(..n).collect())
    }
}

impl AppCall for FakeCluster {
    fn call(&mut self, _: &AppCallRequest) -> Result<AppCallResponse, AppCallError> {
        Err(AppCallError::Refused("the model speaks MySQL only".into()))
    }

    /// The passwords of `db-credentials` (the servers accept any login).
    fn credential(&mut self, secret: &str, key: &str) -> Result<Credential, CredentialError> {
        if secret != "db-credentials" {
            return Err(CredentialError::Refused(format!(
                "`{secret}` is not granted"
            )));
        }
        Ok(Credential::new(format!("{key}-value")))
    }

    fn connect(&mut self, pod: &str, port: &str) -> Result<Session, ExchangeError> {
        if !self.reachable(pod) {
            return Err(ExchangeError::Unreachable(format!(
                "{pod} is down or cut off"
            )));
        }
        Ok(Session::new(
            pod,
            port,
            Box::new(ModelConnection {
                pod: pod.to_owned(),
                cluster: self.clone(),
                inbound: Vec::new(),
                outbound: greeting(),
                logged_in: false,
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use policy_host_sdk::testing::{Harness, observation};
    use policy_host_sdk::{Action, Child, Decision, Observation};
    use serde_json::{Value, json};

    use super::*;
    use crate::{MariaDbPlugin, children};

    /// The plugin against the model, decision after decision, as the host would run it.
    struct Run {
        harness: Harness<MariaDbPlugin, FakeCluster>,
        cluster: FakeCluster,
        observed: Observation,
        /// Pods whose server stays down (their Pod Pending) until released.
        held_down: BTreeSet<String>,
        /// Pods whose network is cut: the server runs, the Pod is Running but not Ready.
        cut_off: BTreeSet<String>,
        events: Vec<String>,
        /// Pods the plugin deleted, in order.
        deleted: Vec<String>,
        /// What the decisions added to the failovers counter (each was carried out).
        failovers: u64,
    }

    impl Run {
        fn new(replicas: i32) -> Run {
            let cluster = FakeCluster::default();
            Run {
                harness: Harness::with_app(cluster.clone()),
                cluster,
                observed: observation(json!({
                    "apiVersion": "mariadb.policy-host.io/v1alpha1",
                    "kind": "MariaDBCluster",
                    "metadata": { "name": "db", "generation": 1 },
                    "spec": { "replicas": replicas }
                }))
                .build(),
                held_down: BTreeSet::new(),
                cut_off: BTreeSet::new(),
                events: Vec::new(),
                deleted: Vec::new(),
                failovers: 0,
            }
        }

        /// Replication runs, then one decision, carried out (its status only if `keep_status`).
        fn step_keeping(&mut self, keep_status: bool) -> Decision {
            self.cluster.tick();
            let decision = self.harness.reconcile(&self.observed).expect("decides");
            let writable = self.cluster.writable();
            assert!(writable.len() <= 1, "two servers take writes: {writable:?}");
            self.events
                .extend(decision.events().iter().map(|e| e.reason.clone()));
            self.failovers += decision.counted(&crate::metrics::FAILOVERS, &[]);
            let mut carried = decision.clone();
            if !keep_status {
                carried
                    .actions
                    .retain(|a| !matches!(a, Action::SetStatus(_)));
            }
            let acted = self.harness.act(&self.observed, &carried);
            // A deleted Pod's server stops; its data stays on its claim.
            for action in &carried.actions {
                if let Action::Delete { kind, name } = action
                    && kind.kind == "Pod"
                {
                    self.cluster.kill(name);
                    self.deleted.push(name.clone());
                }
            }
            self.observed = self.pods_as_the_node_runs_them(acted);
            decision
        }

        fn step(&mut self) -> Decision {
            self.step_keeping(true)
        }

        fn steps(&mut self, n: usize) {
            for _ in 0..n {
                self.step();
            }
        }

        /// Every Pod runs its server (started on its old data), but those held down.
        fn pods_as_the_node_runs_them(&self, mut observed: Observation) -> Observation {
            for child in &mut observed.children {
                if child.kind.kind != "Pod" {
                    continue;
                }
                let mut pod: Value = serde_json::from_str(&child.object).expect("a Pod");
                let name = pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                pod["status"] = if self.held_down.contains(&name) {
                    json!({ "phase": "Pending" })
                } else if self.cut_off.contains(&name) {
                    json!({
                        "phase": "Running",
                        "conditions": [{ "type": "Ready", "status": "False" }]
                    })
                } else {
                    let ordinal = children::ordinal("db", &name).unwrap_or(0);
                    self.cluster.start(&name, ordinal + 1);
                    json!({
                        "phase": "Running",
                        "conditions": [{ "type": "Ready", "status": "True" }]
                    })
                };
                child.object = pod.to_string();
            }
            observed
        }

        /// The Pod of `pod` is deleted and its server killed; it stays down until released.
        fn kill(&mut self, pod: &str) {
            self.cluster.kill(pod);
            self.held_down.insert(pod.to_owned());
            self.observed
                .children
                .retain(|c: &Child| !(c.kind.kind == "Pod" && c.name().as_deref() == Some(pod)));
        }

        /// Cuts `pod`'s network (its readiness probe fails from now on) or heals it.
        fn cut(&mut self, pod: &str, cut: bool) {
            self.cluster.cut(pod, cut);
            if cut {
                self.cut_off.insert(pod.to_owned());
            } else {
                self.cut_off.remove(pod);
            }
            self.observed = self.pods_as_the_node_runs_them(self.observed.clone());
        }

        fn release(&mut self, pod: &str) {
            self.held_down.remove(pod);
            self.observed = self.pods_as_the_node_runs_them(self.observed.clone());
        }

        fn status(&self) -> Value {
            let parent: Value = serde_json::from_str(&self.observed.parent).expect("JSON");
            parent["status"].clone()
        }

        /// The Pod `pod` as last applied, or `null`.
        fn pod(&self, pod: &str) -> Value {
            self.observed
                .children
                .iter()
                .find(|c| c.kind.kind == "Pod" && c.name().as_deref() == Some(pod))
                .and_then(|c| serde_json::from_str::<Value>(&c.object).ok())
                .unwrap_or_default()
        }

        fn role(&self, pod: &str) -> String {
            self.pod(pod)["metadata"]["labels"][children::ROLE_LABEL]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }

        fn promotions(&self) -> u32 {
            self.cluster.0.borrow().promotions
        }
    }

    fn converged(replicas: i32) -> Run {
        let mut run = Run::new(replicas);
        run.steps(8);
        assert_eq!(run.status()["currentPrimary"], "db-0", "{}", run.status());
        assert_eq!(run.status()["readyReplicas"], replicas, "{}", run.status());
        run
    }

    #[test]
    fn a_new_cluster_converges_to_one_primary_and_replicas_following_it_and_stays_put() {
        let mut run = converged(2);
        assert_eq!(run.cluster.writable(), ["db-0"]);
        for replica in ["db-1", "db-2"] {
            assert_eq!(
                run.cluster.replicates_from(replica).as_deref(),
                Some("db-0")
            );
            assert_eq!(run.role(replica), "replica");
        }
        assert_eq!(run.role("db-0"), "primary");
        let degraded = run.status()["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Degraded").cloned())
            .unwrap_or_default();
        assert_eq!(degraded["status"], "False", "{degraded}");
        let written = run
            .cluster
            .write("db-0")
            .expect("acknowledged by a replica");
        run.steps(1);
        assert!(run.cluster.executed("db-2").contains(&written));
        let before = run.status();
        let again = run.step();
        assert_eq!(
            run.status(),
            before,
            "a settled cluster's status does not move"
        );
        assert_eq!(
            again.requeue_after_ms,
            Some(crate::reconcile::REQUEUE_STEADY_MS)
        );
        assert_eq!(run.promotions(), 1);
    }

    #[test]
    fn a_failover_keeps_every_acknowledged_write_and_never_two_writable_servers() {
        let mut run = converged(2);
        let mut acknowledged: Vec<Transaction> = (0..3)
            .map(|_| run.cluster.write("db-0").expect("acknowledged"))
            .collect();
        // db-1 falls behind; db-2 retrieves the last writes but has not applied them.
        run.cluster.stop_io("db-1");
        run.cluster.stop_sql("db-2");
        acknowledged.extend((0..2).map(|_| run.cluster.write("db-0").expect("acknowledged")));
        run.kill("db-0");
        run.steps(8);
        assert_eq!(run.status()["currentPrimary"], "db-2", "{}", run.status());
        assert_eq!(run.cluster.writable(), ["db-2"]);
        assert_eq!(run.promotions(), 2, "one failover, one promotion");
        for pod in ["db-1", "db-2"] {
            let executed = run.cluster.executed(pod);
            for t in &acknowledged {
                assert!(executed.contains(t), "{pod} lost acknowledged {t:?}");
            }
        }
        assert_eq!(run.cluster.replicates_from("db-1").as_deref(), Some("db-2"));
        for event in ["Fencing", "Failover"] {
            assert!(
                run.events.iter().any(|e| e == event),
                "{event} in {:?}",
                run.events
            );
        }
        // Counted once, in the decision that promoted, over the eight decisions around it.
        assert_eq!(run.failovers, 1, "failovers counted: {:?}", run.events);
        // The old primary comes back on its data and rejoins as a replica.
        run.release("db-0");
        run.steps(4);
        assert_eq!(run.cluster.replicates_from("db-0").as_deref(), Some("db-2"));
        assert_eq!(run.role("db-0"), "replica");
        assert_eq!(run.cluster.writable(), ["db-2"]);
        let written = run
            .cluster
            .write("db-2")
            .expect("the new primary takes writes");
        run.steps(1);
        assert!(run.cluster.executed("db-0").contains(&written));
        assert_eq!(run.failovers, 1, "the old primary's return is no failover");
    }

    #[test]
    fn a_switchover_promotes_the_target_after_it_caught_up_and_is_not_repeated() {
        let mut run = converged(2);
        let mut acknowledged: Vec<Transaction> = (0..3)
            .map(|_| run.cluster.write("db-0").expect("acknowledged"))
            .collect();
        let mut parent: Value = serde_json::from_str(&run.observed.parent).expect("JSON");
        parent["metadata"]["annotations"] = json!({ children::SWITCHOVER_ANNOTATION: "db-1" });
        run.observed.parent = parent.to_string();
        run.steps(4);
        assert_eq!(run.status()["currentPrimary"], "db-1", "{}", run.status());
        assert_eq!(run.status()["lastSwitchover"], "db-1");
        assert_eq!(run.cluster.writable(), ["db-1"]);
        assert_eq!(run.cluster.replicates_from("db-0").as_deref(), Some("db-1"));
        assert_eq!(run.cluster.replicates_from("db-2").as_deref(), Some("db-1"));
        assert_eq!(
            run.status()["errantReplicas"],
            Value::Null,
            "{}",
            run.status()
        );
        acknowledged.push(run.cluster.write("db-1").expect("acknowledged"));
        run.steps(3);
        for pod in ["db-0", "db-1", "db-2"] {
            let executed = run.cluster.executed(pod);
            for t in &acknowledged {
                assert!(executed.contains(t), "{pod} lacks acknowledged {t:?}");
            }
        }
        assert_eq!(run.promotions(), 2, "one switchover, one promotion");
        assert_eq!(run.status()["currentPrimary"], "db-1", "not switched back");
    }

    /// The only account the plugin's credentials give is root, whose `READ ONLY ADMIN` lets it
    /// write through `read_only`: a client writing as root to the primary while a switchover
    /// runs (a write before every statement the plugin sends) must not have a write
    /// acknowledged that the new primary lacks.
    #[test]
    fn a_switchover_under_a_writer_that_read_only_does_not_stop_keeps_every_acknowledged_write() {
        let mut run = converged(2);
        run.cluster.0.borrow_mut().admin_writes_to = Some("db-0".into());
        let mut parent: Value = serde_json::from_str(&run.observed.parent).expect("JSON");
        parent["metadata"]["annotations"] = json!({ children::SWITCHOVER_ANNOTATION: "db-1" });
        run.observed.parent = parent.to_string();
        run.steps(4);
        run.cluster.0.borrow_mut().admin_writes_to = None;
        run.steps(3);
        assert_eq!(run.status()["currentPrimary"], "db-1", "{}", run.status());
        let acknowledged = run.cluster.0.borrow().admin_acknowledged.clone();
        assert!(acknowledged.len() > 3, "the writer wrote: {acknowledged:?}");
        let executed = run.cluster.executed("db-1");
        let lost: Vec<_> = acknowledged
            .iter()
            .filter(|t| !executed.contains(t))
            .collect();
        assert!(
            lost.is_empty(),
            "acknowledged writes the new primary db-1 lacks: {lost:?} (it has {executed:?})"
        );
        assert_eq!(run.cluster.writable(), ["db-1"]);
    }

    #[test]
    fn a_promotion_whose_status_write_was_lost_is_adopted_not_repeated() {
        let mut run = converged(2);
        run.kill("db-0");
        let mut promoted_in = None;
        for step in 0..8 {
            let before = run.promotions();
            // Every status write of the failover is lost until a promotion happened.
            let keep = promoted_in.is_some();
            run.step_keeping(keep);
            if promoted_in.is_none() && run.promotions() > before {
                promoted_in = Some(step);
            }
        }
        assert!(
            promoted_in.is_some(),
            "a replica was promoted: {:?}",
            run.events
        );
        assert_eq!(
            run.promotions(),
            2,
            "one promotion for one failover: {:?}",
            run.events
        );
        let primary = run.cluster.writable();
        assert_eq!(primary.len(), 1);
        assert_eq!(run.status()["currentPrimary"], primary[0].as_str());
        assert!(
            run.events.iter().any(|e| e == "PrimaryAdopted"),
            "{:?}",
            run.events
        );
    }

    fn image(run: &Run, pod: &str) -> String {
        run.pod(pod)["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn a_rolling_update_restarts_each_server_once_the_primary_last_and_keeps_every_acknowledged_write()
     {
        let mut run = converged(2);
        let mut acknowledged: Vec<Transaction> = (0..3)
            .map(|_| run.cluster.write("db-0").expect("acknowledged"))
            .collect();
        let mut parent: Value = serde_json::from_str(&run.observed.parent).expect("JSON");
        parent["spec"]["version"] = json!("10.11.9");
        parent["metadata"]["generation"] = json!(2);
        run.observed.parent = parent.to_string();
        let pods = ["db-0", "db-1", "db-2"];
        for _ in 0..40 {
            run.step();
            // A client writes on through the update, to whichever server takes writes.
            if let Some(writer) = run.cluster.writable().first().cloned()
                && let Some(t) = run.cluster.write(&writer)
            {
                acknowledged.push(t);
            }
            let done = pods.iter().all(|p| image(&run, p) == "mariadb:10.11.9")
                && run.status()["readyReplicas"] == 2
                && run.status()["phase"] == "Healthy";
            if done {
                break;
            }
        }
        for pod in pods {
            assert_eq!(image(&run, pod), "mariadb:10.11.9", "{pod} not updated");
        }
        assert_eq!(
            run.deleted,
            ["db-1", "db-2", "db-0"],
            "each server restarted once, the replicas first, the primary last"
        );
        assert_eq!(run.status()["currentPrimary"], "db-1", "{}", run.status());
        assert_eq!(run.cluster.writable(), ["db-1"]);
        assert_eq!(run.promotions(), 2, "one election, one switchover");
        run.steps(2);
        for pod in pods {
            let executed = run.cluster.executed(pod);
            for t in &acknowledged {
                assert!(executed.contains(t), "{pod} lacks acknowledged {t:?}");
            }
        }
        assert!(acknowledged.len() > 6, "writes went on during the update");
        assert!(run.events.iter().any(|e| e == "RollingUpdate"));
    }

    #[test]
    fn replicas_of_a_busy_primary_are_not_taken_for_errant_and_keep_replicating() {
        let mut run = converged(2);
        run.cluster.0.borrow_mut().writes_between_probes = true;
        for _ in 0..5 {
            run.step();
            // A replica that applied the primary's writes made after the primary's probe holds
            // nothing the primary lacks.
            let errant = &run.status()["errantReplicas"];
            assert!(errant.as_array().is_none_or(Vec::is_empty), "{errant}");
            for replica in ["db-1", "db-2"] {
                assert_eq!(
                    run.cluster.replicates_from(replica).as_deref(),
                    Some("db-0"),
                    "{replica} keeps replicating"
                );
            }
        }
        assert!(
            !run.events.iter().any(|e| e == "ErrantReplica"),
            "{:?}",
            run.events
        );
    }

    #[test]
    fn an_old_primary_back_with_a_write_no_replica_acknowledged_is_quarantined() {
        let mut run = converged(2);
        run.cluster.write("db-0").expect("acknowledged");
        run.cluster.stop_io("db-1");
        run.cluster.stop_io("db-2");
        assert_eq!(
            run.cluster.write("db-0"),
            None,
            "no replica retrieved it: never acknowledged (it is in db-0's binlog)"
        );
        run.kill("db-0");
        run.steps(6);
        assert_eq!(run.status()["currentPrimary"], "db-1", "{}", run.status());
        run.release("db-0");
        run.steps(3);
        assert_eq!(
            run.status()["errantReplicas"],
            json!(["db-0"]),
            "{}",
            run.status()
        );
        assert_eq!(run.role("db-0"), "errant");
        assert_eq!(run.cluster.writable(), ["db-1"]);
        assert_eq!(run.cluster.replicates_from("db-0"), None);
        assert!(
            run.events.iter().any(|e| e == "ErrantReplica"),
            "{:?}",
            run.events
        );
    }

    /// The primary cut off the network with a client's commit waiting for an acknowledgement
    /// that cannot come (semi-sync never falls back): when the network heals, the old primary
    /// — still writable, semi-sync on — is fenced although that commit holds `read_only` back
    /// (the real server blocks; a loop of failed decisions left it writable beside the new
    /// primary for minutes on the real node), and the waiting client never gets an OK for a
    /// write the new primary lacks.
    #[test]
    fn a_primary_cut_off_with_a_commit_waiting_is_fenced_when_healed_and_the_commit_never_acknowledged()
     {
        let mut run = converged(2);
        let acknowledged: Vec<Transaction> = (0..3)
            .map(|_| run.cluster.write("db-0").expect("acknowledged"))
            .collect();
        run.cut("db-0", true);
        assert_eq!(
            run.cluster.write("db-0"),
            None,
            "a client beside the cut-off primary: its commit waits for an acknowledgement"
        );
        run.steps(6);
        let primary = run.status()["currentPrimary"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(primary == "db-1" || primary == "db-2", "{}", run.status());
        run.cut("db-0", false);
        run.steps(4);
        assert_eq!(run.cluster.writable(), std::slice::from_ref(&primary));
        assert_eq!(
            run.status()["errantReplicas"],
            json!(["db-0"]),
            "{}",
            run.status()
        );
        assert_eq!(run.role("db-0"), "errant");
        assert!(
            run.events.iter().any(|e| e == "OldPrimaryFenced"),
            "{:?}",
            run.events
        );
        let late = run.cluster.0.borrow().acknowledged_late.clone();
        let executed = run.cluster.executed(&primary);
        for t in acknowledged.iter().chain(&late) {
            assert!(
                executed.contains(t),
                "{t:?} was acknowledged and the new primary {primary} lacks it"
            );
        }
    }
}
