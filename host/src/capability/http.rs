//! The HTTP door out of the sandbox: an HTTP/JSON request from a plugin to a granted port of a
//! Pod its parent controls (over HTTPS with certificates from [`super::tls`]), checked against
//! the reconcile's [`AppCallScope`]. Everything else is refused.

use std::time::Duration;

use super::Doors;
use super::scope::AppCallScope;
use crate::contract::app_call::{CallError, Method, Request, Response, TlsClient};
use crate::contract::v0_1;

/// How long one app-call may take before the plugin gets `timeout`.
pub const APP_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The app-call HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot build the HTTP client for app-calls ({0}); the TLS backend (rustls with ring) failed to start: check that the host binary and its image are intact"
)]
pub struct HttpClientError(String);

/// The HTTP client app-calls use: no proxy, rustls with the ring provider (installed here for
/// the process if none is yet, since reqwest is built without a default one), no CA store of
/// the machine (a TLS app-call trusts only its Secret's CA). Never the panicking
/// `reqwest::Client` constructor (review #9): a failure is an error at start.
pub fn http_client() -> Result<reqwest::Client, HttpClientError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        // A pod's redirect is handed to the plugin, never followed: following it would let
        // a pod make the host fetch from the host's own network position.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| HttpClientError(e.to_string()))
}

/// A response body as read: at most the limit, and whether more was there.
pub(crate) struct BodyRead {
    /// The text (cut at a character boundary).
    pub text: String,
    /// The pod sent more than the limit; the rest was never read.
    pub cut: bool,
}

/// Reads `response`'s body chunk by chunk and stops past `limit` bytes: dropping the response
/// closes the connection, so a pod that streams without end costs the host `limit` bytes,
/// never its memory (review #2). Text that is not UTF-8 is read lossily.
pub(crate) async fn read_body(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<BodyRead, reqwest::Error> {
    let mut bytes: Vec<u8> = Vec::new();
    let mut cut = false;
    while let Some(chunk) = response.chunk().await? {
        let room = limit - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            cut = true;
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        // Cut inside a character: keep what is whole.
        Err(e) if e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).unwrap_or_default()
        }
        Err(e) => {
            // Replacement characters are longer than the bytes they replace: cut again.
            let mut text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            if text.len() > limit {
                text.truncate(text.floor_char_boundary(limit));
            }
            text
        }
    };
    Ok(BodyRead { text, cut })
}

impl AppCallScope {
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
        let body = read_body(response, body_limit)
            .await
            .map_err(|e| CallError::Unreachable(format!("{url}: reading the response: {e}")))?;
        if body.cut {
            tracing::warn!(
                plugin,
                parent = %self.parent,
                pod = %request.pod,
                path = %request.path,
                limit = body_limit,
                "app-call response cut at the plugin's output limit; the rest was not read"
            );
        }
        Ok(Response {
            status,
            body: body.text,
        })
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
}

impl crate::contract::app_call::Host for Doors {
    async fn call(&mut self, request: Request) -> Result<Response, CallError> {
        let size = request.body.as_ref().map_or(0, |b| b.len()) + request.path.len();
        if size > self.output_limit {
            self.note_oversized_output(size);
            return Err(CallError::Refused(format!(
                "request of {size} bytes is over the plugin's {} byte output limit",
                self.output_limit
            )));
        }
        let limit = self.output_limit;
        self.scope.call(&self.label, request, None, limit).await
    }

    async fn call_tls(&mut self, request: Request, tls: TlsClient) -> Result<Response, CallError> {
        let size = request.body.as_ref().map_or(0, |b| b.len()) + request.path.len();
        if size > self.output_limit {
            self.note_oversized_output(size);
            return Err(CallError::Refused(format!(
                "request of {size} bytes is over the plugin's {} byte output limit",
                self.output_limit
            )));
        }
        let limit = self.output_limit;
        self.scope
            .call(&self.label, request, Some(&tls), limit)
            .await
    }
}

/// The previous contract's app-call: the same door, its types converted at the boundary.
impl v0_1::policy_host::policy::app_call::Host for Doors {
    async fn call(
        &mut self,
        request: v0_1::policy_host::policy::app_call::Request,
    ) -> Result<
        v0_1::policy_host::policy::app_call::Response,
        v0_1::policy_host::policy::app_call::CallError,
    > {
        let request = v0_1::request_from_old(request);
        let answer = crate::contract::app_call::Host::call(self, request).await;
        v0_1::answer_to_old(answer)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::capability::replay::{AppCallRecorder, AppCallScript};
    use crate::capability::scope::{Grants, PodEndpoint};

    fn client() -> reqwest::Client {
        http_client().expect("the app-call client")
    }

    fn scope() -> AppCallScope {
        let mut pods = HashMap::new();
        pods.insert(
            "db-0".to_string(),
            PodEndpoint {
                ip: Some("127.0.0.1".into()),
                named_ports: [("client".to_string(), 2379), ("peer".to_string(), 2380)]
                    .into_iter()
                    .collect(),
                declared_ports: vec![2379, 2380],
                ..PodEndpoint::default()
            },
        );
        let grants = Grants {
            app_call_ports: vec!["client".into()],
            ..Grants::default()
        };
        AppCallScope::new("ns/db".into(), pods, grants, client())
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

    /// Review #9: reqwest's `Client` constructor without a builder panics when the client
    /// cannot be built; no host code may call it (the builder's error is returned instead).
    #[test]
    fn no_host_code_builds_an_http_client_with_the_panicking_constructor() {
        fn sources(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("read host/src").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    sources(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    found.push(path);
                }
            }
        }
        let mut files = Vec::new();
        sources(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let needle = ["Client", "::new()"].concat();
        let offenders: Vec<String> = files
            .iter()
            .filter(|f| std::fs::read_to_string(f).is_ok_and(|text| text.contains(&needle)))
            .map(|f| f.display().to_string())
            .collect();
        assert!(offenders.is_empty(), "{needle} in {offenders:?}");
    }

    /// hostNetwork pods (their IP is the node's), pods in a terminal phase (their IP may be
    /// another pod's by now) and ports a pod does not declare are out of reach, whatever the
    /// grants say (review #14).
    #[test]
    fn pods_and_ports_the_host_must_not_call_are_refused() {
        use k8s_openapi::api::core::v1::Pod;

        let pod = |name: &str, extra_spec: serde_json::Value, phase: &str| -> Pod {
            let mut spec = serde_json::json!({"containers": [{"name": "app",
                "ports": [{"name": "client", "containerPort": 2379}]}]});
            if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
                spec.extend(extra.clone());
            }
            serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name}, "spec": spec,
                "status": {"podIP": "127.0.0.1", "phase": phase}}))
            .expect("a pod")
        };
        let pods = HashMap::from([
            (
                "ok".to_string(),
                PodEndpoint::from_pod(&pod("ok", serde_json::json!({}), "Running")),
            ),
            (
                "on-host".to_string(),
                PodEndpoint::from_pod(&pod(
                    "on-host",
                    serde_json::json!({"hostNetwork": true}),
                    "Running",
                )),
            ),
            (
                "failed".to_string(),
                PodEndpoint::from_pod(&pod("failed", serde_json::json!({}), "Failed")),
            ),
            (
                "done".to_string(),
                PodEndpoint::from_pod(&pod("done", serde_json::json!({}), "Succeeded")),
            ),
        ]);
        let grants = Grants {
            app_call_ports: vec!["client".into(), "9999".into()],
            ..Grants::default()
        };
        let scope = AppCallScope::new("ns/db".into(), pods, grants, client());
        assert_eq!(
            scope.authorize(&request("ok", "client", "/health")).ok(),
            Some(("127.0.0.1".to_string(), 2379))
        );
        for (pod, port, fragment) in [
            ("on-host", "client", "hostNetwork"),
            ("failed", "client", "Failed"),
            ("done", "client", "Succeeded"),
            ("ok", "9999", "no port"),
        ] {
            let refused = scope.authorize(&request(pod, port, "/health"));
            assert!(
                matches!(&refused, Err(CallError::Refused(m)) if m.contains(fragment)),
                "{pod}:{port}: {refused:?}"
            );
        }
    }

    /// A pod that answers 200 and then streams body bytes until the connection is closed;
    /// returns its port and a counter of the body bytes it managed to send.
    async fn endless_pod() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the pod");
        let port = listener.local_addr().expect("its address").port();
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = sent.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    let _ = socket.read(&mut buffer).await;
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "x".repeat(64 * 1024));
                    while socket.write_all(chunk.as_bytes()).await.is_ok() {
                        counted.fetch_add(64 * 1024, Ordering::SeqCst);
                    }
                });
            }
        });
        (port, sent)
    }

    #[tokio::test]
    async fn an_endless_response_is_read_only_up_to_the_limit_then_dropped() {
        use std::sync::atomic::Ordering;

        let (port, sent) = endless_pod().await;
        let pods = HashMap::from([(
            "db-0".to_string(),
            PodEndpoint {
                ip: Some("127.0.0.1".into()),
                named_ports: HashMap::from([("client".to_string(), port)]),
                ..PodEndpoint::default()
            },
        )]);
        let grants = Grants {
            app_call_ports: vec!["client".into()],
            ..Grants::default()
        };
        let scope = AppCallScope::new("ns/db".into(), pods, grants, client());
        let limit = 100_000;
        let answer = scope
            .call("p", request("db-0", "client", "/health"), None, limit)
            .await;
        let response = answer.expect("the response, cut at the limit");
        assert_eq!(response.status, 200);
        assert_eq!(response.body.len(), limit);
        // The host stopped reading at the limit: the pod could only fill the socket buffers.
        let sent = sent.load(Ordering::SeqCst);
        assert!(
            sent < 16 << 20,
            "the host read {sent} bytes for a {limit} byte limit"
        );
    }

    #[tokio::test]
    async fn a_redirect_is_handed_to_the_plugin_and_never_followed() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the redirect target");
        let elsewhere_port = elsewhere.local_addr().expect("its address").port();
        let reached = Arc::new(AtomicUsize::new(0));
        let counted = reached.clone();
        tokio::spawn(async move {
            while elsewhere.accept().await.is_ok() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        let pod = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the pod");
        let pod_port = pod.local_addr().expect("its address").port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = pod.accept().await {
                let mut buffer = [0u8; 4096];
                let _ = socket.read(&mut buffer).await;
                let reply = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{elsewhere_port}/stolen\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = socket.write_all(reply.as_bytes()).await;
            }
        });
        let pods = HashMap::from([(
            "db-0".to_string(),
            PodEndpoint {
                ip: Some("127.0.0.1".into()),
                named_ports: HashMap::from([("client".to_string(), pod_port)]),
                ..PodEndpoint::default()
            },
        )]);
        let grants = Grants {
            app_call_ports: vec!["client".into()],
            ..Grants::default()
        };
        let scope = AppCallScope::new("ns/db".into(), pods, grants, client());
        let answer = scope
            .call("p", request("db-0", "client", "/health"), None, 1024)
            .await;
        assert_eq!(answer.map(|r| r.status), Ok(307));
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "the redirect was followed"
        );
    }
}
