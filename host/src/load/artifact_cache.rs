//! The precompiled-artifact cache: compiled plugins on disk, so a host restart or a rollback to
//! a version it has seen skips Cranelift (hundreds of ms to seconds per plugin) and only maps
//! the artifact.
//!
//! An artifact is keyed by the sha256 of the component *and* by the engine's
//! [`precompile_compatibility_hash`](wasmtime::Engine::precompile_compatibility_hash) (wasmtime
//! version, compiler settings, target): a host upgrade or a configuration change misses the
//! cache instead of loading an incompatible artifact. The directory must be writable only by
//! the host (an `emptyDir` in the Pod): whoever can write it can run native code in the host.
//!
//! The directory is bounded: every load of a new version (refused and shadow loads too) adds
//! an artifact, and an `emptyDir` past its `sizeLimit` gets the Pod evicted, to recompile
//! and be evicted again (review #19). After each write the least recently used artifacts go
//! until the total fits [`DEFAULT_MAX_BYTES`] (or [`ArtifactCache::with_max_bytes`]); a hit
//! counts as a use (its modification time is renewed).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

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

/// The most bytes of artifacts kept by default: below the 256 MiB `sizeLimit` of the
/// `emptyDir` in `deploy/deployment.yaml`, with room for one more being written.
pub const DEFAULT_MAX_BYTES: u64 = 160 << 20;

/// A directory of precompiled components, bounded in bytes.
#[derive(Clone, Debug)]
pub struct ArtifactCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl ArtifactCache {
    /// A cache in `dir` (created on first write), keeping at most [`DEFAULT_MAX_BYTES`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// The same cache keeping at most `max_bytes` of artifacts (the newest is always kept).
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
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
                Ok(component) => {
                    if let Err(error) = mark_used(&path) {
                        tracing::debug!(path = %path.display(), %error, "cannot renew a cached artifact's time; it may be evicted early");
                    }
                    return Ok((component, CacheOutcome::Hit));
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "unusable cached artifact; recompiling");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let artifact = engine.precompile_component(bytes)?;
        if let Err(error) = write_atomically(&self.dir, &path, &artifact) {
            tracing::warn!(dir = %self.dir.display(), %error, "cannot write the artifact cache; plugins load, but recompile after a restart");
        } else if let Err(error) = self.evict_beyond_limit(&path) {
            tracing::warn!(dir = %self.dir.display(), %error, "cannot evict old artifacts; the cache directory may grow");
        }
        Ok((deserialize(engine, &artifact)?, CacheOutcome::Miss))
    }
}

impl ArtifactCache {
    /// Removes the least recently used artifacts until the directory fits `max_bytes`, never
    /// `keep` (the artifact just written).
    fn evict_beyond_limit(&self, keep: &Path) -> std::io::Result<()> {
        let mut artifacts: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "cwasm") {
                continue;
            }
            let metadata = entry.metadata()?;
            let used = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            artifacts.push((used, metadata.len(), path));
        }
        let mut total: u64 = artifacts.iter().map(|(_, len, _)| len).sum();
        artifacts.sort();
        for (_, len, path) in artifacts {
            if total <= self.max_bytes {
                break;
            }
            if path == keep {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), bytes = len, "evicted the least recently used artifact");
                    total = total.saturating_sub(len);
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    total = total.saturating_sub(len);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

/// Renews an artifact's modification time: the eviction order's "last used".
fn mark_used(path: &Path) -> std::io::Result<()> {
    std::fs::File::options()
        .write(true)
        .open(path)?
        .set_modified(SystemTime::now())
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

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// A distinct, valid, empty component: the header and a custom section carrying `n`.
    fn component(n: usize) -> (String, Vec<u8>) {
        let name = b"policy-host-test";
        let payload = n.to_le_bytes();
        let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
        bytes.push(0);
        bytes.push((1 + name.len() + payload.len()) as u8);
        bytes.push(name.len() as u8);
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(&payload);
        let sha: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        (sha, bytes)
    }

    fn artifacts(dir: &Path) -> Vec<(PathBuf, u64)> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
                    .filter(|(p, _)| p.extension().is_some_and(|e| e == "cwasm"))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn forty_versions_keep_the_directory_within_its_limit_and_evict_the_least_recently_used()
    -> wasmtime::Result<()> {
        let engine = Engine::default();
        let dir = std::env::temp_dir().join(format!("policy-host-lru-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Room for five artifacts of this size.
        let (sha, bytes) = component(0);
        ArtifactCache::new(&dir).compile(&engine, &sha, &bytes)?;
        let one = artifacts(&dir).first().map_or(0, |(_, len)| *len);
        assert!(one > 0, "the first artifact was written");
        let cache = ArtifactCache::new(&dir).with_max_bytes(one * 5 + one / 2);

        for n in 1..40 {
            let (sha, bytes) = component(n);
            let (_, outcome) = cache.compile(&engine, &sha, &bytes)?;
            assert_eq!(outcome, CacheOutcome::Miss);
            // Version 1 stays in use: loaded again after every new version.
            let (sha, bytes) = component(1);
            cache.compile(&engine, &sha, &bytes)?;
        }

        let kept = artifacts(&dir);
        let total: u64 = kept.iter().map(|(_, len)| len).sum();
        assert!(
            total <= one * 5 + one / 2,
            "{} artifacts, {total} bytes, over the limit",
            kept.len()
        );
        let (sha, bytes) = component(1);
        assert_eq!(
            cache.compile(&engine, &sha, &bytes)?.1,
            CacheOutcome::Hit,
            "the version in use was evicted"
        );
        let (sha, bytes) = component(2);
        assert_eq!(
            cache.compile(&engine, &sha, &bytes)?.1,
            CacheOutcome::Miss,
            "an old unused version was kept"
        );
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
