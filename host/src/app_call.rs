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

use crate::decide::contract::app_call::{CallError, Method, Request, Response};

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

/// One pod's scripted answers, by path.
type ScriptedPaths = HashMap<String, Result<Response, CallError>>;

/// Canned answers to app-calls, by pod and path, and a record of the calls a plugin made:
/// the world of a plugin run without a network (benchmarks, and later `simulate` and shadow
/// mode, where a plugin must decide without touching the real application).
///
/// Clones share the record, so a caller keeps one clone to read what the plugin asked.
#[derive(Clone, Debug, Default)]
pub struct AppCallScript {
    /// pod → path → answer.
    answers: Arc<HashMap<String, ScriptedPaths>>,
    calls: Arc<Mutex<Vec<Request>>>,
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
            calls: Arc::default(),
        }
    }

    /// The calls answered so far (through any clone), in order.
    pub fn calls(&self) -> Vec<Request> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.clear();
        }
    }

    /// Answers one request (method and body are recorded, not matched): a pod or path the
    /// script does not know is unreachable, as an absent pod would be.
    fn answer(&self, request: Request) -> Result<Response, CallError> {
        let answer = self
            .answers
            .get(&request.pod)
            .and_then(|paths| paths.get(&request.path))
            .cloned()
            .unwrap_or_else(|| {
                Err(CallError::Unreachable(format!(
                    "no scripted answer for pod `{}` path `{}`",
                    request.pod, request.path
                )))
            });
        // Never held across an await: a plain mutex is right here.
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(request);
        }
        answer
    }
}

/// What one reconcile's plugin may reach.
#[derive(Clone, Debug, Default)]
pub struct AppCallScope {
    parent: String,
    pods: HashMap<String, PodEndpoint>,
    granted_ports: Vec<String>,
    client: Option<reqwest::Client>,
    script: Option<AppCallScript>,
}

impl AppCallScope {
    /// A scope that refuses every call (used while a plugin describes itself).
    pub fn none() -> Self {
        Self::default()
    }

    /// A scope for one parent: its Pods and the ports granted to the plugin.
    pub fn new(
        parent: String,
        pods: HashMap<String, PodEndpoint>,
        granted_ports: Vec<String>,
        client: reqwest::Client,
    ) -> Self {
        Self {
            parent,
            pods,
            granted_ports,
            client: Some(client),
            script: None,
        }
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

    /// Checks the request against the scope, then sends it.
    pub async fn call(
        &self,
        plugin: &str,
        request: Request,
        body_limit: usize,
    ) -> Result<Response, CallError> {
        if let Some(script) = &self.script {
            return script.answer(request);
        }
        let url = self.authorize(&request).inspect_err(|error| {
            tracing::warn!(
                plugin,
                parent = %self.parent,
                pod = %request.pod,
                port = %request.port,
                path = %request.path,
                %error,
                "app-call refused"
            );
        })?;
        let Some(client) = &self.client else {
            return Err(CallError::Refused(
                "app-calls are not available here".to_string(),
            ));
        };
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

    /// Resolves the request to a URL, or says why it is refused.
    fn authorize(&self, request: &Request) -> Result<String, CallError> {
        let pod = self.pods.get(&request.pod).ok_or_else(|| {
            CallError::Refused(format!(
                "pod `{}` is not controlled by {}; a plugin may only call its own pods",
                request.pod, self.parent
            ))
        })?;
        let port = pod.resolve(&request.port).ok_or_else(|| {
            CallError::Refused(format!(
                "pod `{}` has no port `{}`",
                request.pod, request.port
            ))
        })?;
        let granted = self
            .granted_ports
            .iter()
            .any(|g| pod.resolve(g) == Some(port));
        if !granted {
            return Err(CallError::Refused(format!(
                "port `{}` is not granted to this plugin (granted: {:?})",
                request.port, self.granted_ports
            )));
        }
        if !request.path.starts_with('/') {
            return Err(CallError::Refused(format!(
                "path `{}` must start with `/`",
                request.path
            )));
        }
        let ip = pod.ip.as_ref().ok_or_else(|| {
            CallError::Unreachable(format!("pod `{}` has no IP yet", request.pod))
        })?;
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.clone()
        };
        Ok(format!("http://{host}:{port}{}", request.path))
    }
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
        AppCallScope::new("ns/db".into(), pods, vec!["client".into()], http_client())
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
                1024,
            )
            .await;
        assert_eq!(answered.map(|r| r.status), Ok(200));
        let unknown = scope
            .call("p", request("db-1", "client", "/health"), 1024)
            .await;
        assert!(
            matches!(&unknown, Err(CallError::Unreachable(m)) if m.contains("no scripted answer")),
            "{unknown:?}"
        );
        let calls: Vec<String> = script.calls().into_iter().map(|r| r.pod).collect();
        assert_eq!(calls, ["db-0", "db-1"]);
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
            let got = scope.authorize(&req);
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
