//! The plugin pack: how a plugin travels in a ConfigMap, and how it is read back.
//!
//! A pack is a ConfigMap labelled [`PLUGIN_LABEL`]`: "true"` in the namespace the host loads
//! plugins from:
//!
//! | key | where | what |
//! |---|---|---|
//! | `plugin.wasm.gz` or `plugin.wasm` | `binaryData` | the component, gzip-compressed (so ~3 MiB fit the 1 MiB object limit) or raw; exactly one, or a `reference` |
//! | `reference` | `data` | instead of the component: `oci://<registry>/<repository>@sha256:<manifest digest>`, pulled by the host ([`crate::load::oci`]) |
//! | `pullSecret` | `data`, optional | with `reference`: a `kubernetes.io/dockerconfigjson` Secret of the plugin namespace holding the registry's credentials |
//! | `registryCA` | `data`, optional | with `reference`: `secret/<name>` or `configmap/<name>` of the plugin namespace whose key `ca.crt` is the registry's CA (PEM); absent: the system's roots |
//! | `sha256` | `data`, optional | hex sha256 of the *uncompressed* component; a mismatch refuses the load |
//! | `grants` | `data`, optional | YAML, e.g. `{appCall: [client], exchange: [redis], chaos: true, images: [redis]}`: ports of its own pods the plugin may app-call (HTTP) or hold TCP exchanges with, whether its parents may ask for chaos drills ([`crate::chaos`]), the child kinds it may write, its pods' security level and images ([`crate::pod_inputs`]); absent means none (and any image) |
//! | `limits` | `data`, optional | YAML, e.g. `{deadlineMs: 5000, memoryMiB: 64, outputKiB: 4096, concurrency: 8}`; each absent field takes the host's default |
//! | `mode` | `data`, optional | `active` (default), `shadow` or `rollout` |
//! | `rollout` | `data`, with `mode: rollout` only | YAML, e.g. `{selector: {matchLabels: {ring: canary}}, percent: 10, maxFailureRate: 0.2, minDecisions: 10}`: which parents the candidate decides for, and when it is rolled back ([`crate::rollout`]) |
//! | `serial`, `signature`, `signedBy` | `data`, optional | the signature over all of the above and its key ([`crate::load::trust`]) |
//!
//! Reading a pack only decodes and checks what the ConfigMap says; compiling the component is
//! the loader's job ([`crate::load::PluginLoader`]).

use crate::capability::credentials::SecretGrant;
use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::oci::{OciError, PluginReference, PulledComponent};
use crate::capability::scope::Grants;
use crate::decide::{Limits, MAX_PLUGIN_MEMORY};
use crate::rollout::RolloutSpec;

/// The label that marks a ConfigMap as a plugin pack.
pub const PLUGIN_LABEL: &str = "policy-host.io/plugin";
/// `binaryData` key of a raw component.
pub const RAW_KEY: &str = "plugin.wasm";
/// `binaryData` key of a gzip-compressed component.
pub const GZIP_KEY: &str = "plugin.wasm.gz";
/// `data` key of the sha256 pin.
pub const SHA256_KEY: &str = "sha256";
/// `data` key of the grants.
pub const GRANTS_KEY: &str = "grants";
/// `data` key of the limits.
pub const LIMITS_KEY: &str = "limits";
/// `data` key of the mode.
pub const MODE_KEY: &str = "mode";
/// `data` key of a rollout's settings.
pub const ROLLOUT_KEY: &str = "rollout";
/// `data` key of the registry reference a pack names instead of carrying the component.
pub const REFERENCE_KEY: &str = "reference";
/// `data` key of the pull Secret's name.
pub const PULL_SECRET_KEY: &str = "pullSecret";
/// `data` key of the object holding the registry's CA.
pub const REGISTRY_CA_KEY: &str = "registryCA";
/// The key of the registry CA's PEM in the Secret or ConfigMap `registryCA` names.
pub const CA_KEY: &str = "ca.crt";

/// Largest component a pack may decompress to: a bound on gzip bombs, far above any plugin.
pub const MAX_COMPONENT_BYTES: usize = 32 << 20;
/// Longest deadline an admin may set: a reconcile holds a pool slot for that long.
pub const MAX_DEADLINE: Duration = Duration::from_secs(300);
/// Most parents of one policy reconciled at once (the sandbox pool has 128 slots in all).
pub const MAX_CONCURRENCY: u16 = 64;

/// Whether a pack's plugin decides or only shadows the active one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Its decisions are carried out.
    #[default]
    Active,
    /// Runs beside the active plugin of the same name; its decisions are only compared.
    Shadow,
    /// Decides, and is acted on, for the parents its `data.rollout` selects; the active plugin
    /// of its kind decides for the rest.
    Rollout,
}

impl Mode {
    /// How `data.mode` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Active => "active",
            Mode::Shadow => "shadow",
            Mode::Rollout => "rollout",
        }
    }
}

/// What an admin may set per plugin; every absent field takes the host's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitsSpec {
    /// Wall-clock deadline of one decision, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Memory cap of one instance, in MiB.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<usize>,
    /// Output cap of one decision, in KiB.
    #[serde(default, rename = "outputKiB", skip_serializing_if = "Option::is_none")]
    pub output_kib: Option<usize>,
    /// Parents reconciled at the same time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u16>,
}

/// What an admin grants, as written in a pack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantsSpec {
    /// Ports (names or numbers) of its own pods the plugin may app-call (HTTP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub app_call: Vec<String>,
    /// Ports (names or numbers) of its own pods the plugin may hold TCP exchanges with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exchange: Vec<String>,
    /// Parents may ask for chaos drills on their own pods (`policy-host.io/chaos`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chaos: bool,
    /// The child kinds it may write (`pods.v1`, `services.v1`, `deployments.apps/v1`);
    /// absent: every kind it declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<String>>,
    /// `baseline` (default) or `privileged`: what its pods may reach of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<String>,
    /// The images its pods may run (repositories, or prefixes ending in `/`); absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
    /// Secrets of its parents' namespaces it may read credentials from, and the keys the host
    /// generates in them ([`crate::capability::credentials`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretGrant>,
}

/// The defaults a pack's limits start from (the host's command-line limits).
#[derive(Clone, Debug)]
pub struct PackDefaults {
    /// Sandbox limits.
    pub limits: Limits,
    /// Reconcile concurrency.
    pub concurrency: u16,
}

/// Where a registry CA comes from: an object of the plugin namespace, under [`CA_KEY`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaSource {
    /// `secret/<name>`.
    Secret(String),
    /// `configmap/<name>`.
    ConfigMap(String),
}

impl std::fmt::Display for CaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaSource::Secret(name) => write!(f, "secret/{name}"),
            CaSource::ConfigMap(name) => write!(f, "configmap/{name}"),
        }
    }
}

/// How a pack that names its component by digest has it pulled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryPull {
    /// The artifact.
    pub reference: PluginReference,
    /// The dockerconfigjson Secret with the registry's credentials (`None`: anonymous).
    pub pull_secret: Option<String>,
    /// The registry's CA (`None`: the system's roots).
    pub registry_ca: Option<CaSource>,
}

/// A decoded, checksum-verified pack, not yet compiled.
#[derive(Clone, Debug)]
pub struct PluginPack {
    /// The component bytes (decompressed); empty until pulled when `pull` is set.
    pub component: Vec<u8>,
    /// Hex sha256 of `component`; when `pull` is set and nothing is pulled yet, the pin
    /// (`data.sha256`) or empty.
    pub sha256: String,
    /// Where the component is pulled from, when the pack names it instead of carrying it.
    pub pull: Option<RegistryPull>,
    /// What the admin granted.
    pub grants: Grants,
    /// The sandbox limits.
    pub limits: Limits,
    /// Parents reconciled at the same time.
    pub concurrency: u16,
    /// Active, shadow or rollout.
    pub mode: Mode,
    /// With [`Mode::Rollout`], which parents and when to roll back.
    pub rollout: Option<RolloutSpec>,
}

/// Why a ConfigMap is not a usable pack. Each says which ConfigMap and what to change.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// Neither component key is present.
    #[error(
        "ConfigMap {config_map} carries no plugin: put the component in binaryData[\"{GZIP_KEY}\"] (gzip) or binaryData[\"{RAW_KEY}\"] (raw); `policy-host pack plugin.wasm` writes one"
    )]
    NoComponent {
        /// namespace/name.
        config_map: String,
    },
    /// Both component keys are present.
    #[error(
        "ConfigMap {config_map} carries both binaryData[\"{GZIP_KEY}\"] and binaryData[\"{RAW_KEY}\"]; keep only one"
    )]
    TwoComponents {
        /// namespace/name.
        config_map: String,
    },
    /// The gzip stream does not decode.
    #[error(
        "ConfigMap {config_map}: binaryData[\"{GZIP_KEY}\"] is not valid gzip ({source}); compress the component with gzip, or store it raw under \"{RAW_KEY}\""
    )]
    Gzip {
        /// namespace/name.
        config_map: String,
        /// The decoder's error.
        #[source]
        source: std::io::Error,
    },
    /// The component decompresses past [`MAX_COMPONENT_BYTES`].
    #[error(
        "ConfigMap {config_map}: the component decompresses to more than {MAX_COMPONENT_BYTES} bytes; that is no plugin (or a gzip bomb)"
    )]
    TooLarge {
        /// namespace/name.
        config_map: String,
    },
    /// The sha256 pin is not 64 hex digits.
    #[error(
        "ConfigMap {config_map}: data[\"{SHA256_KEY}\"] = `{pin}` is not a sha256 (64 hex digits); write `sha256sum plugin.wasm`'s output or remove the key"
    )]
    BadPin {
        /// namespace/name.
        config_map: String,
        /// The pin as written.
        pin: String,
    },
    /// The component does not have the pinned sha256.
    #[error(
        "ConfigMap {config_map}: checksum mismatch: data[\"{SHA256_KEY}\"] pins {expected} but the component's sha256 is {actual}; the component was altered or the pin is stale, repack it with `policy-host pack`"
    )]
    ChecksumMismatch {
        /// namespace/name.
        config_map: String,
        /// The pin.
        expected: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// `data.grants` is not valid.
    #[error(
        "ConfigMap {config_map}: data[\"{GRANTS_KEY}\"] is not valid ({message}); write e.g. `appCall: [client]`"
    )]
    Grants {
        /// namespace/name.
        config_map: String,
        /// The parser's message.
        message: String,
    },
    /// `data.limits` is not valid or out of range.
    #[error("ConfigMap {config_map}: data[\"{LIMITS_KEY}\"] is not valid: {message}")]
    Limits {
        /// namespace/name.
        config_map: String,
        /// What is wrong and the allowed range.
        message: String,
    },
    /// `data.mode` is neither `active` nor `shadow`.
    #[error(
        "ConfigMap {config_map}: data[\"{MODE_KEY}\"] = `{mode}`; write `active`, `shadow` or `rollout`"
    )]
    Mode {
        /// namespace/name.
        config_map: String,
        /// The mode as written.
        mode: String,
    },
    /// `data.rollout` is not valid, missing in mode `rollout`, or present in another mode.
    #[error("ConfigMap {config_map}: data[\"{ROLLOUT_KEY}\"]: {message}")]
    Rollout {
        /// namespace/name.
        config_map: String,
        /// What is wrong and what to write.
        message: String,
    },
    /// The pack both carries a component and names one in a registry.
    #[error(
        "ConfigMap {config_map} carries a component in binaryData and names one in data[\"{REFERENCE_KEY}\"]; keep only one"
    )]
    ComponentAndReference {
        /// namespace/name.
        config_map: String,
    },
    /// `data.reference` is not a reference by digest.
    #[error("ConfigMap {config_map}: data[\"{REFERENCE_KEY}\"]: {source}")]
    Reference {
        /// namespace/name.
        config_map: String,
        /// What is wrong with it.
        #[source]
        source: OciError,
    },
    /// `data.registryCA` does not name a Secret or ConfigMap.
    #[error(
        "ConfigMap {config_map}: data[\"{REGISTRY_CA_KEY}\"] = `{value}`; write `secret/<name>` or `configmap/<name>` of an object in this namespace whose key `{CA_KEY}` is the registry's CA"
    )]
    RegistryCa {
        /// namespace/name.
        config_map: String,
        /// The value as written.
        value: String,
    },
}

impl PackError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PackError::NoComponent { .. } | PackError::TwoComponents { .. } => "PluginMissing",
            PackError::Gzip { .. } => "PluginGzipInvalid",
            PackError::TooLarge { .. } => "PluginTooLarge",
            PackError::BadPin { .. } | PackError::ChecksumMismatch { .. } => {
                "PluginChecksumMismatch"
            }
            PackError::Grants { .. } => "PluginGrantsInvalid",
            PackError::Limits { .. } => "PluginLimitsInvalid",
            PackError::Mode { .. } => "PluginModeInvalid",
            PackError::Rollout { .. } => "PluginRolloutInvalid",
            PackError::ComponentAndReference { .. } => "PluginMissing",
            PackError::Reference { source, .. } => source.reason(),
            PackError::RegistryCa { .. } => "PluginRegistryCaInvalid",
        }
    }
}

/// Hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl PluginPack {
    /// Decodes and checks a pack ConfigMap: component (gunzipped), sha256 pin, grants, limits
    /// and mode.
    pub fn from_config_map(cm: &ConfigMap, defaults: &PackDefaults) -> Result<Self, PackError> {
        let config_map = format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any());
        let empty_binary = BTreeMap::new();
        let binary = cm.binary_data.as_ref().unwrap_or(&empty_binary);
        let empty_data = BTreeMap::new();
        let data = cm.data.as_ref().unwrap_or(&empty_data);

        let pull = match data.get(REFERENCE_KEY) {
            None => None,
            Some(_) if binary.contains_key(GZIP_KEY) || binary.contains_key(RAW_KEY) => {
                return Err(PackError::ComponentAndReference { config_map });
            }
            Some(reference) => Some(registry_pull(&config_map, reference, data)?),
        };
        let component = match (binary.get(GZIP_KEY), binary.get(RAW_KEY)) {
            (Some(_), Some(_)) => return Err(PackError::TwoComponents { config_map }),
            (None, None) if pull.is_some() => Vec::new(),
            (None, None) => return Err(PackError::NoComponent { config_map }),
            (Some(ByteString(gz)), None) => gunzip(gz, &config_map)?,
            (None, Some(ByteString(raw))) => {
                if raw.len() > MAX_COMPONENT_BYTES {
                    return Err(PackError::TooLarge { config_map });
                }
                raw.clone()
            }
        };
        let mut sha256 = sha256_hex(&component);
        if let Some(pin) = data.get(SHA256_KEY) {
            let pin = pin.trim().to_ascii_lowercase();
            if pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(PackError::BadPin { config_map, pin });
            }
            if pull.is_some() {
                // Checked against the pulled bytes by `take_pulled`.
                sha256 = pin;
            } else if pin != sha256 {
                return Err(PackError::ChecksumMismatch {
                    config_map,
                    expected: pin,
                    actual: sha256,
                });
            }
        }
        let grants = match data
            .get(GRANTS_KEY)
            .map(|t| t.trim())
            .filter(|t| !t.is_empty())
        {
            None => GrantsSpec::default(),
            Some(text) => {
                serde_yaml::from_str::<GrantsSpec>(text).map_err(|e| PackError::Grants {
                    config_map: config_map.clone(),
                    message: e.to_string(),
                })?
            }
        };
        if let Some(why) = grants.secrets.iter().find_map(|g| g.check().err()) {
            return Err(PackError::Grants {
                config_map: config_map.clone(),
                message: why,
            });
        }
        let pod_security = crate::capability::scope::PodSecurity::parse(
            grants.pod_security.as_deref().unwrap_or_default(),
        )
        .map_err(|message| PackError::Grants {
            config_map: config_map.clone(),
            message,
        })?;
        let limits = match data.get(LIMITS_KEY).map(|t| t.trim()).filter(|t| !t.is_empty()) {
            None => LimitsSpec::default(),
            Some(text) => serde_yaml::from_str::<LimitsSpec>(text).map_err(|e| PackError::Limits {
                config_map: config_map.clone(),
                message: format!("{e}; write e.g. `{{deadlineMs: 5000, memoryMiB: 64, outputKiB: 4096, concurrency: 8}}`"),
            })?,
        };
        let (limits, concurrency) =
            limits
                .resolve(defaults)
                .map_err(|message| PackError::Limits {
                    config_map: config_map.clone(),
                    message,
                })?;
        let mode = match data.get(MODE_KEY).map(|m| m.trim()) {
            None | Some("") | Some("active") => Mode::Active,
            Some("shadow") => Mode::Shadow,
            Some("rollout") => Mode::Rollout,
            Some(other) => {
                return Err(PackError::Mode {
                    config_map,
                    mode: other.to_string(),
                });
            }
        };
        let rollout_text = data.get(ROLLOUT_KEY).map(|t| t.trim());
        let rollout = match (mode, rollout_text) {
            (Mode::Rollout, None | Some("")) => {
                return Err(PackError::Rollout {
                    config_map,
                    message: "mode `rollout` needs it: say which parents the new version decides for, e.g. `{selector: {matchLabels: {ring: canary}}, percent: 10, maxFailureRate: 0.2}`".to_string(),
                });
            }
            (Mode::Rollout, Some(text)) => {
                Some(
                    RolloutSpec::parse(text).map_err(|message| PackError::Rollout {
                        config_map: config_map.clone(),
                        message,
                    })?,
                )
            }
            (_, None) => None,
            (_, Some(_)) => {
                return Err(PackError::Rollout {
                    config_map,
                    message: format!(
                        "it applies only to `mode: rollout`, and the mode is `{}`; to promote a rollout, set data.mode to active and remove data.rollout in the same change",
                        mode.as_str()
                    ),
                });
            }
        };
        if pull.is_some() && data.get(SHA256_KEY).is_none() {
            sha256 = String::new();
        }
        Ok(Self {
            component,
            sha256,
            pull,
            grants: Grants {
                app_call_ports: grants.app_call,
                exchange_ports: grants.exchange,
                chaos: grants.chaos,
                kinds: grants.kinds,
                pod_security,
                images: grants.images,
                secrets: grants.secrets,
            },
            limits,
            concurrency,
            mode,
            rollout,
        })
    }
}

impl PluginPack {
    /// Takes the component pulled for this pack, checking it against the pack's pin.
    pub fn take_pulled(
        &mut self,
        config_map: &str,
        pulled: PulledComponent,
    ) -> Result<(), PackError> {
        if !self.sha256.is_empty() && self.sha256 != pulled.sha256 {
            return Err(PackError::ChecksumMismatch {
                config_map: config_map.to_owned(),
                expected: self.sha256.clone(),
                actual: pulled.sha256,
            });
        }
        self.component = pulled.bytes;
        self.sha256 = pulled.sha256;
        Ok(())
    }
}

/// The pull settings of a pack naming its component by `reference`.
fn registry_pull(
    config_map: &str,
    reference: &str,
    data: &BTreeMap<String, String>,
) -> Result<RegistryPull, PackError> {
    let reference = PluginReference::parse(reference).map_err(|source| PackError::Reference {
        config_map: config_map.to_owned(),
        source,
    })?;
    let text = |key: &str| {
        data.get(key)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let registry_ca = match text(REGISTRY_CA_KEY) {
        None => None,
        Some(value) => Some(match value.split_once('/') {
            Some(("secret", name)) if !name.is_empty() => CaSource::Secret(name.to_owned()),
            Some(("configmap", name)) if !name.is_empty() => CaSource::ConfigMap(name.to_owned()),
            _ => {
                return Err(PackError::RegistryCa {
                    config_map: config_map.to_owned(),
                    value,
                });
            }
        }),
    };
    Ok(RegistryPull {
        reference,
        pull_secret: text(PULL_SECRET_KEY),
        registry_ca,
    })
}

impl LimitsSpec {
    /// The sandbox limits and concurrency these settings give, or what is out of range.
    pub fn resolve(&self, defaults: &PackDefaults) -> Result<(Limits, u16), String> {
        let deadline = self
            .deadline_ms
            .map_or(defaults.limits.deadline, Duration::from_millis);
        if deadline.is_zero() || deadline > MAX_DEADLINE {
            return Err(format!(
                "deadlineMs {} is out of range; use 1..={}",
                deadline.as_millis(),
                MAX_DEADLINE.as_millis()
            ));
        }
        let memory_bytes = self.memory_mib.map_or(defaults.limits.memory_bytes, |mib| {
            mib.saturating_mul(1 << 20)
        });
        if !((1 << 20)..=MAX_PLUGIN_MEMORY).contains(&memory_bytes) {
            return Err(format!(
                "memoryMiB {} is out of range; use 1..={} (the sandbox's per-instance ceiling)",
                memory_bytes >> 20,
                MAX_PLUGIN_MEMORY >> 20
            ));
        }
        let output_bytes = self.output_kib.map_or(defaults.limits.output_bytes, |kib| {
            kib.saturating_mul(1 << 10)
        });
        if !((1 << 10)..=(64 << 20)).contains(&output_bytes) {
            return Err(format!(
                "outputKiB {} is out of range; use 1..=65536",
                output_bytes >> 10
            ));
        }
        let concurrency = self.concurrency.unwrap_or(defaults.concurrency);
        if concurrency == 0 || concurrency > MAX_CONCURRENCY {
            return Err(format!(
                "concurrency {concurrency} is out of range; use 1..={MAX_CONCURRENCY}"
            ));
        }
        Ok((
            Limits {
                deadline,
                memory_bytes,
                output_bytes,
            },
            concurrency,
        ))
    }
}

fn gunzip(gz: &[u8], config_map: &str) -> Result<Vec<u8>, PackError> {
    let mut out = Vec::new();
    let mut decoder = flate2::read::GzDecoder::new(gz).take(MAX_COMPONENT_BYTES as u64 + 1);
    decoder
        .read_to_end(&mut out)
        .map_err(|source| PackError::Gzip {
            config_map: config_map.to_string(),
            source,
        })?;
    if out.len() > MAX_COMPONENT_BYTES {
        return Err(PackError::TooLarge {
            config_map: config_map.to_string(),
        });
    }
    Ok(out)
}

/// What `policy-host pack` writes into a pack besides the component.
#[derive(Clone, Debug, Default)]
pub struct PackOptions {
    /// The ConfigMap's name.
    pub name: String,
    /// Its namespace (`None`: left to `kubectl apply -n`).
    pub namespace: Option<String>,
    /// What the admin grants.
    pub grants: Grants,
    /// Limits to write (absent fields keep the host's defaults).
    pub limits: LimitsSpec,
    /// Active, shadow or rollout.
    pub mode: Mode,
    /// With [`Mode::Rollout`]: which parents the candidate decides for.
    pub rollout: Option<RolloutSpec>,
}

/// Builds a pack ConfigMap: the component gzip-compressed, its sha256 pinned, the label set.
pub fn to_config_map(component: &[u8], options: &PackOptions) -> std::io::Result<ConfigMap> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut encoder, component)?;
    let gz = encoder.finish()?;
    let mut cm = settings_config_map(&sha256_hex(component), options);
    cm.binary_data = Some(BTreeMap::from([(GZIP_KEY.to_string(), ByteString(gz))]));
    Ok(cm)
}

/// Builds a pack ConfigMap that names its component in a registry: the reference by digest,
/// the component's sha256 pinned, and how to pull it.
pub fn to_reference_config_map(
    pull: &RegistryPull,
    component_sha256: &str,
    options: &PackOptions,
) -> ConfigMap {
    let mut cm = settings_config_map(component_sha256, options);
    let data = cm.data.get_or_insert_with(BTreeMap::new);
    data.insert(REFERENCE_KEY.to_string(), pull.reference.to_string());
    if let Some(secret) = &pull.pull_secret {
        data.insert(PULL_SECRET_KEY.to_string(), secret.clone());
    }
    if let Some(ca) = &pull.registry_ca {
        data.insert(REGISTRY_CA_KEY.to_string(), ca.to_string());
    }
    cm
}

/// A pack ConfigMap without its component: the pin, grants, limits, mode and label.
fn settings_config_map(component_sha256: &str, options: &PackOptions) -> ConfigMap {
    let mut data = BTreeMap::new();
    data.insert(SHA256_KEY.to_string(), component_sha256.to_owned());
    if !options.grants.is_empty() {
        let grants = GrantsSpec {
            app_call: options.grants.app_call_ports.clone(),
            exchange: options.grants.exchange_ports.clone(),
            chaos: options.grants.chaos,
            kinds: options.grants.kinds.clone(),
            pod_security: (options.grants.pod_security
                != crate::capability::scope::PodSecurity::Baseline)
                .then(|| options.grants.pod_security.name().to_owned()),
            images: options.grants.images.clone(),
            secrets: options.grants.secrets.clone(),
        };
        data.insert(GRANTS_KEY.to_string(), to_flow_yaml(&grants));
    }
    if options.limits != LimitsSpec::default() {
        data.insert(LIMITS_KEY.to_string(), to_flow_yaml(&options.limits));
    }
    data.insert(MODE_KEY.to_string(), options.mode.as_str().to_string());
    if let Some(rollout) = options.rollout.as_ref() {
        data.insert(ROLLOUT_KEY.to_string(), to_flow_yaml(rollout));
    }
    ConfigMap {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(options.name.clone()),
            namespace: options.namespace.clone(),
            labels: Some(BTreeMap::from([(
                PLUGIN_LABEL.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// One-line JSON (which is YAML) of a small settings record.
fn to_flow_yaml(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> PackDefaults {
        PackDefaults {
            limits: Limits::default(),
            concurrency: 8,
        }
    }

    const COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0 pretend component";

    fn packed() -> ConfigMap {
        let options = PackOptions {
            name: "probe".into(),
            namespace: Some("plugins".into()),
            grants: Grants {
                app_call_ports: vec!["client".into()],
                exchange_ports: Vec::new(),
                chaos: true,
                kinds: Some(vec!["configmaps.v1".into()]),
                pod_security: crate::capability::scope::PodSecurity::Privileged,
                images: Some(vec!["gcr.io/etcd-development/etcd".into()]),
                secrets: vec![SecretGrant {
                    name: "{parent}-credentials".into(),
                    generate: vec!["password".into()],
                }],
            },
            limits: LimitsSpec {
                deadline_ms: Some(2500),
                concurrency: Some(2),
                ..Default::default()
            },
            mode: Mode::Active,
            rollout: None,
        };
        to_config_map(COMPONENT, &options).expect("gzip into memory cannot fail")
    }

    fn with_data(mut cm: ConfigMap, key: &str, value: &str) -> ConfigMap {
        cm.data
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        cm
    }

    fn refusal(cm: &ConfigMap) -> PackError {
        match PluginPack::from_config_map(cm, &defaults()) {
            Ok(_) => panic!("expected a refusal"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_packed_component_round_trips_with_grants_and_limits() {
        let pack = PluginPack::from_config_map(&packed(), &defaults()).expect("valid pack");
        assert_eq!(pack.component, COMPONENT);
        assert_eq!(pack.sha256, sha256_hex(COMPONENT));
        assert_eq!(pack.grants.app_call_ports, vec!["client".to_string()]);
        assert!(pack.grants.chaos);
        assert_eq!(pack.grants.kinds, Some(vec!["configmaps.v1".to_string()]));
        assert_eq!(
            pack.grants.pod_security,
            crate::capability::scope::PodSecurity::Privileged
        );
        assert_eq!(pack.limits.deadline, Duration::from_millis(2500));
        assert_eq!(
            pack.limits.memory_bytes,
            Limits::default().memory_bytes,
            "default kept"
        );
        assert_eq!(pack.concurrency, 2);
        assert_eq!(pack.mode, Mode::Active);
    }

    #[test]
    fn a_raw_component_without_pin_or_grants_gets_defaults_and_no_grants() {
        let cm = ConfigMap {
            binary_data: Some(BTreeMap::from([(
                RAW_KEY.into(),
                ByteString(COMPONENT.to_vec()),
            )])),
            ..Default::default()
        };
        let pack = PluginPack::from_config_map(&cm, &defaults()).expect("valid pack");
        assert_eq!(pack.component, COMPONENT);
        assert!(
            pack.grants.app_call_ports.is_empty(),
            "ungranted plugins get no app-calls"
        );
        assert_eq!(pack.limits, Limits::default());
        assert_eq!(pack.concurrency, 8);
    }

    #[test]
    fn a_stale_pin_is_a_checksum_mismatch() {
        let cm = with_data(packed(), SHA256_KEY, &"ab".repeat(32));
        let error = refusal(&cm);
        assert!(
            matches!(error, PackError::ChecksumMismatch { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("checksum mismatch"), "{error}");
    }

    #[test]
    fn a_pin_that_is_not_hex_is_refused() {
        assert!(matches!(
            refusal(&with_data(packed(), SHA256_KEY, "abc")),
            PackError::BadPin { .. }
        ));
    }

    #[test]
    fn a_corrupt_gzip_stream_is_a_gzip_error() {
        let mut cm = packed();
        cm.binary_data = Some(BTreeMap::from([(
            GZIP_KEY.into(),
            ByteString(b"not gzip".to_vec()),
        )]));
        let error = refusal(&cm);
        assert!(matches!(error, PackError::Gzip { .. }), "{error}");
        assert_eq!(error.reason(), "PluginGzipInvalid");
    }

    #[test]
    fn no_component_and_two_components_are_refused() {
        let mut none = packed();
        none.binary_data = None;
        assert!(matches!(refusal(&none), PackError::NoComponent { .. }));
        let mut two = packed();
        two.binary_data
            .get_or_insert_with(BTreeMap::new)
            .insert(RAW_KEY.into(), ByteString(COMPONENT.to_vec()));
        assert!(matches!(refusal(&two), PackError::TwoComponents { .. }));
    }

    #[test]
    fn limits_out_of_range_or_misspelt_are_refused() {
        for limits in [
            "memoryMiB: 4096",
            "deadlineMs: 0",
            "concurrency: 1000",
            "outputKiB: 0",
            "deadlineMillis: 5",
        ] {
            let error = refusal(&with_data(packed(), LIMITS_KEY, limits));
            assert!(
                matches!(error, PackError::Limits { .. }),
                "{limits}: {error}"
            );
        }
    }

    #[test]
    fn grants_that_are_not_a_port_list_are_refused() {
        let error = refusal(&with_data(packed(), GRANTS_KEY, "appCall: {port: 1}"));
        assert!(matches!(error, PackError::Grants { .. }), "{error}");
    }

    const REFERENCE: &str = "oci://127.0.0.1:5000/plugins/probe@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn by_reference() -> ConfigMap {
        let pull = RegistryPull {
            reference: PluginReference::parse(REFERENCE).expect("a reference"),
            pull_secret: Some("registry-login".into()),
            registry_ca: Some(CaSource::ConfigMap("registry-ca".into())),
        };
        to_reference_config_map(
            &pull,
            &sha256_hex(COMPONENT),
            &PackOptions {
                name: "probe".into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_pack_by_reference_round_trips_and_takes_the_pulled_component() {
        let mut pack =
            PluginPack::from_config_map(&by_reference(), &defaults()).expect("valid pack");
        let pull = pack.pull.clone().expect("a pull");
        assert_eq!(pull.reference.to_string(), REFERENCE);
        assert_eq!(pull.pull_secret.as_deref(), Some("registry-login"));
        assert_eq!(
            pull.registry_ca,
            Some(CaSource::ConfigMap("registry-ca".into()))
        );
        assert!(pack.component.is_empty(), "nothing pulled yet");
        assert_eq!(pack.sha256, sha256_hex(COMPONENT), "the pin");
        let other = PulledComponent {
            bytes: b"other".to_vec(),
            sha256: sha256_hex(b"other"),
        };
        let refused = pack.clone().take_pulled("plugins/probe", other);
        assert!(
            matches!(refused, Err(PackError::ChecksumMismatch { .. })),
            "{refused:?}"
        );
        pack.take_pulled(
            "plugins/probe",
            PulledComponent {
                bytes: COMPONENT.to_vec(),
                sha256: sha256_hex(COMPONENT),
            },
        )
        .expect("the pinned component");
        assert_eq!(pack.component, COMPONENT);
    }

    #[test]
    fn a_pack_by_reference_is_refused_with_a_component_a_tag_or_a_bad_ca() {
        let mut both = by_reference();
        both.binary_data = packed().binary_data;
        assert!(matches!(
            refusal(&both),
            PackError::ComponentAndReference { .. }
        ));
        let tag = with_data(by_reference(), REFERENCE_KEY, "oci://r.example/p:latest");
        let error = refusal(&tag);
        assert_eq!(error.reason(), "PluginReferenceInvalid", "{error}");
        let ca = with_data(by_reference(), REGISTRY_CA_KEY, "registry-ca");
        assert!(matches!(refusal(&ca), PackError::RegistryCa { .. }));
    }

    #[test]
    fn a_rollout_needs_its_settings_and_only_a_rollout_has_them() {
        let rollout = with_data(
            with_data(packed(), MODE_KEY, "rollout"),
            ROLLOUT_KEY,
            "{selector: {matchLabels: {ring: canary}}, percent: 10}",
        );
        let pack = PluginPack::from_config_map(&rollout, &defaults()).expect("valid pack");
        assert_eq!(pack.mode, Mode::Rollout);
        assert_eq!(pack.rollout.map(|r| r.percent()), Some(10));
        for (situation, cm, fragment) in [
            (
                "no settings",
                with_data(packed(), MODE_KEY, "rollout"),
                "needs it",
            ),
            (
                "settings of an active pack",
                with_data(packed(), ROLLOUT_KEY, "{percent: 10}"),
                "remove data.rollout",
            ),
            (
                "a percentage past 100",
                with_data(
                    with_data(packed(), MODE_KEY, "rollout"),
                    ROLLOUT_KEY,
                    "{percent: 120}",
                ),
                "0..=100",
            ),
        ] {
            let error = refusal(&cm);
            assert_eq!(error.reason(), "PluginRolloutInvalid", "{situation}");
            assert!(error.to_string().contains(fragment), "{situation}: {error}");
        }
    }

    #[test]
    fn a_packed_rollout_round_trips() {
        let spec = crate::rollout::RolloutSpec::parse(
            "{selector: {matchLabels: {ring: canary}}, percent: 5, maxFailureRate: 0.5}",
        )
        .expect("valid");
        let cm = to_config_map(
            COMPONENT,
            &PackOptions {
                name: "probe-next".into(),
                mode: Mode::Rollout,
                rollout: Some(spec.clone()),
                ..Default::default()
            },
        )
        .expect("gzip into memory cannot fail");
        let pack = PluginPack::from_config_map(&cm, &defaults()).expect("valid pack");
        assert_eq!(pack.mode, Mode::Rollout);
        assert_eq!(pack.rollout, Some(spec));
    }

    #[test]
    fn mode_is_active_or_shadow() {
        let shadow = with_data(packed(), MODE_KEY, "shadow");
        let pack = PluginPack::from_config_map(&shadow, &defaults()).expect("valid pack");
        assert_eq!(pack.mode, Mode::Shadow);
        assert!(matches!(
            refusal(&with_data(packed(), MODE_KEY, "canary")),
            PackError::Mode { .. }
        ));
    }
}
