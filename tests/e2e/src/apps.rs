//! The apps' images the suites find on the node — those the in-tree plugins declare
//! (`tests/e2e/test-images.yaml` includes them; the test environment loads it) — and the
//! programs in them the suites run as clients (`etcdctl`, `redis-cli`), by app.

use std::path::PathBuf;
use std::process::Command;

use policy_host_testenv::TestEnv;
use policy_host_testenv::images::MadeImage;

/// The etcd images' repository (the etcd plugin's default).
pub const ETCD_REPOSITORY: &str = "gcr.io/etcd-development/etcd";

/// The etcd versions the node has images of (`v3.6.16`, ...), in the order the etcd plugin
/// declares them: the first is the one tests use unless they ask for another.
pub fn etcd_versions(env: &TestEnv) -> Vec<String> {
    etcd_versions_in(env.images())
}

/// [`etcd_versions`] among `images` (those a caller loaded with `TestEnv::provide_images`).
pub fn etcd_versions_in(images: &[MadeImage]) -> Vec<String> {
    images
        .iter()
        .filter(|image| image.repository() == ETCD_REPOSITORY)
        .map(|image| image.tag().to_owned())
        .collect()
}

/// The first of [`etcd_versions`].
pub fn default_etcd_version(env: &TestEnv) -> anyhow::Result<String> {
    etcd_versions(env).into_iter().next().ok_or_else(|| {
        anyhow::anyhow!(
            "the node has no etcd image: guest-etcd/test-images.yaml declares them, and tests/e2e/test-images.yaml must include it"
        )
    })
}

/// The directory holding `etcd`, `etcdctl` and `etcdutl` of the etcd image of `version`
/// (`v3.6.16` or `3.6.16`), if the node has it.
pub fn etcd_dir(env: &TestEnv, version: &str) -> Option<PathBuf> {
    etcd_dir_in(env.images(), version)
}

/// [`etcd_dir`] among `images`.
pub fn etcd_dir_in(images: &[MadeImage], version: &str) -> Option<PathBuf> {
    let name = format!("{ETCD_REPOSITORY}:v{}", version.trim_start_matches('v'));
    let image = images.iter().find(|image| image.name() == name)?;
    image.program("etcdctl")?.parent().map(PathBuf::from)
}

/// The Redis image the node has (`redis:<version>`).
pub fn redis_image(env: &TestEnv) -> anyhow::Result<&MadeImage> {
    redis_image_in(env.images())
}

/// [`redis_image`] among `images`.
pub fn redis_image_in(images: &[MadeImage]) -> anyhow::Result<&MadeImage> {
    images
        .iter()
        .find(|image| image.repository() == "redis")
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the node has no redis image: guest-redis/test-images.yaml declares it, and tests/e2e/test-images.yaml must include it"
            )
        })
}

/// `redis-cli` of the node's Redis image, ready to run here.
pub fn redis_cli(env: &TestEnv) -> anyhow::Result<Command> {
    Ok(redis_image(env)?.command("redis-cli")?)
}
