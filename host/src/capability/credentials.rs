//! The third door out of the sandbox: credentials for a plugin's sessions with its app, values
//! of Secrets the admin granted, read in the parent's namespace (and generated there, once,
//! when the grant says so), and remembered for the rest of the decision so that none of them
//! leaves it in a decision, a log line or a recording.
//!
//! What bounds it:
//! - **which Secret**: only a name the admin's grant names (`grants.secrets`, signed with the
//!   pack), exactly or by a pattern with `{parent}` (`{parent}-credentials`), in the parent's
//!   namespace; nothing is read for any other name. A Secret that already exists is handed
//!   out only if the parent controls it or it carries the opt-in label
//!   `mountable-by.policy-host.io/<plugin>: "true"` (the same opt-in as for mounting it): a
//!   parent named to make a pattern hit someone else's Secret gets nothing.
//! - **who writes it**: with `generate: [key, ...]` in the grant and the Secret absent, the
//!   host creates it with random values (32 letters and digits from the system's CSPRNG),
//!   owned by the parent and opted in for the plugin's pods, with a `create` that fails if
//!   it exists: two decisions racing create it once. The plugin never draws random bytes, so
//!   the decision stays a function of what it observed and was answered. A run that must not
//!   write (shadow mode) or has no API (`simulate`) never creates.
//! - **where it never goes**: [`find_leak`] refuses a decision whose actions carry a value it
//!   was handed (verbatim or base64-encoded), [`redact`] cuts values out of its log lines, and
//!   a recording whose bytes carry one is marked incomplete (never replayed).
//!
//! RBAC: `get` and `create` on Secrets through the per-namespace `policy-host-secrets`
//! binding, never list or watch (`deploy/rbac.yaml`).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::PostParams;

use super::Doors;
use crate::contract::Action;
use crate::contract::credentials::{self as wit, CredentialError};

/// Letters in a generated value: 32 of 62 symbols, about 190 bits.
pub const GENERATED_LENGTH: usize = 32;

/// Values shorter than this are not searched for in decisions and logs: a two-letter password
/// would be found everywhere by chance. The grant's generated values are always longer.
pub const MIN_SEARCHED_LENGTH: usize = 8;

/// A Secret the admin lets a plugin read, as written in `grants.secrets`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretGrant {
    /// The Secret's name, or a pattern with `{parent}` for the parent's name.
    pub name: String,
    /// Keys the host fills with random values when it creates the Secret (absent: the host
    /// never creates it, a user does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generate: Vec<String>,
}

impl SecretGrant {
    /// Reads `name` or `name:key,key` (the `pack --grant-secret` form).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, keys) = match text.split_once(':') {
            Some((name, keys)) => (name, keys),
            None => (text, ""),
        };
        let generate: Vec<String> = keys
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect();
        let grant = Self {
            name: name.trim().to_owned(),
            generate,
        };
        grant.check()?;
        Ok(grant)
    }

    /// Says what is wrong with a grant as written.
    pub fn check(&self) -> Result<(), String> {
        let probe = self.name.replace("{parent}", "x");
        if !is_secret_name(&probe) {
            return Err(format!(
                "secret grant `{}` is not a Secret name (lower-case letters, digits, `-` and `.`, with `{{parent}}` for the parent's name)",
                self.name
            ));
        }
        if let Some(key) = self.generate.iter().find(|k| !is_secret_key(k)) {
            return Err(format!(
                "secret grant `{}`: `{key}` is not a Secret key (letters, digits, `-`, `_`, `.`)",
                self.name
            ));
        }
        Ok(())
    }

    /// The Secret name this grant stands for under the parent `parent`.
    fn resolve(&self, parent: &str) -> String {
        self.name.replace("{parent}", parent)
    }

    /// How it reads in logs, Events and `policy-host-status`.
    pub fn describe(&self) -> String {
        if self.generate.is_empty() {
            format!("secret({})", self.name)
        } else {
            format!(
                "secret({}, generates {})",
                self.name,
                self.generate.join(", ")
            )
        }
    }
}

/// A DNS subdomain, as Kubernetes names Secrets.
fn is_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A key of a Secret's data.
fn is_secret_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The parent a run reads credentials for.
#[derive(Clone, Debug)]
pub struct CredentialParent {
    /// Its namespace: the only one Secrets are read in.
    pub namespace: String,
    /// Its name, for `{parent}`.
    pub name: String,
    /// What a generated Secret's owner reference names.
    pub api_version: String,
    /// Its kind.
    pub kind: String,
    /// Its uid.
    pub uid: String,
}

/// Credential values by `(secret, key)`.
pub type CredentialValues = HashMap<(String, String), Vec<u8>>;

/// Secrets read through the API server for one parent.
#[derive(Clone)]
pub struct LiveCredentials {
    /// The host's client.
    pub client: kube::Client,
    /// The parent.
    pub parent: CredentialParent,
    /// The label key that opts a Secret in for this plugin
    /// (`mountable-by.policy-host.io/<plugin>`, given by the caller: the capabilities import
    /// nothing of the host but the contract).
    pub opt_in_label: String,
    /// False in runs that must not write (shadow mode).
    pub may_create: bool,
}

/// Where a run's credentials come from.
#[derive(Clone, Default)]
pub enum CredentialSource {
    /// Nowhere: every read is refused (while describing, in benchmarks).
    #[default]
    None,
    /// The API server, reading (and, if `may_create`, generating) Secrets of the parent's
    /// namespace.
    Live(Box<LiveCredentials>),
    /// Values given by hand (`simulate`'s `credentials:` rows) or handed to the active plugin
    /// in the run a shadow replays, by `(secret, key)`. As with scripted app-calls, the script
    /// is the whole world: it answers what it holds, and grants are not checked again.
    Scripted(Arc<CredentialValues>),
}

impl std::fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        match self {
            CredentialSource::None => f.write_str("None"),
            CredentialSource::Live(live) => {
                write!(f, "Live({}/{})", live.parent.namespace, live.parent.name)
            }
            CredentialSource::Scripted(values) => write!(f, "Scripted({} values)", values.len()),
        }
    }
}

/// A value handed out to the plugin in this decision.
#[derive(Clone)]
pub struct HandedOut {
    /// The Secret.
    pub secret: String,
    /// Its key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
}

impl std::fmt::Debug for HandedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HandedOut({}/{})", self.secret, self.key)
    }
}

impl HandedOut {
    /// The forms a value is searched for in: as it is, and base64 (a Secret's `data`).
    fn forms(&self) -> Vec<Vec<u8>> {
        if self.value.len() < MIN_SEARCHED_LENGTH {
            return Vec::new();
        }
        vec![
            self.value.clone(),
            base64::engine::general_purpose::STANDARD
                .encode(&self.value)
                .into_bytes(),
        ]
    }

    /// True when `bytes` carries this value.
    pub fn is_in(&self, bytes: &[u8]) -> bool {
        self.forms()
            .iter()
            .any(|form| bytes.windows(form.len()).any(|w| w == form.as_slice()))
    }
}

/// Where a decision would have carried a credential out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leak {
    /// The Secret.
    pub secret: String,
    /// Its key.
    pub key: String,
    /// Which action: `action 2 (set-status)`.
    pub place: String,
}

/// The first action of `actions` that carries a value of `handed` (verbatim or base64).
pub fn find_leak(actions: &[Action], handed: &[HandedOut]) -> Option<Leak> {
    if handed.is_empty() {
        return None;
    }
    actions.iter().enumerate().find_map(|(index, action)| {
        let (what, text) = match action {
            Action::Apply(json) => ("apply", json.clone()),
            Action::SetStatus(json) => ("set-status", json.clone()),
            Action::RecordEvent(event) => (
                "record-event",
                format!("{} {}", event.reason, event.message),
            ),
            Action::Delete(target) => ("delete", target.name.clone()),
        };
        handed
            .iter()
            .find(|h| h.is_in(text.as_bytes()))
            .map(|h| Leak {
                secret: h.secret.clone(),
                key: h.key.clone(),
                place: format!("action {} ({what})", index + 1),
            })
    })
}

/// `text` with every value of `handed` replaced by `<credential secret/key>`.
pub fn redact(text: String, handed: &[HandedOut]) -> String {
    let mut text = text;
    for h in handed {
        for form in h.forms() {
            if let Ok(form) = std::str::from_utf8(&form)
                && text.contains(form)
            {
                text = text.replace(form, &format!("<credential {}/{}>", h.secret, h.key));
            }
        }
    }
    text
}

/// `count` random letters and digits from the system's CSPRNG.
fn random_value(count: usize) -> Result<String, String> {
    use ring::rand::SecureRandom;
    const SYMBOLS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let random = ring::rand::SystemRandom::new();
    let mut out = String::with_capacity(count);
    let mut buffer = [0u8; 64];
    while out.len() < count {
        random
            .fill(&mut buffer)
            .map_err(|_| "the system's random source failed".to_owned())?;
        // 248 = 4 × 62: bytes at or above it are dropped, so every symbol is equally likely.
        for byte in buffer.iter().filter(|b| **b < 248) {
            if out.len() == count {
                break;
            }
            out.push(char::from(SYMBOLS[usize::from(*byte % 62)]));
        }
    }
    Ok(out)
}

/// The Secret a grant with `generate` asks for: random values, owned by the parent, opted in
/// for the plugin's pods.
fn generated_secret(
    name: &str,
    parent: &CredentialParent,
    opt_in_label: &str,
    keys: &[String],
) -> Result<Secret, String> {
    let mut data = std::collections::BTreeMap::new();
    for key in keys {
        data.insert(key.clone(), random_value(GENERATED_LENGTH)?);
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(parent.namespace.clone()),
            labels: Some(
                [(opt_in_label.to_owned(), "true".to_owned())]
                    .into_iter()
                    .collect(),
            ),
            owner_references: Some(vec![OwnerReference {
                api_version: parent.api_version.clone(),
                kind: parent.kind.clone(),
                name: parent.name.clone(),
                uid: parent.uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        string_data: Some(data),
        ..Secret::default()
    })
}

/// True when `secret` may be handed out for `parent`: the parent controls it, or it carries
/// the plugin's opt-in label.
fn may_hand_out(secret: &Secret, parent: &CredentialParent, opt_in_label: &str) -> bool {
    let controlled = secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.uid == parent.uid);
    let opted_in = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(opt_in_label))
        .is_some_and(|value| value == "true");
    controlled || opted_in
}

/// The value of `key` in `secret`, or why there is none.
fn value_of(secret: &Secret, name: &str, key: &str) -> Result<Vec<u8>, CredentialError> {
    secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .map(|bytes| bytes.0.clone())
        .ok_or_else(|| CredentialError::Missing(format!("Secret `{name}` has no key `{key}`")))
}

impl Doors {
    /// The credential the plugin asks for, after every check (see the module docs).
    async fn credential(
        &mut self,
        secret: String,
        key: String,
    ) -> Result<Vec<u8>, CredentialError> {
        if !is_secret_name(&secret) || !is_secret_key(&key) {
            return Err(CredentialError::Refused(format!(
                "`{secret}`/`{key}` is not a Secret name and key of the parent's namespace"
            )));
        }
        let value = match self.scope().credentials().clone() {
            CredentialSource::None => Err(CredentialError::Refused(
                "this run reads no credentials".to_owned(),
            )),
            CredentialSource::Scripted(values) => values
                .get(&(secret.clone(), key.clone()))
                .cloned()
                .ok_or_else(|| {
                    CredentialError::Missing(format!(
                        "the script has no value for Secret `{secret}` key `{key}`"
                    ))
                }),
            CredentialSource::Live(live) => {
                let LiveCredentials {
                    client,
                    parent,
                    opt_in_label,
                    may_create,
                } = *live;
                let grants = &self.scope().grants().secrets;
                let Some(grant) = grants
                    .iter()
                    .find(|grant| grant.resolve(&parent.name) == secret)
                    .cloned()
                else {
                    return Err(CredentialError::Refused(format!(
                        "Secret `{secret}` is not granted to this plugin (granted: {:?}); the admin adds it to data.grants.secrets of its ConfigMap (`pack --grant-secret`) if the plugin must read it",
                        grants.iter().map(|g| g.name.as_str()).collect::<Vec<_>>()
                    )));
                };
                live_value(
                    &client,
                    &parent,
                    &opt_in_label,
                    may_create,
                    &grant,
                    &secret,
                    &key,
                )
                .await
            }
        }?;
        self.note_handed_out(HandedOut {
            secret,
            key,
            value: value.clone(),
        });
        Ok(value)
    }
}

/// Reads (or generates, then reads) a granted Secret through the API.
async fn live_value(
    client: &kube::Client,
    parent: &CredentialParent,
    opt_in_label: &str,
    may_create: bool,
    grant: &SecretGrant,
    name: &str,
    key: &str,
) -> Result<Vec<u8>, CredentialError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &parent.namespace);
    let unavailable = |e: kube::Error| {
        if let kube::Error::Api(status) = &e
            && status.code == 403
        {
            return CredentialError::Refused(format!(
                "the host may not read or create Secret `{name}` in namespace {} ({}); bind the ClusterRole policy-host-secrets there (deploy/rbac.yaml)",
                parent.namespace, status.message
            ));
        }
        CredentialError::Unavailable(format!("reading Secret `{name}`: {e}"))
    };
    let found = match api.get_opt(name).await.map_err(unavailable)? {
        Some(secret) => secret,
        None if may_create && grant.generate.iter().any(|k| k == key) => {
            let wanted = generated_secret(name, parent, opt_in_label, &grant.generate)
                .map_err(CredentialError::Unavailable)?;
            match api.create(&PostParams::default(), &wanted).await {
                Ok(created) => {
                    tracing::info!(
                        secret = name,
                        namespace = %parent.namespace,
                        parent = %parent.name,
                        "created Secret with generated credentials ({opt_in_label})"
                    );
                    created
                }
                // Another decision created it first: read theirs.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    api.get(name).await.map_err(unavailable)?
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
        None => {
            return Err(CredentialError::Missing(format!(
                "Secret `{name}` does not exist in namespace {}{}",
                parent.namespace,
                if grant.generate.iter().any(|k| k == key) {
                    " (this run may not create it)"
                } else {
                    "; create it, or grant the host to generate the key (`pack --grant-secret name:key`)"
                }
            )));
        }
    };
    if !may_hand_out(&found, parent, opt_in_label) {
        return Err(CredentialError::Refused(format!(
            "Secret `{name}` is neither controlled by {}/{} nor labelled `{}: \"true\"`; label it if this plugin may read it",
            parent.namespace, parent.name, opt_in_label
        )));
    }
    value_of(&found, name, key)
}

impl wit::Host for Doors {
    async fn read(&mut self, secret: String, key: String) -> Result<Vec<u8>, CredentialError> {
        self.credential(secret, key).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::capability::scope::{AppCallScope, Grants};
    use crate::contract::{Event, EventType};

    /// Doors of the plugin `toy` for the parent `ns/db`, granted `{parent}-auth` with a
    /// generated `token`, reading Secrets through `client`.
    fn doors(client: kube::Client, may_create: bool) -> Doors {
        let grants = Grants {
            secrets: vec![SecretGrant::parse("{parent}-auth:token").expect("a grant")],
            ..Grants::default()
        };
        let scope = AppCallScope::new(
            "ns/db".into(),
            HashMap::new(),
            grants,
            crate::capability::http::http_client().expect("an HTTP client"),
        )
        .with_credentials(CredentialSource::Live(Box::new(LiveCredentials {
            client,
            parent: CredentialParent {
                namespace: "ns".into(),
                name: "db".into(),
                api_version: "test.policy-host.io/v1".into(),
                kind: "Probe".into(),
                uid: "u-1".into(),
            },
            opt_in_label: "mountable-by.policy-host.io/toy".into(),
            may_create,
        })));
        Doors::new("toy@1.0.0".into(), scope, 1 << 20)
    }

    #[tokio::test]
    async fn an_ungranted_or_malformed_secret_is_refused_before_anything_is_read() {
        let (client, requests) = crate::capability::tls::tests::api_without_secrets().await;
        let mut doors = doors(client, true);
        let rows = [
            (
                "another parent's Secret",
                "other-auth",
                "token",
                "not granted",
            ),
            (
                "another namespace",
                "kube-system/db-auth",
                "token",
                "not a Secret name",
            ),
            ("a path", "../db-auth", "token", "not a Secret name"),
            ("a bad key", "db-auth", "to ken", "not a Secret name"),
            (
                "the pattern itself",
                "{parent}-auth",
                "token",
                "not a Secret name",
            ),
        ];
        for (what, secret, key, expected) in rows {
            match doors.credential(secret.into(), key.into()).await {
                Err(CredentialError::Refused(why)) => {
                    assert!(why.contains(expected), "{what}: {why}")
                }
                other => panic!("{what}: {other:?}"),
            }
        }
        assert_eq!(requests.load(Ordering::SeqCst), 0, "nothing was read");
        assert!(doors.handed_out().is_empty());
    }

    #[tokio::test]
    async fn a_run_that_may_not_write_never_creates_a_secret() {
        let (client, requests) = crate::capability::tls::tests::api_without_secrets().await;
        let mut doors = doors(client, false);
        match doors.credential("db-auth".into(), "token".into()).await {
            Err(CredentialError::Missing(why)) => {
                assert!(why.contains("may not create"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(requests.load(Ordering::SeqCst), 1, "one read, no create");
    }

    #[test]
    fn a_recording_that_carries_a_handed_out_value_is_never_replayed() {
        use crate::capability::replay::{AppCallRecorder, ExchangeRound};
        let value = "s3cretValue123456";
        let recorder = AppCallRecorder::new();
        recorder.record_exchange(ExchangeRound {
            pod: "db-0".into(),
            port: Some("redis".into()),
            request: format!("AUTH {value}\r\n").into_bytes(),
            reply: Ok(b"+OK\r\n".to_vec()),
        });
        recorder.record_credential(&handed(value));
        recorder.forget_if_carrying(&[handed("a-value-not-sent-1")]);
        assert!(
            recorder.is_complete(),
            "a value not in the bytes changes nothing"
        );
        recorder.forget_if_carrying(&[handed(value)]);
        assert!(!recorder.is_complete());
        assert!(recorder.exchanges().is_empty(), "the bytes are dropped");
        match recorder.credentials() {
            CredentialSource::Scripted(values) => assert!(values.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    fn handed(value: &str) -> HandedOut {
        HandedOut {
            secret: "db-credentials".into(),
            key: "root-password".into(),
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_decision_carrying_a_handed_out_value_is_found_wherever_it_puts_it() {
        let value = "s3cretValue123456";
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        let rows: Vec<(&str, Action, Option<&str>)> = vec![
            (
                "status",
                Action::SetStatus(format!(r#"{{"password":"{value}"}}"#)),
                Some("action 1 (set-status)"),
            ),
            (
                "a Secret's data (base64)",
                Action::Apply(format!(
                    r#"{{"kind":"Secret","data":{{"p":"{encoded}"}}}}"#
                )),
                Some("action 1 (apply)"),
            ),
            (
                "an Event",
                Action::RecordEvent(Event {
                    event_type: EventType::Normal,
                    reason: "Connected".into(),
                    message: format!("as root/{value}"),
                }),
                Some("action 1 (record-event)"),
            ),
            (
                "a pod that names the Secret",
                Action::Apply(
                    r#"{"kind":"Pod","env":[{"valueFrom":{"secretKeyRef":{"name":"db-credentials","key":"root-password"}}}]}"#.into(),
                ),
                None,
            ),
        ];
        for (what, action, expected) in rows {
            let found = find_leak(&[action], &[handed(value)]).map(|leak| leak.place);
            assert_eq!(found.as_deref(), expected, "{what}");
        }
    }

    #[test]
    fn values_are_cut_out_of_log_lines_and_short_ones_are_not_searched() {
        let line = redact(
            "connected with s3cretValue123456 as root".into(),
            &[handed("s3cretValue123456")],
        );
        assert_eq!(
            line,
            "connected with <credential db-credentials/root-password> as root"
        );
        assert_eq!(redact("a b c".into(), &[handed("b")]), "a b c");
    }

    #[test]
    fn grants_read_as_written_or_say_what_is_wrong() {
        assert_eq!(
            SecretGrant::parse("{parent}-credentials:root-password,replication-password"),
            Ok(SecretGrant {
                name: "{parent}-credentials".into(),
                generate: vec!["root-password".into(), "replication-password".into()],
            })
        );
        assert_eq!(
            SecretGrant::parse("shared"),
            Ok(SecretGrant {
                name: "shared".into(),
                generate: vec![],
            })
        );
        for bad in ["Other/NS", "ns/secret", "", "x:bad key"] {
            assert!(SecretGrant::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn generated_values_are_long_letters_and_digits_and_differ() {
        let a = random_value(GENERATED_LENGTH).expect("random");
        let b = random_value(GENERATED_LENGTH).expect("random");
        assert_eq!(a.len(), GENERATED_LENGTH);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
