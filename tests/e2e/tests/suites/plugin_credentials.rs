//! Credentials for a plugin's sessions, against the real API server: granted
//! `{parent}-auth` with a generated `token`, the host creates the Secret the first time the
//! plugin reads it (random, owned by the parent, opted in for the plugin's pods) and never
//! again; a Secret the grant does not name, and a same-named Secret the parent neither
//! controls nor opted in, are refused; a decision that puts the value into its status or an
//! Event is refused whole, and the refusal does not carry the value.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use policy_host::capability::credentials::SecretGrant;
use policy_host::capability::scope::Grants;
use policy_host::decide::Limits;
use policy_host::load::pack::{self, PackOptions};
use policy_host_e2e::{
    HostUnderTest, init_logging, install_crd_object, plugins, probe_crd, probes,
};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const MANAGER: &str = "plugin-credentials-e2e";

async fn apply_probe(api: &Api<DynamicObject>, name: &str, spec: Value) -> anyhow::Result<()> {
    let mut spec = spec;
    spec["behaviour"] = json!("credential");
    let object = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name }, "spec": spec
    });
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

/// `status.credential` of `probe` once it says something that `matches`.
async fn credential_status(
    api: &Api<DynamicObject>,
    probe: &str,
    matches: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    Ok(
        wait_for(&format!("status.credential of {probe}"), WAIT, || async {
            let object = api.get(probe).await.ok()?;
            let text = object.data["status"]["credential"].as_str()?.to_owned();
            matches(&text).then_some(text)
        })
        .await?,
    )
}

fn token(secret: &Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get("token")?;
    String::from_utf8(bytes.0.clone()).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_credential_is_generated_once_and_never_leaves_the_decision() -> anyhow::Result<()>
{
    init_logging();
    let component = std::fs::read(
        policy_host_test_plugins::build_version("1.0.0").map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("plugin-credentials").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());

    let outcome = async {
        let grants = Grants {
            secrets: vec![SecretGrant::parse("{parent}-auth:token").map_err(anyhow::Error::msg)?],
            ..Grants::default()
        };
        let cm = pack::to_config_map(
            &component,
            &PackOptions {
                name: "plugin-credentials".into(),
                grants: grants.clone(),
                ..Default::default()
            },
        )?;
        plugins::apply_pack(&config_maps, cm, MANAGER).await?;
        wait_for(
            "the host to run the plugin with the secret grant",
            WAIT,
            || async {
                host.running
                    .store
                    .list()
                    .iter()
                    .any(|loaded| loaded.grants == grants)
                    .then_some(())
            },
        )
        .await?;

        // Generated on the first read: random, owned by the parent, opted in for its pods.
        apply_probe(&api, "db", json!({})).await?;
        let said = credential_status(&api, "db", |t| !t.is_empty()).await?;
        anyhow::ensure!(said == "read 32 bytes", "the first read said `{said}`");
        let created = secrets.get("db-auth").await?;
        let value = token(&created).ok_or_else(|| anyhow::anyhow!("no token in db-auth"))?;
        anyhow::ensure!(
            value.len() == 32 && value.bytes().all(|b| b.is_ascii_alphanumeric()),
            "the generated value is not 32 letters and digits"
        );
        let parent_uid = api.get("db").await?.metadata.uid;
        let owner = created
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        anyhow::ensure!(
            owner == parent_uid,
            "db-auth is not controlled by its parent"
        );
        anyhow::ensure!(
            created
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("mountable-by.policy-host.io/misbehaving"))
                .map(String::as_str)
                == Some("true"),
            "db-auth is not opted in for the plugin's pods"
        );

        // Read again (a log line carrying it this time): the same Secret, unchanged.
        apply_probe(&api, "db", json!({ "leak": "log" })).await?;
        wait_for("the second decision on db", WAIT, || async {
            let object = api.get("db").await.ok()?;
            (object.data["status"]["logged"] == json!(true)).then_some(())
        })
        .await?;
        let again = secrets.get("db-auth").await?;
        anyhow::ensure!(
            again.metadata.resource_version == created.metadata.resource_version
                && token(&again).as_deref() == Some(value.as_str()),
            "a second read changed the generated Secret"
        );

        // A Secret the grant does not name is refused.
        apply_probe(&api, "stray", json!({ "secret": "db-auth" })).await?;
        let said = credential_status(&api, "stray", |t| !t.is_empty()).await?;
        anyhow::ensure!(
            said.starts_with("refused:") && said.contains("not granted"),
            "reading another parent's Secret said `{said}`"
        );

        // A same-named Secret that someone else made, not opted in: refused, not handed out.
        let foreign: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "victim-auth" },
            "stringData": { "token": "someone-elses-password" }
        }))?;
        secrets.create(&PostParams::default(), &foreign).await?;
        apply_probe(&api, "victim", json!({})).await?;
        let said = credential_status(&api, "victim", |t| !t.is_empty()).await?;
        anyhow::ensure!(
            said.starts_with("refused:") && said.contains("neither controlled"),
            "a Secret neither controlled nor opted in said `{said}`"
        );

        // A decision that carries the value is refused whole: no status, and the Event names
        // the key, not the value.
        for (probe, place) in [("leaks-status", "status"), ("leaks-event", "event")] {
            apply_probe(&api, probe, json!({ "leak": place })).await?;
            let event =
                plugins::event_about(&events, probe, "PluginLeaksCredential", |_| true).await?;
            let note = event.note.unwrap_or_default();
            let leaked = token(&secrets.get(&format!("{probe}-auth")).await?)
                .ok_or_else(|| anyhow::anyhow!("no token in {probe}-auth"))?;
            anyhow::ensure!(
                note.contains(&format!("{probe}-auth")) && note.contains("token"),
                "the refusal does not name the key: {note}"
            );
            anyhow::ensure!(!note.contains(&leaked), "the refusal carries the value");
            let status = &api.get(probe).await?.data["status"];
            anyhow::ensure!(
                status.get("credential").is_none(),
                "a decision that leaked was carried out: {status}"
            );
            let leaked_anywhere = events
                .list(&Default::default())
                .await?
                .items
                .iter()
                .any(|e| e.note.as_deref().unwrap_or_default().contains(&leaked));
            anyhow::ensure!(!leaked_anywhere, "an Event carries the value");
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    host.stop().await;
    outcome
}
