//! The plugin author's and admin's tools behind `policy-host new-plugin`, `validate`, `pack`
//! and `simulate`: a new plugin crate, the same checks the host runs when it loads a ConfigMap,
//! and the plugin's reconcile loop against a model, offline, with no cluster.

pub mod keygen;
pub mod new_plugin;
pub mod simulate;

use std::path::{Path, PathBuf};

use crate::capability::scope::{Grants, capability_text};
use crate::contract::CONTRACT_VERSION;
use crate::decide::{Limits, Plugin, Sandbox};
use crate::load::bundle;
use crate::load::oci::{self, OciError, RegistryAccess};
use crate::load::pack::{
    self, CaSource, LimitsSpec, Mode, PackDefaults, PackOptions, RegistryPull,
};
use crate::load::trust::{self, SigningKey, TrustError};
use crate::load::{CONTRACT_PACKAGE, LoadError, PluginLoader};

/// Largest ConfigMap the API server stores (etcd's default request limit).
pub const CONFIG_MAP_LIMIT: usize = 1 << 20;

/// Why a plugin tool failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The plugin was refused, as the host would refuse it.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The sandbox could not start.
    #[error(transparent)]
    Sandbox(#[from] crate::decide::DecideError),
    /// A signing key could not be used.
    #[error(transparent)]
    Trust(#[from] TrustError),
    /// The bundle's CRDs do not fit the plugin.
    #[error(transparent)]
    Bundle(#[from] bundle::BundleError),
    /// The component could not be pushed to the registry.
    #[error(transparent)]
    Oci(#[from] OciError),
    /// The limits given are out of range.
    #[error("{0}")]
    Limits(String),
    /// The pack could not be written.
    #[error("cannot write the pack: {0}")]
    Write(String),
    /// The simulation's inputs are not usable.
    #[error("{0}")]
    Simulate(String),
    /// The pack would not fit a ConfigMap.
    #[error(
        "the packed plugin is {size} bytes, over the {CONFIG_MAP_LIMIT} byte ConfigMap limit; build it with the `plugin` profile (opt-level s, LTO, stripped) to make it smaller"
    )]
    TooLarge {
        /// The ConfigMap's size.
        size: usize,
    },
}

/// Reads and loads the plugin at `path` the way the host loads one: every check, then
/// `describe()`. Returns the plugin and its bytes.
async fn load_plugin_file(path: &Path, limits: Limits) -> Result<(Plugin, Vec<u8>), CliError> {
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
    let loader = PluginLoader::new(Sandbox::new()?, None);
    let sha256 = pack::sha256_hex(&bytes);
    let (plugin, _) = loader
        .load(&path.display().to_string(), &bytes, &sha256, limits)
        .await?;
    Ok((plugin, bytes))
}

/// What `validate` found: the self-description and the checks it passed, as JSON.
pub async fn validate(
    path: &Path,
    limits: &LimitsSpec,
    defaults: &PackDefaults,
) -> Result<serde_json::Value, CliError> {
    let (limits, concurrency) = limits.resolve(defaults).map_err(CliError::Limits)?;
    let (plugin, bytes) = load_plugin_file(path, limits.clone()).await?;
    let packed = pack::to_config_map(&bytes, &PackOptions::default())
        .map_err(|e| CliError::Write(e.to_string()))?;
    let packed_size = serde_json::to_vec(&packed).map_or(0, |v| v.len());
    let info = plugin.info();
    Ok(serde_json::json!({
        "valid": true,
        // The version the plugin was built against (a 0.1 plugin is served beside 0.2).
        "contract": format!("{CONTRACT_PACKAGE}@{}", plugin.contract_version()),
        "hostContract": format!("{CONTRACT_PACKAGE}@{CONTRACT_VERSION}"),
        "world": "policy-plugin",
        "name": info.name,
        "version": info.version,
        "sha256": plugin.content_sha256(),
        "target": info.target.to_string(),
        "children": info.children.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
        "capabilities": info.capabilities.iter().map(capability_text).collect::<Vec<_>>(),
        "wantsFinalizer": info.wants_finalizer,
        // The domain metrics it declared (contract 0.2.3), as the host exports them.
        "metrics": plugin.declared_metrics().iter().map(|m| {
            let name = format!("policy_host_{}", crate::metrics::plugin::exported_name(&info.name, &m.name));
            serde_json::json!({
                "name": match m.kind {
                    crate::capability::metrics::MetricKind::Counter => format!("{name}_total"),
                    crate::capability::metrics::MetricKind::Gauge => name,
                },
                "kind": m.kind.as_str(),
                "labels": m.labels,
            })
        }).collect::<Vec<_>>(),
        "describedWithin": {
            "deadlineMs": u64::try_from(limits.deadline.as_millis()).unwrap_or(u64::MAX),
            "memoryMiB": limits.memory_bytes >> 20,
            "outputKiB": limits.output_bytes >> 10,
            "concurrency": concurrency,
        },
        "componentBytes": bytes.len(),
        "packedConfigMapBytes": packed_size,
        "fitsConfigMap": packed_size <= CONFIG_MAP_LIMIT,
    }))
}

/// What `pack` needs besides the component.
#[derive(Clone, Debug, Default)]
pub struct PackRequest {
    /// ConfigMap name (`None`: the plugin's own name).
    pub name: Option<String>,
    /// ConfigMap namespace.
    pub namespace: Option<String>,
    /// What the admin grants.
    pub grants: Grants,
    /// Grant every capability the plugin asks for (added to `grants`).
    pub grant_requested: bool,
    /// Limits to write.
    pub limits: LimitsSpec,
    /// Shadow instead of active.
    pub shadow: bool,
    /// A staged rollout over the active plugin instead of replacing it (wins over `shadow`).
    pub rollout: Option<crate::rollout::RolloutSpec>,
    /// Sign the pack with this ed25519 private key (PEM, PKCS#8).
    pub sign: Option<PathBuf>,
    /// The signed pack's serial (`None`: the current Unix time in seconds).
    pub serial: Option<u64>,
    /// Write a bundle with these CRD files (one must define the plugin's target) and the
    /// plugin's ClusterRole before the ConfigMap; empty: the ConfigMap alone.
    pub bundle_crds: Vec<PathBuf>,
    /// Push the component to a registry and write a ConfigMap naming it by digest instead of
    /// carrying it.
    pub push: Option<PushRequest>,
}

/// Where `pack --push` puts the component, and what the ConfigMap tells the host.
#[derive(Clone, Debug, Default)]
pub struct PushRequest {
    /// `oci://<registry>/<repository>[:tag]`.
    pub target: String,
    /// PEM of the registry's CA, for the push (`None`: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// A docker `config.json` with credentials for the registry (`None`: anonymous).
    pub auth_file: Option<PathBuf>,
    /// `data.pullSecret`: the dockerconfigjson Secret the host pulls with.
    pub pull_secret: Option<String>,
    /// `data.registryCA`: `secret/<name>` or `configmap/<name>` holding `ca.crt`.
    pub pull_ca: Option<String>,
}

impl PushRequest {
    /// The registry access the push uses, read from the files given.
    fn access(&self, registry: &str) -> Result<(RegistryAccess, String), CliError> {
        let mut access = RegistryAccess::default();
        let mut ca_source = "the system's roots".to_owned();
        if let Some(path) = &self.ca_file {
            ca_source = path.display().to_string();
            access.ca_pem = Some(std::fs::read(path).map_err(|e| OciError::BadRegistryCa {
                source_name: ca_source.clone(),
                problem: format!("cannot read it ({e})"),
            })?);
        }
        if let Some(path) = &self.auth_file {
            let bad = |problem: String| OciError::BadPullSecret {
                secret: path.display().to_string(),
                problem,
            };
            let json = std::fs::read(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
            access.credentials = Some(
                oci::credentials_from_docker_config(&json, registry)
                    .map_err(&bad)?
                    .ok_or_else(|| bad(format!("it holds no credentials for {registry}")))?,
            );
        }
        Ok((access, ca_source))
    }

    /// `data.registryCA` as the pack writes it.
    fn pull_ca(&self) -> Result<Option<CaSource>, CliError> {
        let Some(text) = &self.pull_ca else {
            return Ok(None);
        };
        match text.split_once('/') {
            Some(("secret", name)) if !name.is_empty() => Ok(Some(CaSource::Secret(name.into()))),
            Some(("configmap", name)) if !name.is_empty() => {
                Ok(Some(CaSource::ConfigMap(name.into())))
            }
            _ => Err(CliError::Write(format!(
                "--pull-ca `{text}`: write secret/<name> or configmap/<name> (an object of the plugin namespace whose key ca.crt is the registry's CA)"
            ))),
        }
    }
}

/// Validates the plugin as the host would, then writes its pack ConfigMap as YAML.
pub async fn pack(
    path: &Path,
    request: &PackRequest,
    defaults: &PackDefaults,
) -> Result<String, CliError> {
    let (limits, _) = request.limits.resolve(defaults).map_err(CliError::Limits)?;
    let (plugin, bytes) = load_plugin_file(path, limits).await?;
    let mut grants = request.grants.clone();
    if request.grant_requested {
        for capability in &plugin.info().capabilities {
            grants.grant(capability);
        }
    }
    let options = PackOptions {
        name: request
            .name
            .clone()
            .unwrap_or_else(|| format!("plugin-{}", plugin.info().name)),
        namespace: request.namespace.clone(),
        grants,
        limits: request.limits.clone(),
        mode: if request.rollout.is_some() {
            Mode::Rollout
        } else if request.shadow {
            Mode::Shadow
        } else {
            Mode::Active
        },
        rollout: request.rollout.clone(),
    };
    // Read the key and the CRDs before the work is done: a wrong path fails fast.
    let signer = request
        .sign
        .as_deref()
        .map(SigningKey::from_pem_file)
        .transpose()?;
    let crds = read_crds(&request.bundle_crds)?;
    if !crds.is_empty() {
        bundle::check_crds(plugin.info(), &crds)?;
    }
    let mut config_map = match &request.push {
        None => {
            pack::to_config_map(&bytes, &options).map_err(|e| CliError::Write(e.to_string()))?
        }
        Some(push) => {
            let pull_ca = push.pull_ca()?;
            let registry = push
                .target
                .trim()
                .trim_start_matches(oci::SCHEME)
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            let (access, ca_source) = push.access(&registry)?;
            let reference = oci::push(&push.target, &bytes, &access, &ca_source).await?;
            let pull = RegistryPull {
                reference,
                pull_secret: push.pull_secret.clone(),
                registry_ca: pull_ca,
            };
            pack::to_reference_config_map(&pull, plugin.content_sha256(), &options)
        }
    };
    if let Some(signer) = &signer {
        if let Some(serial) = request.serial {
            config_map
                .data
                .get_or_insert_with(Default::default)
                .insert(trust::SERIAL_KEY.to_owned(), serial.to_string());
        }
        signer.sign(&mut config_map, plugin.content_sha256());
    }
    let size = serde_json::to_vec(&config_map).map_or(0, |v| v.len());
    if size > CONFIG_MAP_LIMIT {
        return Err(CliError::TooLarge { size });
    }
    let signed = signer.map_or_else(
        || "unsigned".to_owned(),
        |s| format!("signed by key {}", s.id()),
    );
    let yaml = serde_yaml::to_string(&config_map).map_err(|e| CliError::Write(e.to_string()))?;
    if request.bundle_crds.is_empty() {
        let pushed = config_map
            .data
            .as_ref()
            .and_then(|d| d.get(pack::REFERENCE_KEY))
            .map(|r| format!(", pushed as {r}"))
            .unwrap_or_default();
        let header = format!(
            "# {} packed by `policy-host pack` (sha256 {}{pushed}, {signed}).\n# Apply it in the namespace the host watches (--plugin-namespace).\n",
            plugin.label(),
            plugin.content_sha256()
        );
        return Ok(format!("{header}{yaml}"));
    }
    let header = format!(
        "# {} bundled by `policy-host pack --bundle` (sha256 {}, {signed}): its CRD, the\n# ClusterRole the host needs on its kinds (aggregated into `policy-host`) and the plugin\n# ConfigMap. Load it with `kubectl apply --server-side -f` of this file.\n",
        plugin.label(),
        plugin.content_sha256()
    );
    let role = bundle::plugin_cluster_role(
        &options.name,
        plugin.info(),
        options.grants.kinds.as_deref(),
    );
    bundle::render(&header, &crds, &role, &yaml).map_err(|e| CliError::Write(e.to_string()))
}

/// Reads the CRD files of a bundle.
fn read_crds(paths: &[PathBuf]) -> Result<Vec<bundle::CrdDocument>, CliError> {
    Ok(paths
        .iter()
        .map(|path| bundle::CrdDocument::read(path))
        .collect::<Result<_, _>>()?)
}

/// The defaults `validate` and `pack` check limits against: the host's own defaults.
pub fn host_defaults() -> PackDefaults {
    PackDefaults {
        limits: Limits::default(),
        concurrency: 8,
    }
}

/// Loads the plugin at `path` as the host would and runs [`simulate::simulate`], printing each
/// step (text, or one JSON object per line) as it happens.
pub async fn simulate_plugin(
    path: &Path,
    limits: &LimitsSpec,
    request: &simulate::SimulateRequest,
) -> Result<Vec<simulate::Step>, CliError> {
    let (limits, _) = limits.resolve(&host_defaults()).map_err(CliError::Limits)?;
    let (plugin, _) = load_plugin_file(path, limits).await?;
    let json = request.json;
    simulate::simulate(&plugin, request, |step| {
        if json {
            println!("{}", serde_json::to_string(step).unwrap_or_default());
        } else {
            print!("{}", simulate::step_text(step));
        }
    })
    .await
}
