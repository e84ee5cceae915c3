//! Load: turns plugin bytes into a policy the [`PolicyStore`](crate::policy_store::PolicyStore)
//! can hold — the fourth concern beside observe, decide and act.
//!
//! Every source goes through the same steps, and a plugin is swapped in only after all passed:
//!
//! 1. decode the pack ([`pack`]: gzip, sha256 pin, grants, limits, mode) — ConfigMaps only;
//! 2. check the bytes are a component, not a core module or something else;
//! 3. compile, through the [`artifact_cache`] when one is configured; a component that needs
//!    component-model async is refused by name, with the build flags that make a synchronous one;
//! 4. check the component speaks a contract version this host serves (a plugin built against a
//!    newer `policy-host:policy` is refused by name, not by a linker error) and imports no WASI
//!    0.3 interface;
//! 5. pre-instantiate against the host's imports (a wrong world fails here) and read
//!    `describe()`.
//!
//! [`config_maps`] watches labelled ConfigMaps and feeds the store; files given with
//! `--policy` use [`load_file`]. [`status`] publishes what is loaded back into a ConfigMap.

pub mod artifact_cache;
pub mod bundle;
pub mod config_maps;
pub mod oci;
pub mod pack;
pub mod status;
pub mod trust;

use std::path::Path;
use std::time::SystemTime;

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::capability::scope::Grants;
use crate::contract::{CONTRACT_VERSION, PREVIOUS_CONTRACT_VERSIONS};
use crate::decide::{DecideError, Limits, Plugin, Sandbox};
use crate::policy_store::LoadedPolicy;
use artifact_cache::{ArtifactCache, CacheOutcome};
use pack::PackError;

/// The WIT package every plugin import and export of the contract is named in.
pub const CONTRACT_PACKAGE: &str = "policy-host:policy";

/// Why a plugin was not loaded. Each says what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read plugin file {path}: {source}; check the path")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The ConfigMap is not a usable pack.
    #[error(transparent)]
    Pack(#[from] PackError),
    /// The bytes are not WebAssembly at all.
    #[error(
        "plugin {source_name} is not a component: it does not start with the WebAssembly magic bytes `\\0asm`; build the plugin for wasm32-wasip2 and load the .wasm file"
    )]
    NotWasm {
        /// Where the bytes came from.
        source_name: String,
    },
    /// The bytes are a core module, not a component.
    #[error(
        "plugin {source_name} is not a component: it is a core WebAssembly module; build it for wasm32-wasip2 (cargo build --target wasm32-wasip2) or wrap it with `wasm-tools component new`"
    )]
    CoreModule {
        /// Where the bytes came from.
        source_name: String,
    },
    /// The component does not compile.
    #[error(
        "plugin {source_name} is not a valid component: {message}; rebuild it with a current toolchain"
    )]
    Compile {
        /// Where the bytes came from.
        source_name: String,
        /// What wasmtime said.
        message: String,
    },
    /// The component needs component-model async (an `async` function, a `stream` or `future`,
    /// a WASI 0.3 world), which this host does not run.
    #[error(
        "plugin {source_name} needs component-model async, which this host does not run ({what}): plugins are synchronous components of WASI 0.2. {SYNCHRONOUS_BUILD}"
    )]
    NeedsAsync {
        /// Where the bytes came from.
        source_name: String,
        /// What in the component needs it.
        what: String,
    },
    /// The component is not of world `policy-plugin`.
    #[error(
        "plugin {source_name} is a component of the wrong world: {message}; it must implement world `policy-plugin` of wit/policy.wit ({CONTRACT_PACKAGE}@{CONTRACT_VERSION})"
    )]
    WrongWorld {
        /// Where the bytes came from.
        source_name: String,
        /// What is missing or mismatched.
        message: String,
    },
    /// The component was built against a newer contract than this host serves.
    #[error(
        "plugin {source_name} was built against {CONTRACT_PACKAGE}@{found}, newer than the {CONTRACT_VERSION} this host serves (too-new contract); upgrade policy-host or rebuild the plugin against {CONTRACT_VERSION}"
    )]
    TooNewContract {
        /// The version the plugin names.
        found: String,
        /// Where the bytes came from.
        source_name: String,
    },
    /// The component was built against an older, incompatible contract.
    #[error(
        "plugin {source_name} was built against {CONTRACT_PACKAGE}@{found}, which this host (serving {CONTRACT_VERSION}, and {previous:?} for older plugins) does not support; rebuild the plugin against {CONTRACT_VERSION}",
        previous = PREVIOUS_CONTRACT_VERSIONS
    )]
    UnsupportedContract {
        /// The version the plugin names.
        found: String,
        /// Where the bytes came from.
        source_name: String,
    },
    /// The plugin's `describe()` failed (trap, deadline, ...).
    #[error(transparent)]
    Describe(DecideError),
    /// The plugin described itself with a name the host cannot use.
    #[error(
        "plugin {source_name} calls itself `{name}`; a plugin name must be 1-63 characters of a-z, 0-9 and `-`, starting and ending with a letter or digit (it becomes a label value and a finalizer)"
    )]
    BadName {
        /// Where the bytes came from.
        source_name: String,
        /// The name it gave.
        name: String,
    },
}

impl LoadError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            LoadError::Read { .. } => "PluginUnreadable",
            LoadError::Pack(e) => e.reason(),
            LoadError::NotWasm { .. } | LoadError::CoreModule { .. } => "PluginNotAComponent",
            LoadError::Compile { .. } => "PluginInvalid",
            LoadError::NeedsAsync { .. } => "PluginNeedsAsync",
            LoadError::WrongWorld { .. } => "PluginWrongWorld",
            LoadError::TooNewContract { .. } => "PluginContractTooNew",
            LoadError::UnsupportedContract { .. } => "PluginContractUnsupported",
            LoadError::Describe(_) => "PluginDescribeFailed",
            LoadError::BadName { .. } => "PluginNameInvalid",
        }
    }
}

/// How to build a synchronous component, for the refusal of an async one. WASI 0.3 and
/// component-model async came with wasmtime 46 and Rust's `wasm32-wasip3` target; a toolchain
/// whose default moved there builds what this host refuses.
pub const SYNCHRONOUS_BUILD: &str = "Build it for `--target wasm32-wasip2` (not wasm32-wasip3), without wit-bindgen's `async` option, against wit/policy.wit; other toolchains: target WASI 0.2 (`wasi:cli@0.2`) with component-model async off";

/// Why wasmtime's compile error means the component needs component-model async, if it does:
/// its validator names the feature in the message (`async component functions require the
/// component model async feature`, `` `stream` requires ... ``).
fn needs_async(message: &str) -> bool {
    message.contains("component model async")
}

/// The first WASI 0.3 import of a compiled component, if any: the world of an async toolchain,
/// which this host's WASI 0.2 linker cannot satisfy.
fn wasi_0_3_import(engine: &Engine, component: &Component) -> Option<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .find(|name| {
            name.starts_with("wasi:")
                && name
                    .split_once('@')
                    .is_some_and(|(_, version)| version.starts_with("0.3"))
        })
}

/// Compiles, checks and describes plugins. Cheap to clone.
#[derive(Clone)]
pub struct PluginLoader {
    sandbox: Sandbox,
    cache: Option<ArtifactCache>,
}

impl PluginLoader {
    /// A loader for `sandbox`, caching compiled artifacts in `cache` if given.
    pub fn new(sandbox: Sandbox, cache: Option<ArtifactCache>) -> Self {
        Self { sandbox, cache }
    }

    /// The sandbox plugins run in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Checks, compiles and describes the component `bytes` (whose sha256 is `sha256`).
    pub async fn load(
        &self,
        source_name: &str,
        bytes: &[u8],
        sha256: &str,
        limits: Limits,
    ) -> Result<(Plugin, CacheOutcome), LoadError> {
        check_header(source_name, bytes)?;
        let engine = self.sandbox.engine().clone();
        let cache = self.cache.clone();
        let (owned, sha) = (bytes.to_vec(), sha256.to_string());
        // Cranelift is CPU-bound for up to seconds: keep it off the async workers.
        let compiled = tokio::task::spawn_blocking(move || match cache {
            Some(cache) => cache.compile(&engine, &sha, &owned),
            None => Component::from_binary(&engine, &owned).map(|c| (c, CacheOutcome::Disabled)),
        })
        .await;
        let (component, outcome) = match compiled {
            Ok(Ok(compiled)) => compiled,
            Ok(Err(error)) => {
                let message = format!("{error:#}");
                if needs_async(&message) {
                    return Err(LoadError::NeedsAsync {
                        source_name: source_name.to_string(),
                        what: message,
                    });
                }
                return Err(LoadError::Compile {
                    source_name: source_name.to_string(),
                    message,
                });
            }
            Err(join) => {
                return Err(LoadError::Compile {
                    source_name: source_name.to_string(),
                    message: format!("the compiler task failed: {join}"),
                });
            }
        };
        if let Some(import) = wasi_0_3_import(self.sandbox.engine(), &component) {
            return Err(LoadError::NeedsAsync {
                source_name: source_name.to_string(),
                what: format!("it imports `{import}`, a WASI 0.3 interface"),
            });
        }
        check_contract(source_name, self.sandbox.engine(), &component)?;
        let plugin = self
            .sandbox
            .load_component(source_name, &component, sha256.to_string(), limits)
            .await
            .map_err(|error| match error {
                DecideError::Load { message, .. } => LoadError::WrongWorld {
                    source_name: source_name.to_string(),
                    message,
                },
                other => LoadError::Describe(other),
            })?;
        let name = &plugin.info().name;
        if !is_valid_plugin_name(name) {
            return Err(LoadError::BadName {
                source_name: source_name.to_string(),
                name: name.clone(),
            });
        }
        Ok((plugin, outcome))
    }
}

/// Whether a plugin's name can be a label value and the finalizer `policy-host.io/<name>`:
/// a DNS-1123 label, so it also starts and ends with a letter or digit (a label value must).
fn is_valid_plugin_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Loads a plugin from a file, granting what it asks for (the admin chose the file).
pub async fn load_file(
    loader: &PluginLoader,
    path: &Path,
    limits: Limits,
) -> Result<LoadedPolicy, LoadError> {
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
    let source = format!("file {}", path.display());
    let sha256 = pack::sha256_hex(&bytes);
    let (plugin, _) = loader.load(&source, &bytes, &sha256, limits).await?;
    Ok(LoadedPolicy {
        grants: Grants::as_requested(&plugin.info().capabilities),
        plugin,
        source,
        loaded_at: SystemTime::now(),
        concurrency: None,
    })
}

/// Refuses what is not even a component before the compiler sees it, so the error can say so.
fn check_header(source_name: &str, bytes: &[u8]) -> Result<(), LoadError> {
    const MAGIC: &[u8] = b"\0asm";
    // Bytes 4..8 are version + layer: 1,0,0,0 for a core module; layer 1 for a component.
    match bytes.get(..8) {
        Some(header) if header.starts_with(MAGIC) => {
            if header[6..8] == [0x01, 0x00] {
                Ok(())
            } else {
                Err(LoadError::CoreModule {
                    source_name: source_name.to_string(),
                })
            }
        }
        _ => Err(LoadError::NotWasm {
            source_name: source_name.to_string(),
        }),
    }
}

/// A semver version as numbers (pre-release and build suffixes ignored).
fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let core = text.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// Whether a plugin built against contract `found` runs on this host (see the WIT package
/// docs: `0.1.x` loads on a host serving `0.1.y` with y >= x; from 1.0, same major).
fn contract_compatibility(found: (u64, u64, u64), served: (u64, u64, u64)) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let same_line = if served.0 == 0 {
        found.0 == 0 && found.1 == served.1
    } else {
        found.0 == served.0
    };
    if same_line {
        if found <= served {
            Ordering::Equal
        } else {
            Ordering::Greater
        }
    } else if found > served {
        Ordering::Greater
    } else {
        Ordering::Less
    }
}

/// Checks the component's contract imports and exports name a version this host serves, and
/// that it exports the `policy` interface at all.
fn check_contract(
    source_name: &str,
    engine: &Engine,
    component: &Component,
) -> Result<(), LoadError> {
    let served = parse_version(CONTRACT_VERSION).unwrap_or((0, 2, 0));
    // The previous minors the host still serves, through bindings of their frozen WIT.
    let previous: Vec<(u64, u64, u64)> = PREVIOUS_CONTRACT_VERSIONS
        .iter()
        .filter_map(|v| parse_version(v))
        .collect();
    let ty = component.component_type();
    let imports = ty.imports(engine).map(|(name, _)| name.to_string());
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let prefix = format!("{CONTRACT_PACKAGE}/");
    let mut exports_policy = false;
    for name in imports.chain(exports.iter().cloned()) {
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let (interface, version) = rest.split_once('@').unwrap_or((rest, ""));
        if interface == "policy" && exports.contains(&name) {
            exports_policy = true;
        }
        let Some(found) = parse_version(version) else {
            return Err(LoadError::UnsupportedContract {
                found: if version.is_empty() {
                    "(unversioned)".into()
                } else {
                    version.into()
                },
                source_name: source_name.to_string(),
            });
        };
        let compatible_with_previous = previous
            .iter()
            .any(|&p| contract_compatibility(found, p) == std::cmp::Ordering::Equal);
        match contract_compatibility(found, served) {
            std::cmp::Ordering::Equal => {}
            std::cmp::Ordering::Less if compatible_with_previous => {}
            std::cmp::Ordering::Greater => {
                return Err(LoadError::TooNewContract {
                    found: version.to_string(),
                    source_name: source_name.to_string(),
                });
            }
            std::cmp::Ordering::Less => {
                return Err(LoadError::UnsupportedContract {
                    found: version.to_string(),
                    source_name: source_name.to_string(),
                });
            }
        }
    }
    if !exports_policy {
        let exported = if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        };
        return Err(LoadError::WrongWorld {
            source_name: source_name.to_string(),
            message: format!(
                "it exports {exported}, not `{CONTRACT_PACKAGE}/policy@{CONTRACT_VERSION}`"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;

    #[test]
    fn contract_versions_follow_the_wit_semver_rule() {
        let served = (0, 1, 2);
        for (found, expected) in [
            ((0, 1, 0), Ordering::Equal),
            ((0, 1, 2), Ordering::Equal),
            ((0, 1, 3), Ordering::Greater),
            ((0, 2, 0), Ordering::Greater),
            ((1, 0, 0), Ordering::Greater),
            ((0, 0, 9), Ordering::Less),
        ] {
            assert_eq!(contract_compatibility(found, served), expected, "{found:?}");
        }
        assert_eq!(
            contract_compatibility((1, 4, 0), (1, 5, 0)),
            Ordering::Equal
        );
        assert_eq!(contract_compatibility((0, 9, 0), (1, 0, 0)), Ordering::Less);
    }

    #[test]
    fn versions_parse_with_or_without_suffixes() {
        assert_eq!(parse_version("0.1.0"), Some((0, 1, 0)));
        assert_eq!(parse_version("1.2.3-rc.1"), Some((1, 2, 3)));
        assert_eq!(parse_version("1.2"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn plugin_names_must_be_dns_labels_so_they_make_valid_labels_and_finalizers() {
        for (name, valid) in [
            ("etcd", true),
            ("my-plugin-2", true),
            ("a", true),
            ("-etcd", false),
            ("etcd-", false),
            ("-", false),
            ("", false),
            ("Etcd", false),
            ("etcd.io", false),
            ("etcd_v2", false),
        ] {
            assert_eq!(is_valid_plugin_name(name), valid, "{name:?}");
        }
        assert!(is_valid_plugin_name(&"a".repeat(63)));
        assert!(!is_valid_plugin_name(&"a".repeat(64)));
    }

    /// Hand-made components of the two shapes an async toolchain builds (no such toolchain is
    /// installed here): one that imports an `async` function, one that imports a WASI 0.3
    /// interface.
    mod async_components {
        use wasm_encoder::{
            Component, ComponentImportSection, ComponentTypeRef, ComponentTypeSection, InstanceType,
        };

        /// `(component (import "run" (func async)))`.
        pub fn importing_an_async_function() -> Vec<u8> {
            let mut types = ComponentTypeSection::new();
            types
                .function()
                .async_(true)
                .params::<_, wasm_encoder::ComponentValType>([])
                .result(None);
            let mut imports = ComponentImportSection::new();
            imports.import("run", ComponentTypeRef::Func(0));
            let mut component = Component::new();
            component.section(&types).section(&imports);
            component.finish()
        }

        /// `(component (import "wasi:cli/environment@0.3.0" (instance)))`.
        pub fn importing_wasi_0_3() -> Vec<u8> {
            let mut types = ComponentTypeSection::new();
            types.instance(&InstanceType::new());
            let mut imports = ComponentImportSection::new();
            imports.import("wasi:cli/environment@0.3.0", ComponentTypeRef::Instance(0));
            let mut component = Component::new();
            component.section(&types).section(&imports);
            component.finish()
        }
    }

    #[tokio::test]
    async fn a_component_that_needs_async_is_refused_with_the_flags_of_a_synchronous_build() {
        let loader = PluginLoader::new(Sandbox::new().expect("sandbox"), None);
        // (situation, component, what the refusal names)
        let rows = [
            (
                "an async function",
                async_components::importing_an_async_function(),
                "async component functions",
            ),
            (
                "a WASI 0.3 world",
                async_components::importing_wasi_0_3(),
                "wasi:cli/environment@0.3.0",
            ),
        ];
        for (situation, bytes, names) in rows {
            let sha = pack::sha256_hex(&bytes);
            let refused = loader
                .load("async.wasm", &bytes, &sha, Limits::default())
                .await
                .err()
                .unwrap_or_else(|| panic!("{situation}: loaded"));
            assert!(
                matches!(refused, LoadError::NeedsAsync { .. }),
                "{situation}: {refused}"
            );
            assert_eq!(refused.reason(), "PluginNeedsAsync", "{situation}");
            let message = refused.to_string();
            for fragment in [
                names,
                "component-model async",
                "--target wasm32-wasip2",
                "`async` option",
            ] {
                assert!(message.contains(fragment), "{situation}: {message}");
            }
        }
    }

    #[test]
    fn headers_tell_a_component_from_a_core_module_and_from_junk() {
        assert!(check_header("t", b"\0asm\x0d\0\x01\0").is_ok());
        assert!(matches!(
            check_header("t", b"\0asm\x01\0\0\0"),
            Err(LoadError::CoreModule { .. })
        ));
        assert!(matches!(
            check_header("t", b"PK\x03\x04zipfile"),
            Err(LoadError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header("t", b""),
            Err(LoadError::NotWasm { .. })
        ));
    }
}
