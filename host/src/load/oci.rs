//! OCI: plugin components in a registry, named by digest — pulled for the ConfigMap source,
//! pushed by `policy-host pack --push`.
//!
//! The artifact is the CNCF TAG-Runtime wasm layout (the one `wkg oci push` writes): an OCI
//! image manifest whose config has media type [`WASM_CONFIG_MEDIA_TYPE`] and whose one layer,
//! of media type [`WASM_LAYER_MEDIA_TYPE`], is the component itself, uncompressed. So the
//! layer digest is the component's sha256, the key the [artifact cache](super::artifact_cache)
//! already uses, and a plugin pulled twice is compiled once.
//!
//! A pull trusts nothing the registry says: the manifest is fetched by the digest of the
//! reference and its bytes are hashed again here; the layer's announced size is checked
//! against the host's limit before any byte of it is fetched, the download stops at that
//! limit, and the bytes are hashed against the layer digest. A reference without a digest (a
//! tag alone) is refused: what a tag names can change under the host, and the plugin ConfigMap
//! is the place that says which code runs.
//!
//! The registry is reached over HTTPS only, with the system's roots or, when the admin names
//! one, only the registry's own CA. Why `oci-client` alone and not `oci-wasm` on top: oci-wasm
//! 0.6 pins oci-client 0.17 and wit-component 0.253 (a second copy of each beside the host's)
//! and has no rustls feature without aws-lc; the layout it implements is two media types and a
//! small config, written out here.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};

use super::pack::sha256_hex;

/// The scheme of a plugin reference.
pub const SCHEME: &str = "oci://";
/// Config media type of a wasm artifact (CNCF TAG-Runtime wasm OCI artifact layout).
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// Media type of the one layer: the component, uncompressed.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The largest component the host pulls unless told otherwise (`--max-pulled-plugin-mib`):
/// above the 10–40 MB of a Python or JavaScript component, below what the host's 256 MiB
/// memory limit can compile.
pub const DEFAULT_MAX_PULL_BYTES: u64 = 64 << 20;
/// How long connecting to a registry may take before the pull fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a registry may stay silent mid-answer before the pull fails.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a plugin could not be pulled or pushed. Each says what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference is not `oci://<registry>/<repository>@sha256:<digest>`.
    #[error(
        "`{reference}` is not a plugin reference: {problem}; write `oci://<registry>/<repository>@sha256:<64 hex digits>` (`policy-host pack --push` prints one)"
    )]
    BadReference {
        /// The reference as written.
        reference: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The registry could not be reached, refused the credentials, or does not hold the
    /// reference.
    #[error(
        "cannot pull {reference}: {message}; check that the registry is reachable from the host, that the digest was pushed there, and the pull Secret and CA the ConfigMap names"
    )]
    Pull {
        /// The reference.
        reference: String,
        /// What the client said.
        message: String,
    },
    /// What the registry sent does not hash to the digest that names it.
    #[error(
        "digest mismatch pulling {reference}: the {what} does not hash to {expected} ({actual}); the registry (or something between it and the host) altered it: push the plugin again and check the registry's storage"
    )]
    DigestMismatch {
        /// The reference.
        reference: String,
        /// `manifest` or `component layer`.
        what: &'static str,
        /// The digest that names it.
        expected: String,
        /// What its bytes hash to, as the check saw it.
        actual: String,
    },
    /// The artifact is not a wasm component artifact.
    #[error(
        "{reference} is not a wasm component artifact: {problem}; push the component with `policy-host pack --push` (or `wkg oci push`), which writes config {WASM_CONFIG_MEDIA_TYPE} and one {WASM_LAYER_MEDIA_TYPE} layer"
    )]
    NotAWasmArtifact {
        /// The reference.
        reference: String,
        /// What does not fit the layout.
        problem: String,
    },
    /// The component is larger than the host pulls.
    #[error(
        "{reference}: the component is {size} bytes, over this host's pull limit of {limit} bytes; raise --max-pulled-plugin-mib (and the host's memory limit: compiling takes several times the component's size) or build a smaller component"
    )]
    TooLarge {
        /// The reference.
        reference: String,
        /// Its size (as announced, or as far as the download went).
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The pull Secret is not a usable `.dockerconfigjson`.
    #[error(
        "the pull Secret {secret} is not usable: {problem}; create it with `kubectl create secret docker-registry <name> --docker-server=<registry> --docker-username=... --docker-password=...` in the plugin namespace"
    )]
    BadPullSecret {
        /// namespace/name.
        secret: String,
        /// What is wrong.
        problem: String,
    },
    /// The registry CA is not a PEM certificate.
    #[error(
        "the registry CA from {source_name} is not usable: {problem}; give the PEM certificate of the CA that signed the registry's serving certificate under the key `ca.crt`"
    )]
    BadRegistryCa {
        /// Where it came from (`secret ns/name`, `configmap ns/name`, a file).
        source_name: String,
        /// What is wrong.
        problem: String,
    },
    /// The push failed.
    #[error(
        "cannot push to {target}: {message}; check the registry address, its CA (--registry-ca) and the credentials (--registry-auth)"
    )]
    Push {
        /// Where to.
        target: String,
        /// What the client said.
        message: String,
    },
}

impl OciError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            OciError::BadReference { .. } => "PluginReferenceInvalid",
            OciError::Pull { .. } | OciError::Push { .. } => "PluginPullFailed",
            OciError::DigestMismatch { .. } => "PluginDigestMismatch",
            OciError::NotAWasmArtifact { .. } => "PluginNotAComponent",
            OciError::TooLarge { .. } => "PluginTooLarge",
            OciError::BadPullSecret { .. } => "PluginPullSecretInvalid",
            OciError::BadRegistryCa { .. } => "PluginRegistryCaInvalid",
        }
    }
}

/// A plugin named by digest in a registry: `oci://<registry>/<repository>@sha256:<hex>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginReference {
    /// `host[:port]`.
    pub registry: String,
    /// The repository path.
    pub repository: String,
    /// `sha256:<64 hex>`: the manifest's digest.
    pub digest: String,
}

impl PluginReference {
    /// Parses `oci://<registry>/<repository>@sha256:<64 hex digits>`.
    pub fn parse(text: &str) -> Result<PluginReference, OciError> {
        let text = text.trim();
        let bad = |problem: &str| OciError::BadReference {
            reference: text.to_owned(),
            problem: problem.to_owned(),
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it does not start with oci://"))?;
        let (name, digest) = rest.rsplit_once('@').ok_or_else(|| {
            bad("it names no digest (a tag may move; a plugin is named by digest)")
        })?;
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| bad("its digest is not sha256:"))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad("its digest is not 64 lowercase hex digits"));
        }
        let (registry, repository) = name
            .split_once('/')
            .ok_or_else(|| bad("it names no repository after the registry"))?;
        if registry.is_empty() || repository.is_empty() {
            return Err(bad("the registry or the repository is empty"));
        }
        // A tag before the digest is only a label: the digest decides.
        let repository = match repository.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => repo,
            _ => repository,
        };
        let parsed = PluginReference {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            digest: digest.to_owned(),
        };
        // What oci-client will fetch must be exactly this (it lower-cases nothing silently).
        parsed
            .oci()
            .map_err(|e| bad(&format!("the registry or repository is not valid ({e})")))?;
        Ok(parsed)
    }

    fn oci(&self) -> Result<Reference, oci_client::ParseError> {
        Reference::with_digest(
            self.registry.clone(),
            self.repository.clone(),
            self.digest.clone(),
        )
        .to_string()
        .parse()
    }

    /// The component's sha256 this reference pins is not known before the manifest is read;
    /// the manifest digest, as hex, names the artifact in messages.
    pub fn digest_hex(&self) -> &str {
        self.digest.strip_prefix("sha256:").unwrap_or(&self.digest)
    }
}

impl std::fmt::Display for PluginReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{SCHEME}{}/{}@{}",
            self.registry, self.repository, self.digest
        )
    }
}

/// How to reach a registry: credentials and the CA its certificate is signed by.
#[derive(Clone, Default)]
pub struct RegistryAccess {
    /// User name and password (`None`: anonymous).
    pub credentials: Option<(String, String)>,
    /// PEM of the only CA trusted for the registry (`None`: the system's roots).
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for RegistryAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAccess")
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("ca", &self.ca_pem.is_some())
            .finish()
    }
}

impl RegistryAccess {
    fn auth(&self) -> RegistryAuth {
        match &self.credentials {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    fn client(&self, source_name: &str) -> Result<Client, OciError> {
        // reqwest is built without a crypto provider of its own: it uses the process's (ring).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = ClientConfig {
            protocol: ClientProtocol::Https,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            // A plugin artifact is a single manifest: an index is refused, not resolved.
            platform_resolver: None,
            ..ClientConfig::default()
        };
        if let Some(pem) = &self.ca_pem {
            check_ca_pem(source_name, pem)?;
            config.tls_certs_only = vec![Certificate {
                encoding: CertificateEncoding::Pem,
                data: pem.clone(),
            }];
        }
        Client::try_from(config).map_err(|e| OciError::BadRegistryCa {
            source_name: source_name.to_owned(),
            problem: e.to_string(),
        })
    }
}

/// Refuses CA text holding no PEM certificate, so the error names the CA rather than TLS.
fn check_ca_pem(source_name: &str, pem: &[u8]) -> Result<(), OciError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| OciError::BadRegistryCa {
            source_name: source_name.to_owned(),
            problem: format!("it is not PEM ({e})"),
        })?;
    if certificates.is_empty() {
        return Err(OciError::BadRegistryCa {
            source_name: source_name.to_owned(),
            problem: "it holds no CERTIFICATE block".to_owned(),
        });
    }
    Ok(())
}

/// The user name and password for `registry` in a `.dockerconfigjson` (`auths.<registry>`,
/// with `username`/`password` or a base64 `auth` of `user:password`). `Ok(None)` when the file
/// has no entry for that registry.
pub fn credentials_from_docker_config(
    json: &[u8],
    registry: &str,
) -> Result<Option<(String, String)>, String> {
    #[derive(Deserialize)]
    struct DockerConfig {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, DockerAuth>,
    }
    #[derive(Deserialize)]
    struct DockerAuth {
        username: Option<String>,
        password: Option<String>,
        auth: Option<String>,
    }
    use base64::Engine as _;
    let config: DockerConfig =
        serde_json::from_slice(json).map_err(|e| format!("it is not JSON of auths ({e})"))?;
    // `docker login` writes `https://host`, kubectl `host`: either names the registry.
    let entry = config.auths.iter().find(|(server, _)| {
        let server = server
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('/');
        server == registry
    });
    let Some((server, auth)) = entry else {
        return Ok(None);
    };
    if let (Some(user), Some(password)) = (&auth.username, &auth.password) {
        return Ok(Some((user.clone(), password.clone())));
    }
    let encoded = auth
        .auth
        .as_deref()
        .ok_or_else(|| format!("auths.{server} has neither username/password nor auth"))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|e| format!("auths.{server}.auth is not base64 ({e})"))?;
    let text = String::from_utf8(decoded)
        .map_err(|_| format!("auths.{server}.auth is not UTF-8 user:password"))?;
    let (user, password) = text
        .split_once(':')
        .ok_or_else(|| format!("auths.{server}.auth is not user:password"))?;
    Ok(Some((user.to_owned(), password.to_owned())))
}

/// A component pulled and checked against its digests.
#[derive(Clone)]
pub struct PulledComponent {
    /// The component.
    pub bytes: Vec<u8>,
    /// Hex sha256 of `bytes` (the layer digest).
    pub sha256: String,
}

/// Pulls the component `reference` names, at most `max_bytes` of it, checking the manifest
/// against the reference's digest and the component against the layer digest.
pub async fn pull(
    reference: &PluginReference,
    access: &RegistryAccess,
    ca_source: &str,
    max_bytes: u64,
) -> Result<PulledComponent, OciError> {
    let name = reference.to_string();
    let image = reference.oci().map_err(|e| OciError::BadReference {
        reference: name.clone(),
        problem: e.to_string(),
    })?;
    let client = access.client(ca_source)?;
    let (manifest_bytes, _) = client
        .pull_manifest_raw(&image, &access.auth(), &[OCI_IMAGE_MEDIA_TYPE])
        .await
        .map_err(|e| pull_error(&name, "manifest", &reference.digest, e))?;
    let actual = format!("sha256:{}", sha256_hex(&manifest_bytes));
    if actual != reference.digest {
        return Err(OciError::DigestMismatch {
            reference: name,
            what: "manifest",
            expected: reference.digest.clone(),
            actual: format!("they hash to {actual}"),
        });
    }
    let layer = wasm_layer(&name, &manifest_bytes)?;
    let announced = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if announced > max_bytes {
        return Err(OciError::TooLarge {
            reference: name,
            size: announced,
            limit: max_bytes,
        });
    }
    let mut sink = BoundedSink::new(max_bytes);
    let pulled = client.pull_blob(&image, &layer, &mut sink).await;
    if sink.overflowed {
        return Err(OciError::TooLarge {
            reference: name,
            size: sink.seen,
            limit: max_bytes,
        });
    }
    pulled.map_err(|e| pull_error(&name, "component layer", &layer.digest, e))?;
    let bytes = sink.bytes;
    let sha256 = sha256_hex(&bytes);
    if format!("sha256:{sha256}") != layer.digest {
        return Err(OciError::DigestMismatch {
            reference: name,
            what: "component layer",
            expected: layer.digest,
            actual: format!("they hash to sha256:{sha256}"),
        });
    }
    Ok(PulledComponent { bytes, sha256 })
}

/// The one component layer of a wasm artifact's manifest, or why it is not one.
fn wasm_layer(reference: &str, manifest: &[u8]) -> Result<OciDescriptor, OciError> {
    let not = |problem: String| OciError::NotAWasmArtifact {
        reference: reference.to_owned(),
        problem,
    };
    let manifest: OciImageManifest = serde_json::from_slice(manifest)
        .map_err(|e| not(format!("its manifest is not an OCI image manifest ({e})")))?;
    if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
        return Err(not(format!(
            "its config has media type `{}`",
            manifest.config.media_type
        )));
    }
    match manifest.layers.as_slice() {
        [layer] if layer.media_type == WASM_LAYER_MEDIA_TYPE => Ok(layer.clone()),
        [layer] => Err(not(format!(
            "its layer has media type `{}`",
            layer.media_type
        ))),
        layers => Err(not(format!("it has {} layers, not one", layers.len()))),
    }
}

/// The client's error as an [`OciError`]: a digest it found wrong is a mismatch, the rest a
/// failed pull.
fn pull_error(
    reference: &str,
    what: &'static str,
    expected: &str,
    error: OciDistributionError,
) -> OciError {
    match error {
        OciDistributionError::DigestError(inner) => OciError::DigestMismatch {
            reference: reference.to_owned(),
            what,
            expected: expected.to_owned(),
            actual: inner.to_string(),
        },
        other => OciError::Pull {
            reference: reference.to_owned(),
            message: error_chain(&other),
        },
    }
}

/// An error and its sources on one line: reqwest hides "connection refused" or the TLS
/// verifier's complaint in a source.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = inner.source();
    }
    text
}

/// The config of a wasm artifact, as the CNCF layout writes it (the `component` section with
/// the world's imports and exports is optional and left out).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig {
    created: String,
    architecture: &'static str,
    os: &'static str,
    layer_digests: Vec<String>,
}

/// Pushes `component` to `target` (`oci://<registry>/<repository>[:tag]`) as a wasm artifact
/// and returns the reference by digest that names it.
pub async fn push(
    target: &str,
    component: &[u8],
    access: &RegistryAccess,
    ca_source: &str,
) -> Result<PluginReference, OciError> {
    let failed = |message: String| OciError::Push {
        target: target.to_owned(),
        message,
    };
    let name = target
        .trim()
        .strip_prefix(SCHEME)
        .ok_or_else(|| OciError::BadReference {
            reference: target.to_owned(),
            problem: "it does not start with oci://".to_owned(),
        })?;
    let image: Reference = name.parse().map_err(|e| OciError::BadReference {
        reference: target.to_owned(),
        problem: format!("it is not <registry>/<repository>[:tag] ({e})"),
    })?;
    let layer_digest = format!("sha256:{}", sha256_hex(component));
    let config = serde_json::to_vec(&WasmConfig {
        created: created_now(),
        architecture: "wasm",
        os: "wasip2",
        layer_digests: vec![layer_digest.clone()],
    })
    .map_err(|e| failed(e.to_string()))?;
    let config_digest = format!("sha256:{}", sha256_hex(&config));
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_owned()),
        config: OciDescriptor {
            media_type: WASM_CONFIG_MEDIA_TYPE.to_owned(),
            digest: config_digest.clone(),
            size: i64::try_from(config.len()).unwrap_or(i64::MAX),
            ..Default::default()
        },
        layers: vec![OciDescriptor {
            media_type: WASM_LAYER_MEDIA_TYPE.to_owned(),
            digest: layer_digest.clone(),
            size: i64::try_from(component.len()).unwrap_or(i64::MAX),
            ..Default::default()
        }],
        ..Default::default()
    };
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|e| failed(e.to_string()))?;
    let client = access.client(ca_source)?;
    client
        .auth(&image, &access.auth(), oci_client::RegistryOperation::Push)
        .await
        .map_err(|e| failed(error_chain(&e)))?;
    client
        .push_blob(&image, component.to_vec(), &layer_digest)
        .await
        .map_err(|e| failed(error_chain(&e)))?;
    client
        .push_blob(&image, config, &config_digest)
        .await
        .map_err(|e| failed(error_chain(&e)))?;
    client
        .push_manifest_raw(
            &image,
            manifest_bytes.clone(),
            http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE),
        )
        .await
        .map_err(|e| failed(error_chain(&e)))?;
    Ok(PluginReference {
        registry: image.registry().to_owned(),
        repository: image.repository().to_owned(),
        digest: format!("sha256:{}", sha256_hex(&manifest_bytes)),
    })
}

/// RFC 3339 of now, UTC, to the second.
fn created_now() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = seconds / 86_400;
    let (hour, minute, second) = ((seconds / 3600) % 24, (seconds / 60) % 60, seconds % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

/// Collects a download in memory and refuses it past `limit` bytes.
struct BoundedSink {
    bytes: Vec<u8>,
    limit: u64,
    seen: u64,
    overflowed: bool,
}

impl BoundedSink {
    fn new(limit: u64) -> BoundedSink {
        BoundedSink {
            bytes: Vec::new(),
            limit,
            seen: 0,
            overflowed: false,
        }
    }
}

impl tokio::io::AsyncWrite for BoundedSink {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.seen = self
            .seen
            .saturating_add(u64::try_from(buf.len()).unwrap_or(u64::MAX));
        if self.seen > self.limit {
            self.overflowed = true;
            return Poll::Ready(Err(std::io::Error::other(
                "the component is larger than the pull limit",
            )));
        }
        self.bytes.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_reference_by_digest_parses_and_prints_back() {
        let text = format!("oci://127.0.0.1:5000/plugins/etcd@{DIGEST}");
        let reference = PluginReference::parse(&text).expect("a valid reference");
        assert_eq!(reference.registry, "127.0.0.1:5000");
        assert_eq!(reference.repository, "plugins/etcd");
        assert_eq!(reference.digest, DIGEST);
        assert_eq!(reference.to_string(), text);
        // A tag before the digest is a label only.
        let tagged = PluginReference::parse(&format!("oci://r.example/p:1.0@{DIGEST}"))
            .expect("a valid reference");
        assert_eq!(tagged.repository, "p");
    }

    #[test]
    fn references_without_a_sha256_digest_are_refused() {
        for text in [
            "oci://r.example/plugins/etcd:1.0",
            "r.example/plugins/etcd@sha256:00",
            "oci://r.example/plugins/etcd@sha512:00",
            "oci://r.example/plugins/etcd@sha256:0123",
            &format!("oci://r.example@{DIGEST}"),
            &format!("oci://r.example/p@sha256:{}", "0123456789ABCDEF".repeat(4)),
        ] {
            let error = PluginReference::parse(text).expect_err(text);
            assert_eq!(error.reason(), "PluginReferenceInvalid", "{text}");
        }
    }

    #[test]
    fn docker_config_credentials_come_from_username_or_auth() {
        let plain = br#"{"auths":{"127.0.0.1:5000":{"username":"u","password":"p"}}}"#;
        assert_eq!(
            credentials_from_docker_config(plain, "127.0.0.1:5000"),
            Ok(Some(("u".into(), "p".into())))
        );
        // `docker login` writes an https:// key and a base64 auth of user:password.
        let encoded = br#"{"auths":{"https://r.example/":{"auth":"dTpwOnE="}}}"#;
        assert_eq!(
            credentials_from_docker_config(encoded, "r.example"),
            Ok(Some(("u".into(), "p:q".into())))
        );
        assert_eq!(
            credentials_from_docker_config(plain, "other.example"),
            Ok(None)
        );
        assert!(credentials_from_docker_config(b"{", "r.example").is_err());
        assert!(
            credentials_from_docker_config(br#"{"auths":{"r.example":{}}}"#, "r.example").is_err()
        );
    }

    fn manifest(config: &str, layers: &[&str]) -> Vec<u8> {
        let layers: Vec<_> = layers
            .iter()
            .map(|media_type| serde_json::json!({"mediaType": media_type, "digest": DIGEST, "size": 3}))
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "config": {"mediaType": config, "digest": DIGEST, "size": 2},
            "layers": layers,
        }))
        .expect("JSON")
    }

    #[test]
    fn only_the_wasm_layout_with_one_component_layer_is_an_artifact() {
        let good = manifest(WASM_CONFIG_MEDIA_TYPE, &[WASM_LAYER_MEDIA_TYPE]);
        assert_eq!(
            wasm_layer("r", &good).expect("the layout").media_type,
            WASM_LAYER_MEDIA_TYPE
        );
        for (bad, says) in [
            (
                manifest(
                    "application/vnd.oci.image.config.v1+json",
                    &[WASM_LAYER_MEDIA_TYPE],
                ),
                "config has media type",
            ),
            (
                manifest(
                    WASM_CONFIG_MEDIA_TYPE,
                    &["application/vnd.oci.image.layer.v1.tar+gzip"],
                ),
                "layer has media type",
            ),
            (
                manifest(
                    WASM_CONFIG_MEDIA_TYPE,
                    &[WASM_LAYER_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE],
                ),
                "2 layers",
            ),
            (b"{}".to_vec(), "not an OCI image manifest"),
        ] {
            let error = wasm_layer("r", &bad).expect_err(says);
            assert!(error.to_string().contains(says), "{error}");
        }
    }

    #[test]
    fn the_sink_refuses_past_its_limit() {
        use tokio::io::AsyncWriteExt;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let mut sink = BoundedSink::new(4);
            sink.write_all(b"abcd").await.expect("within the limit");
            assert!(sink.write_all(b"e").await.is_err());
            assert!(sink.overflowed);
            assert_eq!(sink.bytes, b"abcd");
        });
    }

    #[test]
    fn created_is_rfc3339() {
        let created = created_now();
        assert_eq!(created.len(), 20, "{created}");
        assert!(
            created.ends_with('Z') && created.as_bytes()[10] == b'T',
            "{created}"
        );
    }
}
