//! Client TLS for app-calls: a plugin names a Secret in its parent's namespace, the host reads
//! the CA and client certificate from it and speaks HTTPS with them. The plugin never sees a
//! byte of the Secret, and can only name Secrets of its own parent's namespace.
//!
//! Secrets are read through the API (not watched: a host that makes no TLS call needs no
//! access to Secrets) and kept for [`SECRET_TTL`], so a rotated certificate is used within
//! that time; a Secret found missing is not asked for again for [`MISSING_SECRET_TTL`]. HTTPS clients are kept per Secret version, server name and pod address, so a
//! reconcile's calls to the same pod reuse one connection.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::contract::app_call::{CallError, TlsClient};

/// How long a Secret read for TLS is used before it is read again.
pub const SECRET_TTL: Duration = Duration::from_secs(30);

/// More HTTPS clients than this and the cache starts again (pods come and go; their clients
/// must not pile up).
const MAX_CLIENTS: usize = 256;

/// The Secret keys read, as in a `kubernetes.io/tls` Secret with a CA.
const CA_KEY: &str = "ca.crt";
const CERT_KEY: &str = "tls.crt";
const KEY_KEY: &str = "tls.key";

/// Reads TLS Secrets and keeps HTTPS clients for app-calls. Cheap to clone; clones share
/// their caches.
#[derive(Clone)]
pub struct AppTls {
    client: kube::Client,
    secrets: Arc<Mutex<HashMap<SecretKey, CachedConfig>>>,
    /// Secrets found missing, and when.
    missing: Arc<Mutex<HashMap<SecretKey, Instant>>>,
    clients: Arc<Mutex<HashMap<ClientKey, reqwest::Client>>>,
}

impl std::fmt::Debug for AppTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppTls").finish_non_exhaustive()
    }
}

/// `(namespace, secret)`.
type SecretKey = (String, String);

/// A Secret's TLS configuration, and when it was read.
struct CachedConfig {
    read_at: Instant,
    resource_version: String,
    config: Arc<rustls::ClientConfig>,
}

/// How long a Secret found missing is not asked for again: a plugin that names Secrets that
/// do not exist costs one GET per name per period, not one per call (review #18).
pub const MISSING_SECRET_TTL: Duration = Duration::from_secs(10);

/// More missing Secret names than this and the list starts again (bounded memory).
const MAX_MISSING: usize = 1024;

#[derive(Clone, PartialEq, Eq, Hash)]
struct ClientKey {
    namespace: String,
    secret: String,
    resource_version: String,
    server_name: String,
    addr: SocketAddr,
}

impl AppTls {
    /// TLS for app-calls, reading Secrets with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            secrets: Arc::default(),
            missing: Arc::default(),
            clients: Arc::default(),
        }
    }

    /// An HTTPS client that connects to `addr` for `tls.server_name`, trusts only the CA of
    /// the Secret and presents its client certificate (if it has one), and the URL prefix
    /// (`https://<server-name>:<port>`) to send requests to.
    pub async fn client_for(
        &self,
        namespace: &str,
        tls: &TlsClient,
        addr: SocketAddr,
    ) -> Result<(reqwest::Client, String), CallError> {
        if ServerName::try_from(tls.server_name.as_str()).is_err() || tls.server_name.is_empty() {
            return Err(CallError::Refused(format!(
                "TLS server name `{}` is not a DNS name or IP address",
                tls.server_name
            )));
        }
        // The client overrides DNS for the server name (`resolve`), but an IP literal is
        // dialled as it is: any other address would let a plugin reach past its pods
        // (review #4).
        if let Ok(ip) = tls.server_name.parse::<IpAddr>()
            && ip != addr.ip()
        {
            return Err(CallError::Refused(format!(
                "TLS server name `{}` is an IP address other than the pod's IP {}; name the pod by the DNS name in its certificate (or by its own IP)",
                tls.server_name,
                addr.ip()
            )));
        }
        let (resource_version, config) = self.config(namespace, &tls.secret).await?;
        let key = ClientKey {
            namespace: namespace.to_owned(),
            secret: tls.secret.clone(),
            resource_version,
            server_name: tls.server_name.clone(),
            addr,
        };
        let base = format!("https://{}:{}", url_host(&tls.server_name), addr.port());
        // Never held across an await: a plain mutex is right here.
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(&key) {
            return Ok((client.clone(), base));
        }
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        let client = reqwest::Client::builder()
            .no_proxy()
            // Redirects are handed to the plugin, never followed (see `http::http_client`).
            .redirect(reqwest::redirect::Policy::none())
            .tls_backend_preconfigured(config.as_ref().clone())
            .resolve(&tls.server_name, addr)
            .build()
            .map_err(|e| {
                CallError::Refused(format!(
                    "cannot build an HTTPS client from Secret `{namespace}/{}`: {e}",
                    tls.secret
                ))
            })?;
        clients.insert(key, client.clone());
        Ok((client, base))
    }

    /// The TLS configuration of a Secret, read again once [`SECRET_TTL`] has passed.
    async fn config(
        &self,
        namespace: &str,
        secret: &str,
    ) -> Result<(String, Arc<rustls::ClientConfig>), CallError> {
        let key = (namespace.to_owned(), secret.to_owned());
        if let Some(cached) = self
            .secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .filter(|c| c.read_at.elapsed() < SECRET_TTL)
        {
            return Ok((cached.resource_version.clone(), cached.config.clone()));
        }
        let not_found = || {
            CallError::Refused(format!(
                "Secret `{namespace}/{secret}` named for TLS does not exist; create it with `{CA_KEY}` (and `{CERT_KEY}`, `{KEY_KEY}` for a client certificate)"
            ))
        };
        if self
            .missing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .is_some_and(|at| at.elapsed() < MISSING_SECRET_TTL)
        {
            return Err(not_found());
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let found = api.get_opt(secret).await.map_err(|e| {
            CallError::Refused(format!(
                "cannot read Secret `{namespace}/{secret}` for TLS: {e}; the host needs `get` on secrets in that namespace (deploy/rbac)"
            ))
        })?;
        let Some(found) = found else {
            let mut missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
            if missing.len() >= MAX_MISSING {
                missing.clear();
            }
            missing.insert(key, Instant::now());
            return Err(not_found());
        };
        let config = Arc::new(client_config(&found).map_err(|why| {
            CallError::Refused(format!(
                "Secret `{namespace}/{secret}` cannot be used for TLS: {why}"
            ))
        })?);
        let resource_version = found.metadata.resource_version.unwrap_or_default();
        self.secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                key,
                CachedConfig {
                    read_at: Instant::now(),
                    resource_version: resource_version.clone(),
                    config: config.clone(),
                },
            );
        Ok((resource_version, config))
    }
}

/// A host for a URL: an IPv6 address in brackets, anything else as it is.
fn url_host(server_name: &str) -> String {
    match server_name.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]"),
        _ => server_name.to_owned(),
    }
}

/// A rustls client configuration from a Secret: `ca.crt` as the only roots, and `tls.crt` with
/// `tls.key` as the client certificate when both are there. Says what is wrong otherwise.
pub fn client_config(secret: &Secret) -> Result<rustls::ClientConfig, String> {
    let data = secret.data.clone().unwrap_or_default();
    let ca = data.get(CA_KEY).ok_or_else(|| {
        format!("it has no `{CA_KEY}` (the CA the server certificate must chain to)")
    })?;
    let mut roots = rustls::RootCertStore::empty();
    let mut added = 0;
    for cert in CertificateDer::pem_slice_iter(&ca.0) {
        let cert = cert.map_err(|e| format!("`{CA_KEY}` is not PEM certificates: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("`{CA_KEY}` holds a certificate rustls refuses: {e}"))?;
        added += 1;
    }
    if added == 0 {
        return Err(format!("`{CA_KEY}` holds no PEM certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("no TLS version available: {e}"))?
        .with_root_certificates(roots);
    match (data.get(CERT_KEY), data.get(KEY_KEY)) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(&cert.0)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("`{CERT_KEY}` is not PEM certificates: {e}"))?;
            if chain.is_empty() {
                return Err(format!("`{CERT_KEY}` holds no PEM certificate"));
            }
            let key = PrivateKeyDer::from_pem_slice(&key.0)
                .map_err(|e| format!("`{KEY_KEY}` is not a PEM private key: {e}"))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!("`{CERT_KEY}` and `{KEY_KEY}` do not make a client certificate: {e}")
            })
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(_), None) => Err(format!("it has `{CERT_KEY}` but no `{KEY_KEY}`")),
        (None, Some(_)) => Err(format!("it has `{KEY_KEY}` but no `{CERT_KEY}`")),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

    use super::*;

    /// A stand-in for the API server (a unit-test fake, not a model of it): every request
    /// gets a 404 Status, as for a Secret that does not exist; the counter says how many came.
    pub(crate) async fn api_without_secrets()
    -> (kube::Client, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::Ordering;

        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake API server");
        let port = listener.local_addr().expect("its address").port();
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 8192];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 {
                            return;
                        }
                        counted.fetch_add(1, Ordering::SeqCst);
                        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"secrets not found"}"#;
                        let reply = format!(
                            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let url = format!("http://127.0.0.1:{port}").parse().expect("a URL");
        let client = kube::Client::try_from(kube::Config::new(url)).expect("a client");
        (client, requests)
    }

    fn tls_client(secret: &str, server_name: &str) -> TlsClient {
        TlsClient {
            secret: secret.into(),
            server_name: server_name.into(),
        }
    }

    #[tokio::test]
    async fn an_ip_server_name_other_than_the_pod_ip_is_refused_before_anything_is_read() {
        let (client, requests) = api_without_secrets().await;
        let tls = AppTls::new(client);
        let pod: SocketAddr = "127.0.0.1:2379".parse().expect("an address");
        let refused = tls
            .client_for("ns", &tls_client("etcd-operator", "127.0.0.2"), pod)
            .await
            .map(|_| ());
        assert!(
            matches!(&refused, Err(CallError::Refused(m)) if m.contains("127.0.0.2") && m.contains("pod's IP")),
            "{refused:?}"
        );
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_missing_secret_is_remembered_for_a_while_not_read_on_every_call() {
        use std::sync::atomic::Ordering;

        let (client, requests) = api_without_secrets().await;
        let tls = AppTls::new(client);
        let pod: SocketAddr = "127.0.0.1:2379".parse().expect("an address");
        for _ in 0..5 {
            let refused = tls
                .client_for("ns", &tls_client("missing", "db-0.db.ns.svc"), pod)
                .await
                .map(|_| ());
            assert!(
                matches!(&refused, Err(CallError::Refused(m)) if m.contains("does not exist")),
                "{refused:?}"
            );
        }
        assert_eq!(requests.load(Ordering::SeqCst), 1, "one GET for five calls");
    }

    /// A CA, and a client certificate it signed with its key, as PEM.
    fn pems() -> (String, String, String) {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
            .expect("ca");
        let key = KeyPair::generate().expect("client key");
        let cert = CertificateParams::new(vec!["operator".to_owned()])
            .expect("client params")
            .signed_by(&key, &ca)
            .expect("client cert");
        (ca.pem(), cert.pem(), key.serialize_pem())
    }

    fn secret(entries: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    /// A situation, the Secret's entries, and whether a client certificate results (or a
    /// fragment of the error).
    type Row<'a> = (&'a str, Vec<(&'a str, &'a str)>, Result<bool, &'a str>);

    #[test]
    fn a_secret_becomes_a_client_configuration_or_says_what_is_wrong() {
        let (ca, cert, key) = pems();
        let rows: [Row; 7] = [
            (
                "CA and client certificate",
                vec![(CA_KEY, &ca), (CERT_KEY, &cert), (KEY_KEY, &key)],
                Ok(true),
            ),
            (
                "CA only: no client certificate",
                vec![(CA_KEY, &ca)],
                Ok(false),
            ),
            (
                "no CA",
                vec![(CERT_KEY, &cert), (KEY_KEY, &key)],
                Err("no `ca.crt`"),
            ),
            (
                "a CA that is not PEM",
                vec![(CA_KEY, "not pem")],
                Err("no PEM certificate"),
            ),
            (
                "a certificate without its key",
                vec![(CA_KEY, &ca), (CERT_KEY, &cert)],
                Err("no `tls.key`"),
            ),
            (
                "a key without its certificate",
                vec![(CA_KEY, &ca), (KEY_KEY, &key)],
                Err("no `tls.crt`"),
            ),
            (
                "a key that is not a key",
                vec![(CA_KEY, &ca), (CERT_KEY, &cert), (KEY_KEY, &ca)],
                Err("not a PEM private key"),
            ),
        ];
        for (situation, entries, expected) in rows {
            match (client_config(&secret(&entries)), expected) {
                (Ok(config), Ok(client_auth)) => assert_eq!(
                    config.client_auth_cert_resolver.has_certs(),
                    client_auth,
                    "{situation}"
                ),
                (Err(why), Err(fragment)) => {
                    assert!(why.contains(fragment), "{situation}: {why}")
                }
                (got, expected) => panic!(
                    "{situation}: expected {expected:?}, got {:?}",
                    got.map(|_| "a configuration")
                ),
            }
        }
    }

    #[test]
    fn server_names_go_into_urls_as_hosts() {
        assert_eq!(url_host("db-0.db.ns.svc"), "db-0.db.ns.svc");
        assert_eq!(url_host("10.0.0.1"), "10.0.0.1");
        assert_eq!(url_host("::1"), "[::1]");
    }
}
