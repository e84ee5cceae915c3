//! The precompiled-artifact cache: compiled plugins on disk, so a host restart or a rollback to
//! a version it has seen skips Cranelift (hundreds of ms to seconds per plugin) and only maps
//! the artifact.
//!
//! An artifact is keyed by the sha256 of the component *and* by the engine's
//! [`precompile_compatibility_hash`](wasmtime::Engine::precompile_compatibility_hash) (wasmtime
//! version, compiler settings, target): a host upgrade or a configuration change misses the
//! cache instead of loading an incompatible artifact. The directory must be writable only by
//! the host (an `emptyDir` in the Pod): whoever can write it can run native code in the host.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// Whether a compile came from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// The artifact was on disk.
    Hit,
    /// The component was compiled (and the artifact written, if possible).
    Miss,
    /// No cache is configured: compiled in memory.
    Disabled,
}

/// A directory of precompiled components.
#[derive(Clone, Debug)]
pub struct ArtifactCache {
    dir: PathBuf,
}

impl ArtifactCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Where the artifact of the component with this sha256 lives for `engine`.
    pub fn artifact_path(&self, engine: &Engine, sha256: &str) -> PathBuf {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        self.dir
            .join(format!("{sha256}-{:016x}.cwasm", hasher.finish()))
    }

    /// The compiled component: from the cache if its artifact is there, else compiled (and
    /// cached). `sha256` must be the hash of `bytes`, checked by the caller.
    pub fn compile(
        &self,
        engine: &Engine,
        sha256: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let path = self.artifact_path(engine, sha256);
        if path.exists() {
            match deserialize_file(engine, &path) {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "unusable cached artifact; recompiling");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let artifact = engine.precompile_component(bytes)?;
        if let Err(error) = write_atomically(&self.dir, &path, &artifact) {
            tracing::warn!(dir = %self.dir.display(), %error, "cannot write the artifact cache; plugins load, but recompile after a restart");
        }
        Ok((deserialize(engine, &artifact)?, CacheOutcome::Miss))
    }
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    // A rename is atomic: a concurrent reader sees the whole artifact or none.
    std::fs::rename(&tmp, path)
}

// SOUNDNESS: wasmtime cannot check that a precompiled artifact is well-formed code, so
// deserializing is `unsafe`. These artifacts are ones this host produced with
// `Engine::precompile_component` (just now, or earlier into the cache directory, which only the
// host may write), from a component whose sha256 is in the file name, for an engine whose
// compatibility hash is in the file name; wasmtime itself also refuses artifacts from another
// version or configuration.
#[allow(unsafe_code)]
fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    unsafe { Component::deserialize_file(engine, path) }
}

// SOUNDNESS: as for `deserialize_file`: `bytes` was produced by `precompile_component` of this
// very engine a moment ago.
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    unsafe { Component::deserialize(engine, bytes) }
}
