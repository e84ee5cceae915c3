//! The one door out of the sandbox: an HTTP/JSON request from a plugin to a granted port of a
//! Pod its parent controls. Everything else is refused.
//!
//! The scope of a reconcile is fixed before the plugin runs, from the observation: the Pods
//! the parent controls (name → IP and named ports) and the ports the admin granted. A plugin
//! can therefore only reach what it could already see, which is the point.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::app_exchange::ExchangeRound;
use crate::app_tls::AppTls;
use crate::decide::contract::app_call::{CallError, Method, Request, Response, TlsClient};
use crate::decide::contract::exchange::ExchangeError;
use crate::policy_store::Grants;

/// How long one app-call may take before the plugin gets `timeout`.
pub const APP_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP client app-calls use: no proxy, rustls with the ring provider (installed here for
/// the process if none is yet, since reqwest is built without a default one).
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|error| {
            tracing::error!(%error, "cannot build the app-call HTTP client; app-calls will fail");
            reqwest::Client::new()
        })
}

/// Where one Pod can be reached.
#[derive(Clone, Debug, Default)]
pub struct PodEndpoint {
    /// `status.podIP`, if the Pod has one yet.
    pub ip: Option<String>,
    /// Container port name → number.
    pub named_ports: HashMap<String, u16>,
}

impl PodEndpoint {
    /// Reads the IP and named container ports of a Pod.
    pub fn from_pod(pod: &Pod) -> Self {
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty());
        let named_ports = pod
            .spec
            .iter()
            .flat_map(|spec| spec.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let name = p.name.clone()?;
                let number = u16::try_from(p.container_port).ok()?;
                Some((name, number))
            })
            .collect();
        Self { ip, named_ports }
    }

    fn resolve(&self, port: &str) -> Option<u16> {
        port.parse::<u16>()
            .ok()
            .or_else(|| self.named_ports.get(port).copied())
    }
}

/// A request and the answer it got.
pub type Exchange = (Request, Result<Response, CallError>);

/// One pod's scripted answers, by path.
type ScriptedPaths = HashMap<String, Result<Response, CallError>>;

/// Canned answers to app-calls, and a record of the calls a plugin made: the world of a plugin
/// run without a network (benchmarks, `policy-host simulate`, and shadow mode, where a candidate
/// plugin must decide without touching the real application).
///
/// Two kinds of answer: by pod and path (a hand-written script: method and body are recorded,
/// not matched), and by whole request (the replay of an [`AppCallRecorder`]: only the very
/// request the recorded run made gets its answer). Clones share the record, so a caller keeps
/// one clone to read what the plugin asked.
#[derive(Clone, Debug, Default)]
pub struct AppCallScript {
    /// pod → path → answer.
    answers: Arc<HashMap<String, ScriptedPaths>>,
    /// Whole requests and their answers, in the order they were recorded.
    replies: Arc<Vec<Exchange>>,
    /// Which `replies` were answered already: a request made twice gets the second answer the
    /// second time (a plugin polling until something changes sees the change).
    used: Arc<Mutex<Vec<bool>>>,
    calls: Arc<Mutex<Vec<Request>>>,
    /// Exchange rounds and their replies ([`crate::app_exchange`]), hand-written or recorded.
    rounds: Arc<Vec<ExchangeRound>>,
    /// Which `rounds` were answered already (as `used` for app-calls).
    rounds_used: Arc<Mutex<Vec<bool>>>,
    /// The exchange rounds answered so far, with the answer given.
    rounds_made: Arc<Mutex<Vec<ExchangeRound>>>,
}

impl AppCallScript {
    /// A script from `(pod, path, answer)` rows; a later row for the same pod and path wins.
    pub fn new(
        rows: impl IntoIterator<Item = (String, String, Result<Response, CallError>)>,
    ) -> Self {
        let mut answers: HashMap<String, ScriptedPaths> = HashMap::new();
        for (pod, path, answer) in rows {
            answers.entry(pod).or_default().insert(path, answer);
        }
        Self {
            answers: Arc::new(answers),
            ..Self::default()
        }
    }

    /// A script that answers exactly the requests in `replies` (pod, port, method, path and
    /// body must all match), each with its recorded answer.
    pub fn replaying(replies: Vec<Exchange>) -> Self {
        Self {
            used: Arc::new(Mutex::new(vec![false; replies.len()])),
            replies: Arc::new(replies),
            ..Self::default()
        }
    }

    /// The same script, also answering exchanges: each round's request (all the bytes the
    /// plugin sent before reading) gets its reply. A round without a port answers on any port.
    pub fn with_exchanges(mut self, rounds: impl IntoIterator<Item = ExchangeRound>) -> Self {
        let mut all: Vec<ExchangeRound> = self.rounds.as_ref().clone();
        all.extend(rounds);
        self.rounds_used = Arc::new(Mutex::new(vec![false; all.len()]));
        self.rounds = Arc::new(all);
        self
    }

    /// The calls answered so far (through any clone), in order.
    pub fn calls(&self) -> Vec<Request> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The exchange rounds answered so far (through any clone), in order, with the answer
    /// each got.
    pub fn exchanges(&self) -> Vec<ExchangeRound> {
        self.rounds_made
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Answers one exchange round: the first unused round with this pod, port and request,
    /// else the last such; anything else is unreachable, as an absent pod would be.
    pub(crate) fn answer_exchange(
        &self,
        pod: &str,
        port: &str,
        request: &[u8],
    ) -> Result<Vec<u8>, ExchangeError> {
        let equal: Vec<usize> = self
            .rounds
            .iter()
            .enumerate()
            .filter(|(_, round)| {
                round.pod == pod
                    && round.port.as_deref().is_none_or(|p| p == port)
                    && round.request == request
            })
            .map(|(index, _)| index)
            .collect();
        let chosen = equal.last().copied().map(|last| {
            // Never held across an await: a plain mutex is right here.
            let mut used = self.rounds_used.lock().unwrap_or_else(|p| p.into_inner());
            let index = equal
                .iter()
                .copied()
                .find(|&i| used.get(i).is_some_and(|u| !u))
                .unwrap_or(last);
            if let Some(flag) = used.get_mut(index) {
                *flag = true;
            }
            index
        });
        let reply = match chosen.and_then(|i| self.rounds.get(i)) {
            Some(round) => round.reply.clone(),
            None => Err(ExchangeError::Unreachable(format!(
                "no scripted exchange with pod `{pod}` port `{port}` for this request ({} bytes); a script cannot reach the application",
                request.len()
            ))),
        };
        if let Ok(mut made) = self.rounds_made.lock() {
            made.push(ExchangeRound {
                pod: pod.to_owned(),
                port: Some(port.to_owned()),
                request: request.to_vec(),
                reply: reply.clone(),
            });
        }
        reply
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.clear();
        }
    }

    /// Answers one request: first from the replies (the first unused equal request, else the
    /// last equal one), then by pod and path. Anything else is unreachable, as an absent pod
    /// would be.
    fn answer(&self, request: Request) -> Result<Response, CallError> {
        let answer = self.replay(&request).or_else(|| {
            self.answers
                .get(&request.pod)
                .and_then(|paths| paths.get(&request.path))
                .cloned()
        });
        let answer = answer.unwrap_or_else(|| {
            Err(CallError::Unreachable(if self.replies.is_empty() {
                format!(
                    "no scripted answer for pod `{}` path `{}`",
                    request.pod, request.path
                )
            } else {
                format!(
                    "the recorded run made no {:?} {} to pod `{}` port `{}` with this body; a replay cannot reach the application",
                    request.method, request.path, request.pod, request.port
                )
            }))
        });
        // Never held across an await: a plain mutex is right here.
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(request);
        }
        answer
    }

    fn replay(&self, request: &Request) -> Option<Result<Response, CallError>> {
        let equal: Vec<usize> = self
            .replies
            .iter()
            .enumerate()
            .filter(|(_, (recorded, _))| recorded == request)
            .map(|(index, _)| index)
            .collect();
        let last = *equal.last()?;
        let mut used = self.used.lock().ok()?;
        let index = equal
            .into_iter()
            .find(|&i| used.get(i).is_some_and(|u| !u))
            .unwrap_or(last);
        if let Some(flag) = used.get_mut(index) {
            *flag = true;
        }
        self.replies.get(index).map(|(_, answer)| answer.clone())
    }
}

/// The calls a live scope made and the answers they got, in order, so a second plugin can be
/// shown the same application without reaching it ([`AppCallRecorder::replay`]): shadow mode
/// runs the candidate on the active plugin's recorded answers. Clones share the record.
#[derive(Clone, Debug, Default)]
pub struct AppCallRecorder {
    exchanges: Arc<Mutex<Vec<Exchange>>>,
    rounds: Arc<Mutex<Vec<ExchangeRound>>>,
}

impl AppCallRecorder {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// The requests made so far, in order.
    pub fn calls(&self) -> Vec<Request> {
        self.exchanges
            .lock()
            .map(|e| e.iter().map(|(request, _)| request.clone()).collect())
            .unwrap_or_default()
    }

    /// The exchange rounds made so far, in order, with their replies.
    pub fn exchanges(&self) -> Vec<ExchangeRound> {
        self.rounds.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// A script that answers the recorded requests (and exchange rounds) with the recorded
    /// answers, and nothing else.
    pub fn replay(&self) -> AppCallScript {
        AppCallScript::replaying(self.exchanges.lock().map(|e| e.clone()).unwrap_or_default())
            .with_exchanges(self.exchanges())
    }

    /// Writes one exchange round (see [`crate::app_exchange`]).
    pub(crate) fn record_exchange(&self, round: ExchangeRound) {
        // Never held across an await: a plain mutex is right here.
        if let Ok(mut rounds) = self.rounds.lock() {
            rounds.push(round);
        }
    }

    fn record(&self, request: Request, answer: &Result<Response, CallError>) {
        // Never held across an await: a plain mutex is right here.
        if let Ok(mut exchanges) = self.exchanges.lock() {
            exchanges.push((request, answer.clone()));
        }
    }
}

/// What one reconcile's plugin may reach.
#[derive(Clone, Debug, Default)]
pub struct AppCallScope {
    parent: String,
    pods: HashMap<String, PodEndpoint>,
    grants: Grants,
    client: Option<reqwest::Client>,
    /// TLS for `call-tls`, with the parent's namespace (where its Secrets are read).
    tls: Option<(AppTls, String)>,
    script: Option<AppCallScript>,
    recorder: Option<AppCallRecorder>,
}

impl AppCallScope {
    /// A scope that refuses every call (used while a plugin describes itself).
    pub fn none() -> Self {
        Self::default()
    }

    /// A scope for one parent: its Pods and what the admin granted the plugin.
    pub fn new(
        parent: String,
        pods: HashMap<String, PodEndpoint>,
        grants: Grants,
        client: reqwest::Client,
    ) -> Self {
        Self {
            parent,
            pods,
            grants,
            client: Some(client),
            tls: None,
            script: None,
            recorder: None,
        }
    }

    /// The same scope, able to speak HTTPS with certificates from Secrets of `namespace` (the
    /// parent's).
    pub fn with_tls(mut self, tls: AppTls, namespace: String) -> Self {
        self.tls = Some((tls, namespace));
        self
    }

    /// The same scope, with every call and its answer (refusals included) written to
    /// `recorder`.
    pub fn recorded_by(mut self, recorder: AppCallRecorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// A scope with no network: every call is answered from `script` (and recorded there).
    /// Pods and grants are not checked, since no real pod is reached; use [`Self::new`]
    /// when the plugin's reach must be enforced.
    pub fn scripted(parent: String, script: AppCallScript) -> Self {
        Self {
            parent,
            script: Some(script),
            ..Self::default()
        }
    }

    /// `namespace/name` of the parent, for logs.
    pub fn parent_label(&self) -> &str {
        &self.parent
    }

    /// Checks the request against the scope, then sends it (over HTTPS with `tls`), or answers
    /// it from the script. Scripts and recordings match on the request alone: TLS is how a
    /// request travels, not what it asks.
    pub async fn call(
        &self,
        plugin: &str,
        request: Request,
        tls: Option<&TlsClient>,
        body_limit: usize,
    ) -> Result<Response, CallError> {
        if let Some(script) = &self.script {
            return script.answer(request);
        }
        let Some(recorder) = &self.recorder else {
            return self.call_live(plugin, request, tls, body_limit).await;
        };
        let answer = self
            .call_live(plugin, request.clone(), tls, body_limit)
            .await;
        recorder.record(request, &answer);
        answer
    }

    async fn call_live(
        &self,
        plugin: &str,
        request: Request,
        tls: Option<&TlsClient>,
        body_limit: usize,
    ) -> Result<Response, CallError> {
        let (client, url) = self.route(&request, tls).await.inspect_err(|error| {
            tracing::warn!(
                plugin,
                parent = %self.parent,
                pod = %request.pod,
                port = %request.port,
                path = %request.path,
                tls = tls.is_some(),
                %error,
                "app-call refused"
            );
        })?;
        let method = match request.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Delete => reqwest::Method::DELETE,
        };
        let mut builder = client
            .request(method, &url)
            .timeout(APP_CALL_TIMEOUT)
            .header("accept", "application/json");
        if let Some(body) = request.body {
            builder = builder
                .header("content-type", "application/json")
                .body(body);
        }
        let response = builder.send().await.map_err(|e| {
            if e.is_timeout() {
                CallError::Timeout
            } else {
                CallError::Unreachable(format!("{url}: {e}"))
            }
        })?;
        let status = response.status().as_u16();
        let mut body = response
            .text()
            .await
            .map_err(|e| CallError::Unreachable(format!("{url}: reading the response: {e}")))?;
        if body.len() > body_limit {
            let mut cut = body_limit;
            while !body.is_char_boundary(cut) {
                cut -= 1;
            }
            body.truncate(cut);
        }
        Ok(Response { status, body })
    }

    /// The client to send the request with and its URL, or why it is refused.
    async fn route(
        &self,
        request: &Request,
        tls: Option<&TlsClient>,
    ) -> Result<(reqwest::Client, String), CallError> {
        let (host, port) = self.authorize(request)?;
        let Some(client) = &self.client else {
            return Err(CallError::Refused(
                "app-calls are not available here".to_string(),
            ));
        };
        let Some(tls) = tls else {
            return Ok((
                client.clone(),
                format!("http://{host}:{port}{}", request.path),
            ));
        };
        let Some((app_tls, namespace)) = &self.tls else {
            return Err(CallError::Refused(
                "TLS app-calls are not available here".to_string(),
            ));
        };
        let ip: std::net::IpAddr = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| {
                CallError::Unreachable(format!("pod `{}` has no usable IP: {host}", request.pod))
            })?;
        let (client, base) = app_tls
            .client_for(namespace, tls, std::net::SocketAddr::new(ip, port))
            .await?;
        Ok((client, format!("{base}{}", request.path)))
    }

    /// Resolves the request to a host and port, or says why it is refused.
    fn authorize(&self, request: &Request) -> Result<(String, u16), CallError> {
        let endpoint =
            self.authorize_endpoint(&request.pod, &request.port, &self.grants.app_call_ports)?;
        if !request.path.starts_with('/') {
            return Err(CallError::Refused(format!(
                "path `{}` must start with `/`",
                request.path
            )));
        }
        Ok(endpoint)
    }

    /// Resolves a port of a Pod the parent controls, granted in `granted` (the app-call or
    /// the exchange ports), to `host` (an IP, bracketed if v6) and port number, or says why it
    /// is refused: the one check shared by app-calls and exchanges ([`crate::app_exchange`]).
    pub(crate) fn authorize_endpoint(
        &self,
        pod_name: &str,
        port_name: &str,
        granted: &[String],
    ) -> Result<(String, u16), CallError> {
        let pod = self.pods.get(pod_name).ok_or_else(|| {
            CallError::Refused(format!(
                "pod `{pod_name}` is not controlled by {}; a plugin may only call its own pods",
                self.parent
            ))
        })?;
        let port = pod.resolve(port_name).ok_or_else(|| {
            CallError::Refused(format!("pod `{pod_name}` has no port `{port_name}`"))
        })?;
        if !granted.iter().any(|g| pod.resolve(g) == Some(port)) {
            return Err(CallError::Refused(format!(
                "port `{port_name}` is not granted to this plugin (granted: {granted:?})"
            )));
        }
        let ip = pod
            .ip
            .as_ref()
            .ok_or_else(|| CallError::Unreachable(format!("pod `{pod_name}` has no IP yet")))?;
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.clone()
        };
        Ok((host, port))
    }

    /// Resolves a port granted for exchanges (see [`Self::authorize_endpoint`]).
    pub(crate) fn authorize_exchange(
        &self,
        pod_name: &str,
        port_name: &str,
    ) -> Result<(String, u16), CallError> {
        self.authorize_endpoint(pod_name, port_name, &self.grants.exchange_ports)
    }

    /// How exchanges of this scope are carried: from the script, over the network (recorded
    /// or not), or not at all (the scope of `describe`).
    pub(crate) fn exchange_route(&self) -> ExchangeRoute<'_> {
        if let Some(script) = &self.script {
            ExchangeRoute::Scripted(script)
        } else if self.client.is_some() {
            ExchangeRoute::Live(self.recorder.as_ref())
        } else {
            ExchangeRoute::Refused
        }
    }
}

/// Where a scope's exchanges go (see [`AppCallScope::exchange_route`]).
pub(crate) enum ExchangeRoute<'a> {
    /// Answered by the script, no network.
    Scripted(&'a AppCallScript),
    /// Over TCP, each round written to the recorder if there is one.
    Live(Option<&'a AppCallRecorder>),
    /// No exchanges in this scope.
    Refused,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> AppCallScope {
        let mut pods = HashMap::new();
        pods.insert(
            "db-0".to_string(),
            PodEndpoint {
                ip: Some("127.0.0.1".into()),
                named_ports: [("client".to_string(), 2379), ("peer".to_string(), 2380)]
                    .into_iter()
                    .collect(),
            },
        );
        let grants = Grants {
            app_call_ports: vec!["client".into()],
            ..Grants::default()
        };
        AppCallScope::new("ns/db".into(), pods, grants, http_client())
    }

    fn request(pod: &str, port: &str, path: &str) -> Request {
        Request {
            pod: pod.into(),
            port: port.into(),
            method: Method::Post,
            path: path.into(),
            body: None,
        }
    }

    #[tokio::test]
    async fn a_scripted_scope_answers_by_pod_and_path_and_records_the_calls() {
        let script = AppCallScript::new([(
            "db-0".to_string(),
            "/v3/cluster/member/list".to_string(),
            Ok(Response {
                status: 200,
                body: "{}".into(),
            }),
        )]);
        let scope = AppCallScope::scripted("ns/db".into(), script.clone());
        let answered = scope
            .call(
                "p",
                request("db-0", "client", "/v3/cluster/member/list"),
                None,
                1024,
            )
            .await;
        assert_eq!(answered.map(|r| r.status), Ok(200));
        let unknown = scope
            .call("p", request("db-1", "client", "/health"), None, 1024)
            .await;
        assert!(
            matches!(&unknown, Err(CallError::Unreachable(m)) if m.contains("no scripted answer")),
            "{unknown:?}"
        );
        let calls: Vec<String> = script.calls().into_iter().map(|r| r.pod).collect();
        assert_eq!(calls, ["db-0", "db-1"]);
    }

    #[tokio::test]
    async fn a_recorded_run_replays_exactly_its_own_requests_in_order() {
        let recorder = AppCallRecorder::new();
        let live = scope().recorded_by(recorder.clone());
        // Refused before any network: the refusal is recorded like an answer.
        let refused = live
            .call("p", request("other-0", "client", "/health"), None, 1024)
            .await;
        assert!(matches!(refused, Err(CallError::Refused(_))), "{refused:?}");
        assert_eq!(recorder.calls(), [request("other-0", "client", "/health")]);

        let answered = |status| {
            Ok(Response {
                status,
                body: String::new(),
            })
        };
        let polled = request("db-0", "client", "/health");
        let script = AppCallScript::replaying(vec![
            (polled.clone(), answered(503)),
            (polled.clone(), answered(200)),
        ]);
        let replay = AppCallScope::scripted("ns/db".into(), script.clone());
        let statuses = [
            replay.call("p", polled.clone(), None, 1024).await,
            replay.call("p", polled.clone(), None, 1024).await,
            replay.call("p", polled.clone(), None, 1024).await,
        ]
        .map(|answer| answer.map(|r| r.status));
        assert_eq!(statuses, [Ok(503), Ok(200), Ok(200)]);

        let mut other_body = polled.clone();
        other_body.body = Some("{}".into());
        let unrecorded = replay.call("p", other_body, None, 1024).await;
        assert!(
            matches!(&unrecorded, Err(CallError::Unreachable(m)) if m.contains("recorded run made no")),
            "{unrecorded:?}"
        );
        assert_eq!(script.calls().len(), 4);
    }

    #[test]
    fn authorization_table() {
        let scope = scope();
        let rows: [(&str, Request, Result<&str, &str>); 5] = [
            (
                "a granted named port of an owned pod resolves to its IP",
                request("db-0", "client", "/v3/cluster/member/list"),
                Ok("http://127.0.0.1:2379/v3/cluster/member/list"),
            ),
            (
                "the number of a granted named port is the same port",
                request("db-0", "2379", "/health"),
                Ok("http://127.0.0.1:2379/health"),
            ),
            (
                "a pod the parent does not control is refused",
                request("other-0", "client", "/health"),
                Err("not controlled"),
            ),
            (
                "a port that is not granted is refused",
                request("db-0", "peer", "/health"),
                Err("not granted"),
            ),
            (
                "a path without a leading slash is refused",
                request("db-0", "client", "@evil/health"),
                Err("must start with"),
            ),
        ];
        for (situation, req, expected) in rows {
            let got = scope
                .authorize(&req)
                .map(|(host, port)| format!("http://{host}:{port}{}", req.path));
            match (expected, got) {
                (Ok(url), Ok(got)) => assert_eq!(got, url, "{situation}"),
                (Err(fragment), Err(CallError::Refused(message))) => {
                    assert!(message.contains(fragment), "{situation}: {message}")
                }
                (expected, got) => panic!("{situation}: expected {expected:?}, got {got:?}"),
            }
        }
    }
}
