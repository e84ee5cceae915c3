//! Client TLS for app-calls: a plugin names a Secret in its parent's namespace, the host reads
//! the CA and client certificate from it and speaks HTTPS with them. The plugin never sees a
//! byte of the Secret, and can only name Secrets of its own parent's namespace.
//!
//! Secrets are read through the API (not watched: a host that makes no TLS call needs no
//! access to Secrets) and kept for [`SECRET_TTL`], so a rotated certificate is used within
//! that time. HTTPS clients are kept per Secret version, server name and pod address, so a
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
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let found = api.get_opt(secret).await.map_err(|e| {
            CallError::Refused(format!(
                "cannot read Secret `{namespace}/{secret}` for TLS: {e}; the host needs `get` on secrets in that namespace (deploy/rbac)"
            ))
        })?;
        let found = found.ok_or_else(|| {
            CallError::Refused(format!(
                "Secret `{namespace}/{secret}` named for TLS does not exist; create it with `{CA_KEY}` (and `{CERT_KEY}`, `{KEY_KEY}` for a client certificate)"
            ))
        })?;
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
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

    use super::*;

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
