//! A real OCI registry for the suites that load plugins by digest: distribution's `registry`
//! (the CNCF reference implementation), built on demand (`tests/env/build-binaries.sh
//! registry`), serving HTTPS on 127.0.0.1 with a certificate of a CA the test makes, and
//! htpasswd (basic) authentication, so the host's CA and pull-Secret paths are the ones used.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use policy_host::load::pack::CA_KEY;
use policy_host_testenv::Binaries;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    SanType,
};

use crate::etcd::eventually;

/// The user the registry lets push and pull.
pub const USER: &str = "policyhoste2e";
/// That user's password.
pub const PASSWORD: &str = "policyhoste2esecret";
/// bcrypt of [`PASSWORD`] (cost 10), as htpasswd holds it: made once with Go's
/// golang.org/x/crypto/bcrypt, so the test needs no htpasswd tool.
const PASSWORD_BCRYPT: &str = "$2a$10$KVTBLPURWlPWyMxnn/kkyOtmiK7HmJJXTGo69bFJR7vFC06HmqpJS";

/// A registry on 127.0.0.1 with its storage, certificates and config in a directory of its
/// own; killed and its directory removed on drop.
pub struct Registry {
    /// `127.0.0.1:<port>`: the registry part of a reference.
    pub address: String,
    /// PEM of the CA that signed its serving certificate.
    pub ca_pem: String,
    /// Its directory (config, certificates, `storage/`).
    pub dir: PathBuf,
    _server: tokio::process::Child,
}

impl Registry {
    /// Builds the registry if needed, makes a CA and a serving certificate for 127.0.0.1,
    /// starts it on a free port and waits until it accepts connections.
    pub async fn start(binaries: &Binaries) -> anyhow::Result<Registry> {
        let binaries = binaries.clone();
        let program = tokio::task::spawn_blocking(move || binaries.ensure_registry()).await??;
        let port = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "policy-host-registry-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("storage"))?;

        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        let mut serving = CertificateParams::new(Vec::<String>::new())?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(Ipv4Addr::LOCALHOST.into()));
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate()?;
        let serving_cert = serving.signed_by(&serving_key, &ca)?;
        std::fs::write(dir.join("tls.crt"), serving_cert.pem())?;
        std::fs::write(dir.join("tls.key"), serving_key.serialize_pem())?;
        std::fs::write(dir.join("htpasswd"), format!("{USER}:{PASSWORD_BCRYPT}\n"))?;
        let address = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\n\
             log:\n  level: warn\n\
             storage:\n  filesystem:\n    rootdirectory: {storage}\n\
             http:\n  addr: {address}\n  tls:\n    certificate: {dir}/tls.crt\n    key: {dir}/tls.key\n\
             auth:\n  htpasswd:\n    realm: policy-host-e2e\n    path: {dir}/htpasswd\n",
            storage = dir.join("storage").display(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("config.yml"), config)?;
        let server = tokio::process::Command::new(program)
            .arg("serve")
            .arg(dir.join("config.yml"))
            // No tracing exporter: nothing listens for one.
            .env("OTEL_TRACES_EXPORTER", "none")
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let registry = Registry {
            address,
            ca_pem: ca.pem(),
            dir,
            _server: server,
        };
        let address = registry.address.clone();
        eventually("the registry to listen", Duration::from_secs(60), || {
            let address = address.clone();
            async move {
                tokio::net::TcpStream::connect(&address)
                    .await
                    .map(drop)
                    .map_err(|e| format!("{address}: {e}"))
            }
        })
        .await?;
        Ok(registry)
    }

    /// The file of the blob with `digest` (`sha256:<hex>`) in the registry's storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(hex.get(..2).unwrap_or_default())
            .join(hex)
            .join("data")
    }

    /// A docker `config.json` granting [`USER`] on this registry.
    pub fn docker_config_json(&self) -> String {
        serde_json::json!({
            "auths": { self.address.clone(): { "username": USER, "password": PASSWORD } }
        })
        .to_string()
    }
}

impl Registry {
    /// Creates what an admin creates beside a plugin ConfigMap that names a component in this
    /// registry, in `namespace`: the pull Secret `secret` (type `kubernetes.io/dockerconfigjson`,
    /// [`Registry::docker_config_json`]) and the ConfigMap `ca_config_map` holding its CA under
    /// `ca.crt`.
    pub async fn admit(
        &self,
        client: &Client,
        namespace: &str,
        secret: &str,
        ca_config_map: &str,
    ) -> anyhow::Result<()> {
        let named = |name: &str| ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), namespace)
            .create(
                &PostParams::default(),
                &Secret {
                    metadata: named(secret),
                    type_: Some("kubernetes.io/dockerconfigjson".into()),
                    data: Some(
                        [(
                            ".dockerconfigjson".to_string(),
                            ByteString(self.docker_config_json().into_bytes()),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
            )
            .await?;
        Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: named(ca_config_map),
                    data: Some([(CA_KEY.to_string(), self.ca_pem.clone())].into()),
                    ..Default::default()
                },
            )
            .await?;
        Ok(())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // The server is killed by its handle (`kill_on_drop`); its storage goes with it.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
