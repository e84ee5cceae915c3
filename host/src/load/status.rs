//! The status ConfigMap: what this host has loaded, active and shadow, published as
//! [`STATUS_CONFIG_MAP`] in the plugin namespace, so an admin sees it with `kubectl` (the same
//! entries as the admin endpoint's `/plugins`).
//!
//! One data key per plugin: its name for the active version, `<name>.shadow` for a shadow,
//! `<name>.rollout` for a staged rollout; each value is a small YAML document (version, mode,
//! sha256, target, source, since, grants, limits; for a rollout also its settings, whether it
//! runs or was rolled back and why, how many parents run each version, which run the new one,
//! and both versions' recent figures). The host owns the object through server-side apply, so
//! a key disappears when its plugin is unloaded.
//!
//! A rollout's figures change with every decision: while one is loaded, the ConfigMap is
//! brought up to date every [`ROLLOUT_REFRESH`] at most, never once per decision.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use crate::policy_store::PolicyStore;

/// The status ConfigMap's name.
pub const STATUS_CONFIG_MAP: &str = "policy-host-status";

/// How often the status follows a running rollout's figures.
pub const ROLLOUT_REFRESH: Duration = Duration::from_secs(5);

/// The ConfigMap that describes what `store` holds now.
pub fn status_config_map(store: &PolicyStore) -> ConfigMap {
    let mut data = BTreeMap::new();
    let active = store.list().into_iter().map(|p| (p, "active", ""));
    let shadows = store
        .list_shadows()
        .into_iter()
        .map(|p| (p, "shadow", ".shadow"));
    for (policy, mode, suffix) in active.chain(shadows) {
        let summary = policy.summary(mode);
        let text = serde_yaml::to_string(&summary).unwrap_or_else(|e| format!("error: {e}\n"));
        data.insert(format!("{}{suffix}", policy.name()), text);
    }
    for rollout in store.list_rollouts() {
        let active = store.active_for(&rollout.policy.plugin.info().target);
        let summary = rollout.summary(active.as_deref());
        let text = serde_yaml::to_string(&summary).unwrap_or_else(|e| format!("error: {e}\n"));
        data.insert(format!("{}.rollout", rollout.policy.name()), text);
    }
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(STATUS_CONFIG_MAP.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "policy-host".to_string(),
            )])),
            annotations: Some(BTreeMap::from([(
                "policy-host.io/description".to_string(),
                "plugins this host has loaded; written by policy-host, do not edit".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// Keeps the status ConfigMap in `namespace` in step with `store` until `shutdown` resolves.
pub async fn publish(
    client: Client,
    namespace: String,
    store: PolicyStore,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let mut policies = store.subscribe();
    let mut shadows = store.subscribe_shadows();
    let mut rollouts = store.subscribe_rollouts();
    tokio::pin!(shutdown);
    let mut written: Option<BTreeMap<String, String>> = None;
    loop {
        let wanted = status_config_map(&store);
        if written.as_ref() != wanted.data.as_ref() {
            let params = PatchParams::apply("policy-host").force();
            match api
                .patch(STATUS_CONFIG_MAP, &params, &Patch::Apply(&wanted))
                .await
            {
                Ok(_) => written = wanted.data,
                Err(error) => tracing::warn!(
                    namespace = %namespace,
                    config_map = STATUS_CONFIG_MAP,
                    error = %crate::api_error::api_error_text(&error),
                    "cannot publish the loaded plugins; /plugins on the admin endpoint still lists them (the host needs create and patch on ConfigMaps in its namespace)"
                ),
            }
        }
        let refresh = async {
            if store.list_rollouts().is_empty() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(ROLLOUT_REFRESH).await;
        };
        tokio::select! {
            changed = policies.changed() => if changed.is_err() { break },
            changed = shadows.changed() => if changed.is_err() { break },
            changed = rollouts.changed() => if changed.is_err() { break },
            () = refresh => {}
            () = &mut shutdown => break,
        }
    }
}
