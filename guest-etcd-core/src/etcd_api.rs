//! What the plugin asks etcd, through the host's app-call: the [`EtcdApi`] trait, the JSON
//! encoding of etcd's gRPC-gateway endpoints, and [`GatewayEtcdApi`], the trait over any
//! [`AppCall`] client (in the plugin: the host's import; in tests: a closure or a script).
//!
//! The gateway (`/v3/...`, on the member's client port) encodes protobuf as JSON with the
//! proto field names: `ID`, `peerURLs`, `isLearner`, `header.cluster_id`, and 64-bit
//! integers as decimal strings. Defaults are omitted (`isLearner: false` and the empty
//! `name` of a member that has not started yet do not appear), so every field is optional
//! here and numbers are accepted both as strings and as JSON numbers.

use policy_host_sdk::log;
use policy_host_sdk::{AppCall, AppCallRequest, AppCallResponse, Method, TlsClient};
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

/// The named container port etcd serves clients (and the gateway) on.
pub const CLIENT_PORT_NAME: &str = "client";

/// One etcd member, as `member list` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Member {
    /// Member ID.
    #[serde(rename = "ID", alias = "id", default, deserialize_with = "de_u64")]
    pub id: u64,
    /// Member name; empty until the member has started.
    #[serde(default)]
    pub name: String,
    /// Peer URLs.
    #[serde(rename = "peerURLs", alias = "peerUrls", alias = "peer_urls", default)]
    pub peer_urls: Vec<String>,
    /// Client URLs; empty until the member has started.
    #[serde(
        rename = "clientURLs",
        alias = "clientUrls",
        alias = "client_urls",
        default
    )]
    pub client_urls: Vec<String>,
    /// Whether the member is a non-voting learner.
    #[serde(rename = "isLearner", alias = "is_learner", default)]
    pub is_learner: bool,
}

impl Member {
    /// A member has started once it published its name (etcd fills it in on first start).
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }
}

/// The members of a cluster, with the ID of the cluster that answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberList {
    /// etcd's cluster ID, from the response header.
    pub cluster_id: u64,
    /// All members, voters and learners.
    pub members: Vec<Member>,
}

/// Result of `member add`: the new member and the membership including it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberAdded {
    /// The member just added (not started, so its name is empty).
    pub member: Member,
    /// The whole membership after the addition.
    pub list: MemberList,
}

/// What `maintenance status` says about the member that answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointStatus {
    /// etcd server version, e.g. `3.6.16`.
    pub version: String,
    /// ID of the member that answered.
    pub member_id: u64,
    /// ID of the current leader (0 when there is none).
    pub leader: u64,
    /// Whether the answering member is a learner.
    pub is_learner: bool,
    /// Alarms and errors the member reports.
    pub errors: Vec<String>,
    /// The store's current revision (`header.revision`).
    pub revision: i64,
    /// Size of the member's database file in bytes (`dbSize`).
    pub db_size: i64,
    /// Bytes of that file in use (`dbSizeInUse`); the rest is free pages a defragmentation
    /// gives back.
    pub db_size_in_use: i64,
}

impl EndpointStatus {
    /// Whether the cluster has the NOSPACE alarm raised (the database reached its quota and
    /// etcd takes no more writes): alarms are cluster-wide, any member reports them.
    pub fn no_space(&self) -> bool {
        self.errors.iter().any(|e| e.contains("NOSPACE"))
    }

    /// Percentage of the database file that is free pages (0 when unknown).
    pub fn fragmentation_percent(&self) -> i64 {
        if self.db_size <= 0 || self.db_size_in_use <= 0 {
            return 0;
        }
        (self.db_size - self.db_size_in_use).max(0) * 100 / self.db_size
    }
}

/// etcd's hash of its key-value store up to a revision (`maintenance hashkv`): members that
/// hold the same history up to that revision give the same hash.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvHash {
    /// The hash.
    pub hash: u32,
    /// The revision the store was compacted at when hashed (-1: never); a member compacted
    /// past the asked revision cannot hash it.
    pub compact_revision: i64,
}

/// Why a request to etcd did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdError {
    /// No answer: the pod is not reachable, the host refused, or it timed out.
    Unreachable(String),
    /// etcd answered and refused, e.g. `etcdserver: can only promote a learner member which
    /// is in sync with leader`. `code` is the gRPC status code when the gateway gave one.
    Rejected {
        /// HTTP status of the gateway's answer.
        http_status: u16,
        /// gRPC status code, if present.
        code: Option<i64>,
        /// etcd's message.
        message: String,
    },
    /// The answer was not the JSON we expect.
    BadResponse(String),
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::Unreachable(why) => write!(f, "etcd unreachable: {why}"),
            EtcdError::Rejected {
                http_status,
                message,
                ..
            } => write!(f, "etcd refused (HTTP {http_status}): {message}"),
            EtcdError::BadResponse(why) => write!(f, "unexpected answer from etcd: {why}"),
        }
    }
}

/// What the decision logic asks etcd. Every call names the pod to ask (a member of the
/// cluster the parent owns); membership calls go to whichever member answered the list.
pub trait EtcdApi {
    /// `member list`.
    fn member_list(&mut self, pod: &str) -> Result<MemberList, EtcdError>;
    /// `member add` with these peer URLs, as a learner when `is_learner`.
    fn member_add(
        &mut self,
        pod: &str,
        peer_urls: &[String],
        is_learner: bool,
    ) -> Result<MemberAdded, EtcdError>;
    /// `member remove` by ID.
    fn member_remove(&mut self, pod: &str, id: u64) -> Result<MemberList, EtcdError>;
    /// `member promote` of a learner; refused until the learner has caught up.
    fn member_promote(&mut self, pod: &str, id: u64) -> Result<MemberList, EtcdError>;
    /// `maintenance status` of the member serving `pod`.
    fn status(&mut self, pod: &str) -> Result<EndpointStatus, EtcdError>;
    /// `move-leader`: asks the leader, served by `pod`, to hand leadership to member
    /// `target` and waits until it has. etcd refuses it when `pod` is not the leader.
    fn move_leader(&mut self, pod: &str, target: u64) -> Result<(), EtcdError>;
    /// `maintenance hashkv` at `revision` of the etcd serving `pod`.
    fn hash_kv(&mut self, pod: &str, revision: i64) -> Result<KvHash, EtcdError>;
    /// `compaction` of the key-value history up to `revision`, physical (waits until the
    /// space is free to be reused). Compacting at or below the last compaction is a no-op.
    fn compact(&mut self, pod: &str, revision: i64) -> Result<(), EtcdError>;
    /// `defrag` of the member serving `pod`: its database file shrinks to what is in use. The
    /// member answers nothing else meanwhile.
    fn defragment(&mut self, pod: &str) -> Result<(), EtcdError>;
    /// `alarm disarm` of NOSPACE for every member.
    fn disarm_no_space(&mut self, pod: &str) -> Result<(), EtcdError>;
    /// From now on, reach members over TLS as `tls` says (a cluster with `spec.tls`). Fakes
    /// that model no transport ignore it.
    fn use_tls(&mut self, tls: MemberTls) {
        let _ = tls;
    }
}

/// How calls reach the members of a TLS cluster: with the operator's client certificate from
/// `secret` (read by the host), checking each member's certificate for its DNS name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberTls {
    /// The Secret with the operator's client certificate (`spec.tls.operatorSecret`).
    pub secret: String,
    /// What follows the pod name in a member's DNS name: `<cluster>.<namespace>.svc`.
    pub host_suffix: String,
}

impl MemberTls {
    /// What a call to `pod` carries: the Secret, and the pod's DNS name as the server name.
    pub fn for_pod(&self, pod: &str) -> TlsClient {
        TlsClient {
            secret: self.secret.clone(),
            server_name: format!("{pod}.{}", self.host_suffix),
        }
    }
}

fn de_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum StringOrNumber {
        String(String),
        Number(u64),
    }
    match StringOrNumber::deserialize(d)? {
        StringOrNumber::Number(n) => Ok(n),
        StringOrNumber::String(s) if s.is_empty() => Ok(0),
        StringOrNumber::String(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

/// int64 fields, which the gateway encodes as strings (JSON numbers accepted too).
fn de_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum StringOrNumber {
        String(String),
        Number(i64),
    }
    match StringOrNumber::deserialize(d)? {
        StringOrNumber::Number(n) => Ok(n),
        StringOrNumber::String(s) if s.is_empty() => Ok(0),
        StringOrNumber::String(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

#[derive(Deserialize, Default)]
struct Header {
    #[serde(default, alias = "clusterId", deserialize_with = "de_u64")]
    cluster_id: u64,
    #[serde(default, alias = "memberId", deserialize_with = "de_u64")]
    member_id: u64,
    #[serde(default, deserialize_with = "de_i64")]
    revision: i64,
}

#[derive(Deserialize)]
struct MembersResponse {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    members: Vec<Member>,
}

#[derive(Deserialize)]
struct AddResponse {
    #[serde(default)]
    header: Header,
    member: Option<Member>,
    #[serde(default)]
    members: Vec<Member>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusResponse {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    version: String,
    #[serde(default, deserialize_with = "de_u64")]
    leader: u64,
    #[serde(default, alias = "is_learner")]
    is_learner: bool,
    #[serde(default)]
    errors: Vec<String>,
    #[serde(default, alias = "db_size", deserialize_with = "de_i64")]
    db_size: i64,
    #[serde(default, alias = "db_size_in_use", deserialize_with = "de_i64")]
    db_size_in_use: i64,
}

#[derive(Deserialize, Default)]
struct AlarmResponse {
    #[serde(default)]
    alarms: Vec<AlarmMember>,
}

#[derive(Deserialize)]
struct AlarmMember {
    #[serde(default, rename = "memberID", deserialize_with = "de_u64")]
    member_id: u64,
    /// `NOSPACE`, `CORRUPT` (the gateway writes enum names).
    #[serde(default)]
    alarm: String,
}

#[derive(Deserialize)]
struct HashKvResponse {
    // uint32: a JSON number; omitted when 0, as the gateway omits defaults.
    #[serde(default)]
    hash: u32,
    #[serde(default, alias = "compactRevision", deserialize_with = "de_i64")]
    compact_revision: i64,
}

#[derive(Deserialize)]
struct GatewayError {
    #[serde(default)]
    code: Option<i64>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// Path of `member list`.
pub const MEMBER_LIST_PATH: &str = "/v3/cluster/member/list";
/// Path of `member add`.
pub const MEMBER_ADD_PATH: &str = "/v3/cluster/member/add";
/// Path of `member remove`.
pub const MEMBER_REMOVE_PATH: &str = "/v3/cluster/member/remove";
/// Path of `member promote`.
pub const MEMBER_PROMOTE_PATH: &str = "/v3/cluster/member/promote";
/// Path of `maintenance status`.
pub const STATUS_PATH: &str = "/v3/maintenance/status";
/// Path of `move-leader` (etcd's `MoveLeader` RPC, since 3.3).
pub const MOVE_LEADER_PATH: &str = "/v3/maintenance/transfer-leadership";
/// Path of `maintenance hashkv`.
pub const HASH_KV_PATH: &str = "/v3/maintenance/hashkv";
/// Path of `compaction`.
pub const COMPACTION_PATH: &str = "/v3/kv/compaction";
/// Path of `defrag`.
pub const DEFRAGMENT_PATH: &str = "/v3/maintenance/defragment";
/// Path of `alarm` (list, activate, deactivate).
pub const ALARM_PATH: &str = "/v3/maintenance/alarm";

/// Body of `member list`: linearizable (etcd 3.5+), so the list goes through the leader and
/// includes every committed change. A member's local, possibly lagging view could miss a
/// member just added, and the plugin would take that member's new pod for a stray one.
/// Without a quorum the list fails, which is the safe answer: nothing then changes.
pub fn encode_member_list() -> Value {
    json!({"linearizable": true})
}

/// Body of `member add`.
pub fn encode_member_add(peer_urls: &[String], is_learner: bool) -> Value {
    json!({"peerURLs": peer_urls, "isLearner": is_learner})
}

/// Body of `member remove` and `member promote`: the ID as a decimal string, as the
/// gateway encodes uint64.
pub fn encode_member_id(id: u64) -> Value {
    json!({"ID": id.to_string()})
}

/// Body of `move-leader`: the transferee's ID as a decimal string.
pub fn encode_move_leader(target: u64) -> Value {
    json!({"targetID": target.to_string()})
}

/// Body of `maintenance hashkv`: the revision as a decimal string, as the gateway encodes
/// int64.
pub fn encode_hash_kv(revision: i64) -> Value {
    json!({"revision": revision.to_string()})
}

/// Turns a non-2xx gateway answer into [`EtcdError::Rejected`]; checks the status first.
fn check_status(response: &AppCallResponse) -> Result<(), EtcdError> {
    if response.is_success() {
        return Ok(());
    }
    let parsed: Option<GatewayError> = serde_json::from_str(&response.body).ok();
    let (code, message) = match parsed {
        Some(e) => (
            e.code,
            e.message
                .or(e.error)
                .unwrap_or_else(|| response.body.clone()),
        ),
        None => (None, response.body.clone()),
    };
    Err(EtcdError::Rejected {
        http_status: response.status,
        code,
        message: truncate(&message, 300),
    })
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

fn parse<'a, T: Deserialize<'a>>(what: &str, body: &'a str) -> Result<T, EtcdError> {
    serde_json::from_str(body)
        .map_err(|e| EtcdError::BadResponse(format!("{what}: {e}: {}", truncate(body, 200))))
}

/// Decodes the answer to `member list`, `member remove` or `member promote`.
pub fn decode_member_list(response: &AppCallResponse) -> Result<MemberList, EtcdError> {
    check_status(response)?;
    let r: MembersResponse = parse("member list", &response.body)?;
    Ok(MemberList {
        cluster_id: r.header.cluster_id,
        members: r.members,
    })
}

/// Decodes the answer to `member add`.
pub fn decode_member_add(response: &AppCallResponse) -> Result<MemberAdded, EtcdError> {
    check_status(response)?;
    let r: AddResponse = parse("member add", &response.body)?;
    let member = r
        .member
        .ok_or_else(|| EtcdError::BadResponse("member add: no `member` in the answer".into()))?;
    Ok(MemberAdded {
        member,
        list: MemberList {
            cluster_id: r.header.cluster_id,
            members: r.members,
        },
    })
}

/// Decodes the answer to `maintenance status`.
pub fn decode_status(response: &AppCallResponse) -> Result<EndpointStatus, EtcdError> {
    check_status(response)?;
    let r: StatusResponse = parse("maintenance status", &response.body)?;
    Ok(EndpointStatus {
        version: r.version,
        member_id: r.header.member_id,
        leader: r.leader,
        is_learner: r.is_learner,
        errors: r.errors,
        revision: r.header.revision,
        db_size: r.db_size,
        db_size_in_use: r.db_size_in_use,
    })
}

/// Decodes the answer to `maintenance hashkv`.
pub fn decode_hash_kv(response: &AppCallResponse) -> Result<KvHash, EtcdError> {
    check_status(response)?;
    let r: HashKvResponse = parse("maintenance hashkv", &response.body)?;
    Ok(KvHash {
        hash: r.hash,
        compact_revision: r.compact_revision,
    })
}

/// [`EtcdApi`] over etcd's gRPC gateway, through an [`AppCall`] client to the members'
/// client port. Failed requests are logged: the decision only sees that a member did not
/// answer or refused.
pub struct GatewayEtcdApi<A> {
    app: A,
    tls: Option<MemberTls>,
}

impl<A: AppCall> GatewayEtcdApi<A> {
    /// Wraps an app-call client; calls are plain HTTP until [`EtcdApi::use_tls`].
    pub fn new(app: A) -> Self {
        GatewayEtcdApi { app, tls: None }
    }

    fn post(&mut self, pod: &str, path: &str, body: Value) -> Result<AppCallResponse, EtcdError> {
        let result = self.app.call(&AppCallRequest {
            pod: pod.to_owned(),
            port: CLIENT_PORT_NAME.to_owned(),
            method: Method::Post,
            path: path.to_owned(),
            body: Some(body.to_string()),
            tls: self.tls.as_ref().map(|tls| tls.for_pod(pod)),
        });
        match &result {
            Ok(response) if !response.is_success() => log::info(
                "etcd refused a request",
                &[
                    ("pod", pod),
                    ("path", path),
                    ("status", &response.status.to_string()),
                    ("body", &truncate(&response.body, 300)),
                ],
            ),
            Err(e) => log::debug(
                "etcd member did not answer",
                &[("pod", pod), ("path", path), ("error", &e.to_string())],
            ),
            Ok(_) => {}
        }
        result.map_err(|e| EtcdError::Unreachable(format!("pod {pod}: {e}")))
    }
}

impl<A: AppCall> EtcdApi for GatewayEtcdApi<A> {
    fn member_list(&mut self, pod: &str) -> Result<MemberList, EtcdError> {
        decode_member_list(&self.post(pod, MEMBER_LIST_PATH, encode_member_list())?)
    }

    fn member_add(
        &mut self,
        pod: &str,
        peer_urls: &[String],
        is_learner: bool,
    ) -> Result<MemberAdded, EtcdError> {
        let body = encode_member_add(peer_urls, is_learner);
        decode_member_add(&self.post(pod, MEMBER_ADD_PATH, body)?)
    }

    fn member_remove(&mut self, pod: &str, id: u64) -> Result<MemberList, EtcdError> {
        decode_member_list(&self.post(pod, MEMBER_REMOVE_PATH, encode_member_id(id))?)
    }

    fn member_promote(&mut self, pod: &str, id: u64) -> Result<MemberList, EtcdError> {
        decode_member_list(&self.post(pod, MEMBER_PROMOTE_PATH, encode_member_id(id))?)
    }

    fn status(&mut self, pod: &str) -> Result<EndpointStatus, EtcdError> {
        decode_status(&self.post(pod, STATUS_PATH, json!({}))?)
    }

    fn move_leader(&mut self, pod: &str, target: u64) -> Result<(), EtcdError> {
        check_status(&self.post(pod, MOVE_LEADER_PATH, encode_move_leader(target))?)
    }

    fn use_tls(&mut self, tls: MemberTls) {
        self.tls = Some(tls);
    }

    fn hash_kv(&mut self, pod: &str, revision: i64) -> Result<KvHash, EtcdError> {
        decode_hash_kv(&self.post(pod, HASH_KV_PATH, encode_hash_kv(revision))?)
    }

    fn compact(&mut self, pod: &str, revision: i64) -> Result<(), EtcdError> {
        let body = json!({"revision": revision.to_string(), "physical": true});
        match check_status(&self.post(pod, COMPACTION_PATH, body)?) {
            // Compacted at or past this revision already: what was asked holds.
            Err(EtcdError::Rejected { message, .. }) if message.contains("compacted") => Ok(()),
            other => other,
        }
    }

    fn defragment(&mut self, pod: &str) -> Result<(), EtcdError> {
        check_status(&self.post(pod, DEFRAGMENT_PATH, json!({}))?)
    }

    fn disarm_no_space(&mut self, pod: &str) -> Result<(), EtcdError> {
        // As `etcdctl alarm disarm` does: list the alarms, then deactivate each member's.
        let listed = self.post(pod, ALARM_PATH, json!({"action": "GET"}))?;
        check_status(&listed)?;
        let alarms: AlarmResponse = parse("alarm list", &listed.body)?;
        for alarm in alarms.alarms.iter().filter(|a| a.alarm == "NOSPACE") {
            let body = json!({"action": "DEACTIVATE", "memberID": alarm.member_id.to_string(), "alarm": "NOSPACE"});
            check_status(&self.post(pod, ALARM_PATH, body)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &str) -> AppCallResponse {
        AppCallResponse {
            status: 200,
            body: body.to_owned(),
        }
    }

    #[test]
    fn member_list_as_the_gateway_sends_it() {
        // Shape of etcd 3.5/3.6 gateway output: uint64 as strings, defaults omitted.
        let body = r#"{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","raft_term":"2"},
            "members":[
              {"ID":"10276657743932975437","name":"ex-0","peerURLs":["http://ex-0.ex.ns.svc:2380"],"clientURLs":["http://ex-0.ex.ns.svc:2379"]},
              {"ID":"3","peerURLs":["http://ex-1.ex.ns.svc:2380"],"isLearner":true}]}"#;
        let list = decode_member_list(&ok(body)).expect("decodes");
        assert_eq!(list.cluster_id, 14841639068965178418);
        assert_eq!(list.members.len(), 2);
        assert_eq!(list.members[0].id, 10276657743932975437);
        assert!(list.members[0].is_started() && !list.members[0].is_learner);
        assert!(!list.members[1].is_started() && list.members[1].is_learner);
    }

    #[test]
    fn numbers_are_accepted_as_json_numbers_too() {
        let body = r#"{"header":{"cluster_id":7},"members":[{"ID":42,"name":"a","peerURLs":[]}]}"#;
        let list = decode_member_list(&ok(body)).expect("decodes");
        assert_eq!((list.cluster_id, list.members[0].id), (7, 42));
    }

    #[test]
    fn member_add_answer_and_request() {
        let body = r#"{"header":{"cluster_id":"1"},"member":{"ID":"99","peerURLs":["http://p:2380"],"isLearner":true},
            "members":[{"ID":"1","name":"a","peerURLs":["http://a:2380"]},{"ID":"99","peerURLs":["http://p:2380"],"isLearner":true}]}"#;
        let added = decode_member_add(&ok(body)).expect("decodes");
        assert_eq!(added.member.id, 99);
        assert_eq!(added.list.members.len(), 2);
        assert_eq!(
            encode_member_add(&["http://p:2380".into()], true),
            json!({"peerURLs": ["http://p:2380"], "isLearner": true})
        );
        assert_eq!(
            encode_member_id(u64::MAX).to_string(),
            r#"{"ID":"18446744073709551615"}"#
        );
    }

    #[test]
    fn gateway_errors_become_rejections() {
        let response = AppCallResponse {
            status: 400,
            body: r#"{"error":"etcdserver: can only promote a learner member which is in sync with leader","code":9,"message":"etcdserver: can only promote a learner member which is in sync with leader"}"#.into(),
        };
        match decode_member_list(&response) {
            Err(EtcdError::Rejected { code, message, .. }) => {
                assert_eq!(code, Some(9));
                assert!(message.contains("in sync with leader"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode_member_list(&ok("not json")),
            Err(EtcdError::BadResponse(_))
        ));
    }

    #[test]
    fn status_answer() {
        let body = r#"{"header":{"cluster_id":"1","member_id":"5"},"version":"3.6.16","dbSize":"20480","leader":"5","raftIndex":"8","raftTerm":"2"}"#;
        let status = decode_status(&ok(body)).expect("decodes");
        assert_eq!(status.version, "3.6.16");
        assert_eq!((status.member_id, status.leader), (5, 5));
        assert_eq!((status.revision, status.db_size), (0, 20480));
    }

    #[test]
    fn status_and_hashkv_of_a_restored_snapshot_as_etcd_answers() {
        // Recorded from etcd 3.6.16 serving a restored snapshot (3.5 omits hash_revision).
        let status = r#"{"header":{"cluster_id":"12094687518987835939","member_id":"14871394678139879589","revision":"4","raft_term":"2"},"version":"3.6.16","dbSize":"20480","leader":"14871394678139879589","raftIndex":"3","raftTerm":"2","raftAppliedIndex":"3","dbSizeInUse":"16384","storageVersion":"3.6.0","dbSizeQuota":"2147483648","downgradeInfo":{}}"#;
        let status = decode_status(&ok(status)).expect("decodes");
        assert_eq!((status.revision, status.db_size), (4, 20480));
        let hash = r#"{"header":{"cluster_id":"12094687518987835939","revision":"4"},"hash":4178063679,"compact_revision":"-1","hash_revision":"4"}"#;
        assert_eq!(
            decode_hash_kv(&ok(hash)),
            Ok(KvHash {
                hash: 4178063679,
                compact_revision: -1
            })
        );
        assert_eq!(encode_hash_kv(4), json!({"revision": "4"}));
        let compacted = AppCallResponse {
            status: 400,
            body: r#"{"error":"mvcc: required revision has been compacted","code":11}"#.into(),
        };
        assert!(matches!(
            decode_hash_kv(&compacted),
            Err(EtcdError::Rejected { code: Some(11), .. })
        ));
    }

    #[test]
    fn gateway_api_sends_to_the_client_port() {
        let mut sent = Vec::new();
        let mut api = GatewayEtcdApi::new(|request: &AppCallRequest| {
            sent.push(request.clone());
            Ok(ok(r#"{"header":{"cluster_id":"1"},"members":[]}"#))
        });
        api.member_remove("ex-1", 12).expect("ok");
        api.member_list("ex-0").expect("ok");
        api.move_leader("ex-0", 7).expect("ok");
        assert_eq!(sent[0].pod, "ex-1");
        assert_eq!(sent[0].port, "client");
        assert_eq!(sent[0].path, MEMBER_REMOVE_PATH);
        assert_eq!(sent[0].body.as_deref(), Some(r#"{"ID":"12"}"#));
        assert_eq!(sent[1].path, MEMBER_LIST_PATH);
        assert_eq!(sent[2].path, MOVE_LEADER_PATH);
        assert_eq!(sent[2].body.as_deref(), Some(r#"{"targetID":"7"}"#));
        assert_eq!(sent[1].body.as_deref(), Some(r#"{"linearizable":true}"#));
    }

    #[test]
    fn a_tls_cluster_is_called_with_the_operator_secret_and_each_member_s_name() {
        let mut sent = Vec::new();
        let mut api = GatewayEtcdApi::new(|request: &AppCallRequest| {
            sent.push(request.clone());
            Ok(ok(r#"{"members":[]}"#))
        });
        api.member_list("ex-0").expect("plain call");
        api.use_tls(MemberTls {
            secret: "ex-operator".into(),
            host_suffix: "ex.ns.svc".into(),
        });
        api.member_list("ex-1").expect("TLS call");
        drop(api);
        assert_eq!(sent[0].tls, None, "plain HTTP until the cluster says TLS");
        assert_eq!(
            sent[1].tls,
            Some(TlsClient {
                secret: "ex-operator".into(),
                server_name: "ex-1.ex.ns.svc".into(),
            })
        );
    }
}
