//! Act: turns a plugin's decision into Kubernetes writes — server-side apply of children with
//! the host's owner reference, deletes of children the parent controls, status through the
//! status subresource, and Events.
//!
//! The host, not the plugin, decides ownership: every applied child gets the parent as its
//! controller and the host's policy label, and a delete is refused unless the parent already
//! controls the object. A plugin therefore cannot adopt or remove objects it does not own.
//!
//! **Never taking over.** Before anything of a decision is written, every object it applies is
//! claimed: one the parent controls in the observation (the child caches) is written with the
//! uid observed, so the apply fails instead of writing to an object that replaced it; any
//! other is read from the API server, and one that exists without the parent as its controller
//! refuses the whole decision ([`ActError::NotControlled`]). Deletes carry the observed uid as a
//! precondition, and status writes the parent's resourceVersion, so neither lands on a world
//! that changed since the observation ([`ActError::StaleView`]).
//!
//! One race is left open, knowingly: between the read that finds no object and the apply that
//! creates it, another writer can create the same name, and the forced apply then takes it
//! over. Server-side apply has no create-only form; a POST would close the window but leave
//! every field co-owned by an `Update` manager, so a plugin could never again remove a field it
//! stopped applying. The window is one API round trip, and only opens for a name nobody used
//! when the host looked.
//!
//! **Nothing written twice.** An apply onto a child that is still exactly what the host's own
//! last apply left, with the same body, is not sent ([`applied`]): a parent at steady state
//! costs no write.

pub mod applied;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

use self::applied::AppliedChildren;

use crate::capability::scope::Grants;
use crate::contract::{Action, Event, EventType, KindRef, PolicyInfo};
use crate::metrics::Metrics;
use crate::observe::{Observed, OwnedChild, is_controlled_by};
use crate::pod_inputs;

/// What carrying out a decision wrote that the caller has to remember.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    /// The parent's status was written and the parent changed: the parent observed is
    /// superseded by the host's own write, and a cache still holding it is behind.
    pub status_written: bool,
    /// Child applies sent to the API server.
    pub applies_sent: u32,
    /// Child applies not sent: the child was as the host's last apply left it.
    pub applies_skipped: u32,
}

/// An object a plugin asked to apply, with what identifies it.
pub struct AppliedObject {
    /// The object.
    pub object: Value,
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.name`, never empty.
    pub name: String,
}

impl AppliedObject {
    /// Parses an `apply` action's JSON; the error says what is missing.
    pub fn parse(json: &str) -> Result<Self, String> {
        let object: Value = serde_json::from_str(json)
            .map_err(|e| format!("an applied object is not valid JSON: {e}"))?;
        let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
        let (api_version, kind) = (text(&object["apiVersion"]), text(&object["kind"]));
        let name = text(&object["metadata"]["name"]);
        if name.is_empty() {
            return Err(format!("an applied {kind} has no metadata.name"));
        }
        Ok(Self {
            object,
            api_version,
            kind,
            name,
        })
    }
}

/// The most actions one decision may carry; a larger decision is refused whole, before any
/// write, so that one plugin cannot spend the host's share of the API server (review #18).
pub const MAX_ACTIONS_PER_DECISION: usize = 256;

/// The most children one decision may apply or delete.
pub const MAX_CHILD_WRITES_PER_DECISION: usize = 128;

/// The most Events one decision may record.
pub const MAX_EVENTS_PER_DECISION: usize = 16;

/// How long the writes of one decision may take together.
pub const ACT_DEADLINE: Duration = Duration::from_secs(60);

/// Refuses a decision over the per-decision caps; the message says which cap and by how much.
pub fn check_decision_size(actions: &[Action]) -> Result<(), String> {
    let child_writes = actions
        .iter()
        .filter(|a| matches!(a, Action::Apply(_) | Action::Delete(_)))
        .count();
    let events = actions
        .iter()
        .filter(|a| matches!(a, Action::RecordEvent(_)))
        .count();
    let over = |what: &str, count: usize, cap: usize| {
        format!(
            "its decision carries {count} {what}, over the host's cap of {cap} per decision; split the work across reconciles (requeue)"
        )
    };
    if actions.len() > MAX_ACTIONS_PER_DECISION {
        return Err(over("actions", actions.len(), MAX_ACTIONS_PER_DECISION));
    }
    if child_writes > MAX_CHILD_WRITES_PER_DECISION {
        return Err(over(
            "child applies and deletes",
            child_writes,
            MAX_CHILD_WRITES_PER_DECISION,
        ));
    }
    if events > MAX_EVENTS_PER_DECISION {
        return Err(over("Events", events, MAX_EVENTS_PER_DECISION));
    }
    Ok(())
}

/// The field manager of every server-side apply the host makes.
pub const FIELD_MANAGER: &str = "policy-host";

/// The label the host puts on every child it applies: the name of the policy that owns it.
/// Child watches select on it.
pub const POLICY_LABEL: &str = "policy-host.io/policy";

/// The prefix of the host's own label and annotation keys. They carry the host's decisions
/// (`policy-host.io/plugin=true` makes a ConfigMap code the host loads), so a plugin may not
/// set any of them on what it applies; [`POLICY_LABEL`] the host sets itself.
pub const HOST_KEY_PREFIX: &str = "policy-host.io/";

/// The first label or annotation key of `object` that only the host may set, if any.
pub fn host_key(object: &Value) -> Option<String> {
    ["labels", "annotations"].into_iter().find_map(|field| {
        object["metadata"][field]
            .as_object()?
            .keys()
            .find(|key| key.starts_with(HOST_KEY_PREFIX) && key.as_str() != POLICY_LABEL)
            .map(|key| format!("{} `{key}`", &field[..field.len() - 1]))
    })
}

/// Why a decision could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    /// The plugin asked for something the host will not do.
    #[error("plugin `{plugin}` asked for an action the host refuses: {message}; fix the plugin")]
    Refused {
        /// Plugin label.
        plugin: String,
        /// What was wrong.
        message: String,
    },
    /// The decision's writes did not finish within the act stage's deadline.
    #[error(
        "plugin `{plugin}`'s decision for {parent} was not carried out within {deadline:?}; the API server is slow or the decision too large; the next reconcile retries"
    )]
    Deadline {
        /// Plugin label.
        plugin: String,
        /// namespace/name of the parent.
        parent: String,
        /// The act stage's deadline.
        deadline: Duration,
    },
    /// Objects the decision applies exist and are not controlled by the parent: the host
    /// never takes an object over. Nothing of the decision was written.
    #[error(
        "{objects} already exist and {parent} does not control them: the host never takes over an object it did not create for this parent (nothing of the decision was written); delete or rename the existing objects if they may go, or give {parent} another name"
    )]
    NotControlled {
        /// `Kind namespace/name (who controls it)`, comma-separated.
        objects: String,
        /// `Kind namespace/name` of the parent.
        parent: String,
    },
    /// A write was refused because what the plugin decided from has changed since (a child
    /// replaced or gone, a newer parent): the parent is decided again from the current state.
    #[error(
        "{what} was not done: {why}; the decision was made on a view that has changed since, and the parent is decided again from the current state"
    )]
    StaleView {
        /// The write.
        what: String,
        /// What changed, as the API server said it.
        why: String,
    },
    /// The API server refused or failed a write.
    #[error("{what} failed: {}", api_error_text(source))]
    Api {
        /// The write.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

pub use crate::api_error::api_error_text;

impl ActError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ActError::Refused { .. } | ActError::NotControlled { .. } => "ActionRefused",
            ActError::Deadline { .. } => "ActDeadlineExceeded",
            ActError::StaleView { .. } => "StaleView",
            ActError::Api { .. } => "ApiWriteFailed",
        }
    }
}

/// How the host found an object a decision applies, before writing anything.
#[derive(Clone, Debug, PartialEq)]
enum Claim {
    /// No object of that name: the apply creates it.
    Absent,
    /// The parent controls it, as the object with this uid: the apply carries the uid, so it
    /// fails rather than write to an object that has replaced it.
    Controlled(String),
    /// The decision deletes it first (the parent controls it): the apply creates it again.
    Recreated,
}

/// Claims by (kind as `plural.apiVersion`, name).
type Claims = HashMap<(String, String), Claim>;

/// True when an API error says a precondition (uid, resourceVersion) no longer holds: 409, or
/// the 422 an apply gets when the uid it carries is not the live object's.
fn is_stale(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status)
        if status.code == 409 || (status.code == 422 && status.message.contains("uid")))
}

/// What the executor needs to write for one policy.
#[derive(Clone)]
pub struct Executor {
    client: Client,
    recorder: Recorder,
    /// Shared by every clone: what this policy may still publish this minute.
    events: Arc<Mutex<EventBudget>>,
    /// Where a refused Event is counted (none in tools and tests).
    metrics: Option<(Metrics, String)>,
    plugin_label: String,
    info: PolicyInfo,
    parent_resource: ApiResource,
    act_deadline: Duration,
    /// What the admin granted the plugin: the kinds and pod security its writes must keep to.
    grants: Grants,
    /// The host's last apply of every child, shared by every clone.
    applied: AppliedChildren,
    /// The [`crate::shard::CHILD_SHARD_LABEL`] value every applied child carries (sharded hosts).
    child_shard: Option<String>,
}

/// Events one policy's executor publishes per minute at most. kube's Recorder keeps every
/// Event it published for 6 minutes (to fold repeats into a series), and the parents of a
/// policy are many (each failing parent's Warning is retried with backoff): the rate bounds
/// what the Recorder holds, 3,600 Events of at most ~1.3 KiB each per policy. Past it, Events
/// are dropped (the failure is still logged and counted) until the minute ends.
pub const MAX_EVENTS_PER_MINUTE: u32 = 600;

/// A fixed one-minute window of [`MAX_EVENTS_PER_MINUTE`].
#[derive(Debug)]
struct EventBudget {
    window: Instant,
    sent: u32,
}

impl EventBudget {
    fn new(now: Instant) -> Self {
        Self {
            window: now,
            sent: 0,
        }
    }

    /// Takes one Event from the budget at `now`; false when the minute's are spent.
    fn take(&mut self, now: Instant) -> bool {
        if now.duration_since(self.window) >= Duration::from_secs(60) {
            *self = Self::new(now);
        }
        if self.sent >= MAX_EVENTS_PER_MINUTE {
            return false;
        }
        self.sent += 1;
        true
    }
}

/// Eight hex digits identifying a text.
/// An Event reason as the API accepts it: at most 128 bytes (the API counts bytes, not
/// characters), cut at a character boundary.
fn event_reason(reason: &str) -> String {
    reason[..reason.floor_char_boundary(128)].to_owned()
}

/// The `action` of an Event: `what` and a fingerprint of the note. kube's Recorder folds events
/// with the same (type, reason, action, object) into one series and keeps only the first note;
/// the note's fingerprint keeps distinct messages distinct ("added member -1", then "-2", or a
/// plugin refused for one reason, then another of the same reason) while identical repeats (a
/// failure retried with backoff) still fold into one series.
pub fn event_action(what: &str, note: &str) -> String {
    format!(
        "{}-{}",
        &what[..what.floor_char_boundary(100)],
        fingerprint(note)
    )
}

fn fingerprint(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A parent as the executor's book of applies knows it: `namespace/name`.
pub fn parent_key(parent: &DynamicObject) -> String {
    format!(
        "{}/{}",
        parent.namespace().unwrap_or_default(),
        parent.name_any()
    )
}

/// The kube-rs address of a declared kind.
pub fn api_resource(kind: &KindRef) -> ApiResource {
    ApiResource {
        group: kind.group.clone(),
        version: kind.version.clone(),
        api_version: kind.api_version(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
    }
}

impl Executor {
    /// An executor for the plugin described by `info`.
    pub fn new(client: Client, plugin_label: &str, info: &PolicyInfo) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            events: Arc::new(Mutex::new(EventBudget::new(Instant::now()))),
            metrics: None,
            client,
            plugin_label: plugin_label.to_string(),
            parent_resource: api_resource(&info.target),
            info: info.clone(),
            act_deadline: ACT_DEADLINE,
            grants: Grants::default(),
            applied: AppliedChildren::default(),
            child_shard: None,
        }
    }

    /// Forgets what was applied to the children of `parent` (`namespace/name`): it is
    /// finalized or gone.
    pub fn forget_parent(&self, parent: &str) {
        self.applied.forget_parent(parent);
    }

    /// How many children's last applies the executor keeps (see [`applied`]).
    pub fn applied_children(&self) -> usize {
        self.applied.len()
    }

    /// The same executor, naming `plugin_label` in its refusals: the controller outlives hot
    /// swaps, so it names the version that decided, not the one it started with.
    pub fn for_plugin(&self, plugin_label: &str) -> Self {
        Self {
            plugin_label: plugin_label.to_string(),
            ..self.clone()
        }
    }

    /// The same executor, checking writes against `grants` (kinds and pod security).
    pub fn with_grants(&self, grants: &Grants) -> Self {
        Self {
            grants: grants.clone(),
            ..self.clone()
        }
    }

    /// The same executor, counting the Events it drops past [`MAX_EVENTS_PER_MINUTE`] in
    /// `metrics` for `policy`.
    pub fn with_metrics(mut self, metrics: Metrics, policy: &str) -> Self {
        self.metrics = Some((metrics, policy.to_string()));
        self
    }

    /// The same executor, labelling every child it applies with `label` (the value of
    /// [`crate::shard::CHILD_SHARD_LABEL`] for the shard this host serves; `None`: unsharded).
    pub fn with_child_shard(mut self, label: Option<String>) -> Self {
        self.child_shard = label;
        self
    }

    /// The same executor with another deadline for the writes of one decision.
    pub fn with_act_deadline(mut self, deadline: Duration) -> Self {
        self.act_deadline = deadline;
        self
    }

    /// Carries out `actions` in order, stopping at the first failure. A decision over the
    /// per-decision caps is refused before any write; every apply is claimed first, so a
    /// decision that would take an object over writes nothing at all; the writes together
    /// must finish within the act deadline.
    ///
    /// What was written is recorded in `carried` as it happens, so it holds what the writes
    /// before a failure (or the deadline) did: a status written before a later action failed
    /// still supersedes the parent observed.
    pub async fn apply_decision(
        &self,
        parent: &DynamicObject,
        observed: &Observed,
        actions: Vec<Action>,
        carried: &mut Carried,
    ) -> Result<(), ActError> {
        check_decision_size(&actions).map_err(|message| self.refused(message))?;
        let writes = self.apply_actions(parent, observed, actions, carried);
        match tokio::time::timeout(self.act_deadline, writes).await {
            Ok(outcome) => outcome,
            Err(_) => Err(ActError::Deadline {
                plugin: self.plugin_label.clone(),
                parent: format!(
                    "{}/{}",
                    parent.namespace().unwrap_or_default(),
                    parent.name_any()
                ),
                deadline: self.act_deadline,
            }),
        }
    }

    async fn apply_actions(
        &self,
        parent: &DynamicObject,
        observed: &Observed,
        actions: Vec<Action>,
        carried: &mut Carried,
    ) -> Result<(), ActError> {
        let claims = self.claim_applies(parent, observed, &actions).await?;
        for action in actions {
            match action {
                Action::Apply(json) => {
                    if self.apply_child(parent, observed, &json, &claims).await? {
                        carried.applies_sent += 1;
                    } else {
                        carried.applies_skipped += 1;
                    }
                }
                Action::Delete(target) => {
                    self.delete_child(parent, observed, &target.kind, &target.name)
                        .await?
                }
                Action::SetStatus(json) => {
                    carried.status_written |= self.set_status(parent, &json).await?;
                }
                Action::RecordEvent(event) => self.record_event(parent, event).await?,
            }
        }
        Ok(())
    }

    fn refused(&self, message: String) -> ActError {
        ActError::Refused {
            plugin: self.plugin_label.clone(),
            message,
        }
    }

    /// Refuses what the admin's grants do not allow: a kind outside `grants.kinds`, a pod (or
    /// a pod template) above the granted pod-security level.
    fn granted(&self, kind: &KindRef, applied: &AppliedObject) -> Result<(), ActError> {
        let name = &applied.name;
        if let Some(kinds) = &self.grants.kinds
            && !kinds.contains(&kind.to_string())
        {
            return Err(self.refused(format!(
                "it applied {} `{name}`, a kind its grants do not allow (granted: {kinds:?}); the admin adds `{kind}` to data.grants.kinds of its ConfigMap",
                kind.kind
            )));
        }
        crate::pod_security::check(&applied.object, self.grants.pod_security).map_err(|why| {
            self.refused(format!(
                "it applied {} `{name}` with {why}, above the {} pod security its grants allow; the admin grants `podSecurity: privileged` in data.grants of its ConfigMap if the plugin must",
                kind.kind,
                self.grants.pod_security.name()
            ))
        })?;
        pod_inputs::check_images(&applied.object, self.grants.images.as_deref()).map_err(|why| {
            self.refused(format!(
                "it applied {} `{name}` whose {why}; the admin adds the repository to data.grants.images of its ConfigMap (`pack --grant-image`) if it is trusted",
                kind.kind
            ))
        })
    }

    /// Refuses a pod (or pod template) that mounts or reads a Secret not opted in for this
    /// plugin by the label [`pod_inputs::mountable_label`], reading only the Secret's metadata.
    async fn secrets_opted_in(
        &self,
        parent: &DynamicObject,
        applied: &AppliedObject,
    ) -> Result<(), ActError> {
        let uses = pod_inputs::secret_uses(&applied.object);
        if uses.is_empty() {
            return Ok(());
        }
        let namespace = self.namespace(parent)?;
        let label = pod_inputs::mountable_label(&self.info.name);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let (kind, object) = (&applied.kind, &applied.name);
        let mut checked = HashSet::new();
        for pod_inputs::SecretUse { name, used_as } in uses {
            if !checked.insert(name.clone()) {
                continue;
            }
            let meta = match secrets.get_metadata_opt(&name).await {
                Ok(meta) => meta,
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    return Err(self.refused(format!(
                        "it applied {kind} `{object}` using Secret `{name}` ({used_as}), and the host may not read that Secret's labels to check it is opted in; the admin binds the ClusterRole policy-host-secrets in namespace {namespace} (README, \"Running the host in a cluster\")"
                    )));
                }
                Err(source) => {
                    return Err(ActError::Api {
                        what: format!(
                            "reading the labels of Secret {namespace}/{name}, which {kind} `{object}` uses"
                        ),
                        source,
                    });
                }
            };
            let opted_in = meta
                .as_ref()
                .is_some_and(|m| m.labels().get(&label).is_some_and(|v| v == "true"));
            if !opted_in {
                let state = if meta.is_some() {
                    "is not opted in for this plugin"
                } else {
                    "does not exist"
                };
                return Err(self.refused(format!(
                    "it applied {kind} `{object}` using Secret `{name}` ({used_as}), which {state}; whoever owns the Secret opts it in with `kubectl label secret -n {namespace} {name} {label}=true`"
                )));
            }
        }
        Ok(())
    }

    fn declared(&self, api_version: &str, kind: &str) -> Option<&KindRef> {
        self.info
            .children
            .iter()
            .find(|k| k.matches(api_version, kind))
    }

    fn namespace(&self, parent: &DynamicObject) -> Result<String, ActError> {
        parent
            .namespace()
            .ok_or_else(|| self.refused("cluster-scoped parents are not supported yet".into()))
    }

    /// The declared kind of an applied object, refusing undeclared kinds and host-only keys.
    fn checked_apply(&self, applied: &AppliedObject) -> Result<KindRef, ActError> {
        let AppliedObject {
            api_version,
            kind,
            name,
            object,
        } = applied;
        let declared = self.declared(api_version, kind).cloned().ok_or_else(|| {
            self.refused(format!(
                "it applied {api_version}/{kind} `{name}`, a kind it did not declare as a child"
            ))
        })?;
        if let Some(key) = host_key(object) {
            return Err(self.refused(format!(
                "it applied {kind} `{name}` with the {key}, which only the host sets (a ConfigMap labelled `policy-host.io/plugin` is code the host loads)"
            )));
        }
        self.granted(&declared, applied)?;
        Ok(declared)
    }

    /// Claims every object `actions` apply, before anything is written: refuses undeclared
    /// kinds, host-only keys, and objects that exist without the parent as their controller.
    async fn claim_applies(
        &self,
        parent: &DynamicObject,
        observed: &Observed,
        actions: &[Action],
    ) -> Result<Claims, ActError> {
        let mut claims = Claims::new();
        let mut deleted = HashSet::new();
        let mut not_controlled = Vec::new();
        for action in actions {
            let json = match action {
                Action::Apply(json) => json,
                Action::Delete(target) => {
                    deleted.insert((target.kind.to_string(), target.name.clone()));
                    continue;
                }
                Action::SetStatus(_) | Action::RecordEvent(_) => continue,
            };
            let applied = AppliedObject::parse(json).map_err(|e| self.refused(e))?;
            let kind = self.checked_apply(&applied)?;
            self.secrets_opted_in(parent, &applied).await?;
            let key = (kind.to_string(), applied.name);
            if claims.contains_key(&key) {
                continue;
            }
            let observed_child = observed
                .owned
                .get(&key.0)
                .and_then(|names| names.get(&key.1));
            let claim = if deleted.contains(&key) {
                Claim::Recreated
            } else if let Some(child) = observed_child {
                Claim::Controlled(child.uid.clone())
            } else {
                match self.live_claim(parent, &kind, &key.1).await? {
                    Ok(claim) => claim,
                    Err(object) => {
                        not_controlled.push(object);
                        continue;
                    }
                }
            };
            claims.insert(key, claim);
        }
        if !not_controlled.is_empty() {
            return Err(ActError::NotControlled {
                objects: not_controlled.join(", "),
                parent: format!(
                    "{} {}/{}",
                    self.parent_resource.kind,
                    parent.namespace().unwrap_or_default(),
                    parent.name_any()
                ),
            });
        }
        Ok(claims)
    }

    /// Reads a child the observation does not show the parent controlling: absent, controlled
    /// (the cache had not caught up), or someone else's (`Err` describes it).
    async fn live_claim(
        &self,
        parent: &DynamicObject,
        kind: &KindRef,
        name: &str,
    ) -> Result<Result<Claim, String>, ActError> {
        let namespace = self.namespace(parent)?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &api_resource(kind));
        let live = api.get_opt(name).await.map_err(|source| ActError::Api {
            what: format!(
                "reading {} {namespace}/{name} before applying it (the host needs `get` on {})",
                kind.kind, kind.plural
            ),
            source,
        })?;
        let Some(live) = live else {
            return Ok(Ok(Claim::Absent));
        };
        let parent_uid = parent.uid().unwrap_or_default();
        if is_controlled_by(&live, &parent_uid) {
            return Ok(Ok(Claim::Controlled(live.uid().unwrap_or_default())));
        }
        let controller = live
            .owner_references()
            .iter()
            .find(|r| r.controller == Some(true))
            .map_or_else(
                || "no controller".to_string(),
                |r| format!("controlled by {} {}", r.kind, r.name),
            );
        Ok(Err(format!(
            "{} {namespace}/{name} ({controller})",
            kind.kind
        )))
    }

    /// Server-side applies one child with the parent as its controller, unless the child is
    /// still what the host's own last apply of the same body left (see [`applied`]). Returns
    /// whether the apply was sent.
    async fn apply_child(
        &self,
        parent: &DynamicObject,
        observed: &Observed,
        json: &str,
        claims: &Claims,
    ) -> Result<bool, ActError> {
        let applied = AppliedObject::parse(json).map_err(|e| self.refused(e))?;
        let kind = self.checked_apply(&applied)?;
        let AppliedObject {
            mut object,
            kind: kind_name,
            name,
            ..
        } = applied;
        let kind_key = kind.to_string();
        let claim = claims
            .get(&(kind_key.clone(), name.clone()))
            .ok_or_else(|| self.refused(format!("{kind_name} `{name}` was never claimed")))?;
        let namespace = self.namespace(parent)?;
        let owner = parent
            .controller_owner_ref(&self.parent_resource)
            .ok_or_else(|| self.refused("the parent has no uid".into()))?;
        let metadata = object
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| self.refused(format!("{kind_name} `{name}` has no metadata object")))?;
        metadata.insert("namespace".into(), json!(namespace));
        metadata.insert("ownerReferences".into(), json!([owner]));
        metadata.remove("uid");
        let labels = metadata
            .entry("labels")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| self.refused(format!("{kind_name} `{name}` has non-object labels")))?;
        labels.insert(POLICY_LABEL.into(), json!(self.info.name));
        // A sharded host's child caches select on its shard: a child without the label would
        // be invisible to the very shard that applied it.
        if let Some(shard) = &self.child_shard {
            labels.insert(crate::shard::CHILD_SHARD_LABEL.into(), json!(shard));
        }
        // The body without the uid: the uid is compared on its own, and the first apply after
        // a create (which carries none) then counts as the same body as the next.
        let body = applied::digest(&object);
        let parent_key = parent_key(parent);
        let child_key = (kind_key.as_str(), name.as_str());
        if let Claim::Controlled(_) = claim
            && let Some(child) = observed.owned.get(&kind_key).and_then(|c| c.get(&name))
            && self
                .applied
                .unchanged(&parent_key, child_key, child, &body, Instant::now())
        {
            return Ok(false);
        }
        // The uid is a precondition of the apply: an object of that name with another uid
        // (422, immutable uid) or none at all (409) refuses it.
        if let Claim::Controlled(uid) = claim
            && let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut)
        {
            metadata.insert("uid".into(), json!(uid));
        }

        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &api_resource(&kind));
        let what = format!("applying {kind_name} {namespace}/{name}");
        match api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
        {
            Ok(written) => {
                let written = OwnedChild {
                    uid: written.uid().unwrap_or_default(),
                    resource_version: written.resource_version().unwrap_or_default(),
                };
                self.applied
                    .applied(&parent_key, child_key, written, body, Instant::now());
                Ok(true)
            }
            Err(source) if matches!(claim, Claim::Controlled(_)) && is_stale(&source) => {
                Err(ActError::StaleView {
                    why: format!(
                        "the object observed is gone or was replaced ({})",
                        api_error_text(&source)
                    ),
                    what,
                })
            }
            Err(source) => Err(ActError::Api { what, source }),
        }
    }

    /// Deletes a child, only if the parent controls it; an already-gone child is fine.
    async fn delete_child(
        &self,
        parent: &DynamicObject,
        observed: &Observed,
        kind: &KindRef,
        name: &str,
    ) -> Result<(), ActError> {
        let declared = self
            .declared(&kind.api_version(), &kind.kind)
            .cloned()
            .ok_or_else(|| {
                self.refused(format!(
                    "it deleted {kind} `{name}`, a kind it did not declare as a child"
                ))
            })?;
        let Some(OwnedChild { uid, .. }) = observed
            .owned
            .get(&declared.to_string())
            .and_then(|names| names.get(name))
        else {
            return Err(self.refused(format!(
                "it deleted {kind} `{name}`, which its parent does not control"
            )));
        };
        let namespace = self.namespace(parent)?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &api_resource(&declared));
        // Only the object observed: another that took its name since is not the parent's.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        self.applied
            .forget_child(&parent_key(parent), (&declared.to_string(), name));
        match api.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) if is_stale(&source) => Err(ActError::StaleView {
                what: format!("deleting {} {namespace}/{name}", declared.kind),
                why: format!(
                    "the object observed was replaced by another of that name ({})",
                    api_error_text(&source)
                ),
            }),
            Err(source) => Err(ActError::Api {
                what: format!("deleting {} {namespace}/{name}", declared.kind),
                source,
            }),
        }
    }

    /// Replaces the parent's status (server-side apply on the status subresource), only if the
    /// parent is still the one decided from: plugins keep state in status (etcd's members,
    /// Redis' primary), and a decision from a stale cache must not write it back over a newer
    /// one. The parent's resourceVersion is the precondition; a conflict is a
    /// [`ActError::StaleView`], and the newer parent's watch event brings a fresh decision.
    ///
    /// Returns whether the parent changed (an unchanged status is not written again).
    async fn set_status(&self, parent: &DynamicObject, json: &str) -> Result<bool, ActError> {
        let status: Value = serde_json::from_str(json)
            .map_err(|e| self.refused(format!("its status is not valid JSON: {e}")))?;
        if !status.is_object() {
            return Err(self.refused("its status is not a JSON object".into()));
        }
        if parent.data.get("status") == Some(&status) {
            return Ok(false);
        }
        let namespace = self.namespace(parent)?;
        let name = parent.name_any();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &self.parent_resource);
        let mut patch = json!({
            "apiVersion": self.parent_resource.api_version,
            "kind": self.parent_resource.kind,
            "status": status,
        });
        if let Some(version) = parent.resource_version() {
            patch["metadata"] = json!({ "resourceVersion": version });
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match api
            .patch_status(&name, &params, &Patch::Apply(&patch))
            .await
        {
            // An apply that changed nothing (a status differing only in what the API server
            // drops, such as null fields) leaves the resourceVersion as it was: no newer view
            // is on its way, so none is waited for.
            Ok(written) => Ok(written.resource_version() != parent.resource_version()),
            Err(source) if is_stale(&source) => Err(ActError::StaleView {
                what: format!(
                    "setting the status of {} {namespace}/{name}",
                    self.parent_resource.kind
                ),
                why: format!(
                    "the parent changed since it was observed ({})",
                    api_error_text(&source)
                ),
            }),
            Err(source) => Err(ActError::Api {
                what: format!(
                    "setting the status of {} {namespace}/{name} (does its CRD enable the status subresource?)",
                    self.parent_resource.kind
                ),
                source,
            }),
        }
    }

    /// Records an Event on the parent.
    pub async fn record_event(&self, parent: &DynamicObject, event: Event) -> Result<(), ActError> {
        let allowed = self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now());
        if !allowed {
            if let Some((metrics, policy)) = &self.metrics {
                metrics.bound_reached(
                    "events",
                    &format!("policy `{policy}` published {MAX_EVENTS_PER_MINUTE} Events this minute; further ones are dropped until it ends (their failures are still logged and counted)"),
                );
            }
            return Ok(());
        }
        let mut note = event.message;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let reason = event_reason(&event.reason);
        let kube_event = KubeEvent {
            type_: match event.event_type {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            action: event_action(&reason, &note),
            reason,
            note: Some(note),
            secondary: None,
        };
        let reference = parent.object_ref(&self.parent_resource);
        self.recorder
            .publish(&kube_event, &reference)
            .await
            .map_err(|source| ActError::Api {
                what: format!("recording an Event on {}", parent.name_any()),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{ObjectRef as ChildRef, Observation};

    fn event() -> Action {
        Action::RecordEvent(Event {
            event_type: EventType::Normal,
            reason: "Reconciled".into(),
            message: "done".into(),
        })
    }

    fn apply(n: usize) -> Action {
        Action::Apply(format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"c{n}"}}}}"#
        ))
    }

    fn config_maps() -> KindRef {
        KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        }
    }

    #[test]
    fn a_decision_within_every_cap_passes() {
        let mut actions: Vec<Action> = (0..MAX_CHILD_WRITES_PER_DECISION).map(apply).collect();
        actions.extend((0..MAX_EVENTS_PER_DECISION).map(|_| event()));
        assert_eq!(check_decision_size(&actions), Ok(()));
    }

    #[test]
    fn a_decision_with_too_many_child_writes_is_refused_with_the_cap() {
        let mut actions: Vec<Action> = (0..MAX_CHILD_WRITES_PER_DECISION).map(apply).collect();
        actions.push(Action::Delete(ChildRef {
            kind: config_maps(),
            name: "old".into(),
        }));
        let refusal = check_decision_size(&actions).expect_err("over the child cap");
        assert!(
            refusal.contains("129 child applies and deletes") && refusal.contains("cap of 128"),
            "{refusal}"
        );
    }

    #[test]
    fn a_decision_with_too_many_events_is_refused_with_the_cap() {
        let actions: Vec<Action> = (0..=MAX_EVENTS_PER_DECISION).map(|_| event()).collect();
        let refusal = check_decision_size(&actions).expect_err("over the Event cap");
        assert!(refusal.contains("17 Events"), "{refusal}");
    }

    #[test]
    fn a_decision_with_too_many_actions_is_refused_with_the_cap() {
        let actions: Vec<Action> = (0..=MAX_ACTIONS_PER_DECISION)
            .map(|_| Action::SetStatus("{}".into()))
            .collect();
        let refusal = check_decision_size(&actions).expect_err("over the action cap");
        assert!(refusal.contains("257 actions"), "{refusal}");
    }

    fn probe_info() -> PolicyInfo {
        PolicyInfo {
            name: "probe".into(),
            version: "1.0.0".into(),
            target: KindRef {
                group: "test.policy-host.io".into(),
                version: "v1".into(),
                kind: "Probe".into(),
                plural: "probes".into(),
                namespaced: true,
            },
            children: vec![config_maps()],
            capabilities: Vec::new(),
            wants_finalizer: false,
        }
    }

    fn parent() -> DynamicObject {
        let mut parent =
            DynamicObject::new("p", &api_resource(&probe_info().target)).within("default");
        parent.metadata.uid = Some("uid-p".into());
        parent
    }

    fn observed() -> Observed {
        Observed {
            observation: Observation {
                parent: "{}".into(),
                children: Vec::new(),
                now: crate::contract::Timestamp {
                    seconds: 0,
                    nanoseconds: 0,
                },
            },
            pods: Default::default(),
            owned: Default::default(),
        }
    }

    /// A client of an API server that accepts connections and never answers.
    async fn silent_api_server() -> (Client, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound address");
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let uri: http::Uri = format!("http://{addr}").parse().expect("a valid URI");
        let client = Client::try_from(kube::Config::new(uri)).expect("a client");
        (client, server)
    }

    #[tokio::test]
    async fn writes_that_hang_end_at_the_act_deadline() {
        let (client, server) = silent_api_server().await;
        let executor = Executor::new(client, "probe@1.0.0", &probe_info())
            .with_act_deadline(Duration::from_millis(300));
        let outcome = tokio::time::timeout(
            Duration::from_secs(30),
            executor.apply_decision(
                &parent(),
                &observed(),
                vec![apply(0)],
                &mut Carried::default(),
            ),
        )
        .await
        .expect("apply_decision returned by itself");
        match outcome {
            Err(error @ ActError::Deadline { .. }) => {
                assert_eq!(error.reason(), "ActDeadlineExceeded");
                assert!(error.to_string().contains("default/p"), "{error}");
            }
            other => panic!("expected the act deadline, got {other:?}"),
        }
        server.abort();
    }

    /// A client of an API server that answers every request with `body` (200, JSON): enough
    /// for a status write to succeed.
    async fn answering_api_server(body: Value) -> (Client, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound address");
        let body = body.to_string();
        let server = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 4096];
                    // One request per connection: read its head and its body, then answer.
                    loop {
                        let Ok(read) = socket.read(&mut buffer).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        request.extend_from_slice(&buffer[..read]);
                        let text = String::from_utf8_lossy(&request);
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length = text[..end]
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .and_then(|n| n.trim().parse::<usize>().ok())
                                })
                                .unwrap_or(0);
                            if request.len() >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        let uri: http::Uri = format!("http://{addr}").parse().expect("a valid URI");
        let client = Client::try_from(kube::Config::new(uri)).expect("a client");
        (client, server)
    }

    /// A status written by an action before a later one fails still changed the parent: the
    /// caller is told, or it would decide again on the view the write superseded (review L5).
    #[tokio::test]
    async fn a_status_written_before_a_failed_action_is_reported_with_the_failure() {
        let mut written = parent();
        written.metadata.resource_version = Some("2".into());
        written.data = json!({"status": {"step": 1}});
        let (client, server) =
            answering_api_server(serde_json::to_value(&written).expect("the parent as JSON")).await;
        let executor = Executor::new(client, "probe@1.0.0", &probe_info());
        let mut observed_parent = parent();
        observed_parent.metadata.resource_version = Some("1".into());
        let actions = vec![
            Action::SetStatus(r#"{"step":1}"#.into()),
            // Not a child the parent controls: refused, after the status was written.
            Action::Delete(ChildRef {
                kind: config_maps(),
                name: "not-observed".into(),
            }),
        ];
        let mut carried = Carried::default();
        let outcome = executor
            .apply_decision(&observed_parent, &observed(), actions, &mut carried)
            .await;
        assert!(
            matches!(outcome, Err(ActError::Refused { .. })),
            "{outcome:?}"
        );
        assert!(
            carried.status_written,
            "the status write before the failure is reported"
        );
        server.abort();
    }

    #[tokio::test]
    async fn a_refusal_names_the_plugin_version_that_decided() {
        let (client, server) = silent_api_server().await;
        let started_with = Executor::new(client, "probe@1.0.0", &probe_info());
        let executor = started_with.for_plugin("probe@2.0.0");
        let secret =
            Action::Apply(r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}"#.into());
        let error = executor
            .apply_decision(
                &parent(),
                &observed(),
                vec![secret],
                &mut Carried::default(),
            )
            .await
            .expect_err("an undeclared kind is refused");
        assert!(error.to_string().contains("probe@2.0.0"), "{error}");
        server.abort();
    }

    #[tokio::test]
    async fn a_pod_running_an_image_outside_the_grants_is_refused_before_anything_is_read() {
        // A silent API server: a check that needed it would end at the act deadline instead.
        let (client, server) = silent_api_server().await;
        let mut info = probe_info();
        info.children.push(KindRef {
            group: String::new(),
            version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
            namespaced: true,
        });
        let executor = Executor::new(client, "probe@1.0.0", &info)
            .with_grants(&Grants {
                images: Some(vec!["gcr.io/etcd-development/etcd".into()]),
                ..Grants::default()
            })
            .with_act_deadline(Duration::from_millis(300));
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "m"},
            "spec": {"containers": [{"name": "etcd", "image": "evil.example/etcd:v3"}]}});
        let error = executor
            .apply_decision(
                &parent(),
                &observed(),
                vec![Action::Apply(pod.to_string())],
                &mut Carried::default(),
            )
            .await
            .expect_err("an image outside the grants is refused");
        assert_eq!(error.reason(), "ActionRefused", "{error}");
        assert!(
            error.to_string().contains("evil.example/etcd:v3")
                && error.to_string().contains("data.grants.images"),
            "{error}"
        );
        server.abort();
    }

    /// Pure logic on in-memory objects: which keys a plugin may not set on what it applies.
    #[test]
    fn only_the_host_sets_its_own_label_and_annotation_keys() {
        let rows = [
            (
                "a ConfigMap labelled as a plugin pack",
                json!({"metadata": {"name": "x", "labels": {"policy-host.io/plugin": "true"}}}),
                Some("label `policy-host.io/plugin`"),
            ),
            (
                "a promoted-shadow annotation",
                json!({"metadata": {"name": "x", "annotations": {"policy-host.io/superseded-by": "y"}}}),
                Some("annotation `policy-host.io/superseded-by`"),
            ),
            (
                "the policy label, which the host overwrites anyway",
                json!({"metadata": {"name": "x", "labels": {"policy-host.io/policy": "etcd"}}}),
                None,
            ),
            (
                "a plugin's own domain under the host's",
                json!({"metadata": {"name": "x", "labels": {"redis.policy-host.io/role": "primary"}}}),
                None,
            ),
            ("no labels at all", json!({"metadata": {"name": "x"}}), None),
            (
                "labels that are not an object",
                json!({"metadata": {"name": "x", "labels": "policy-host.io/plugin"}}),
                None,
            ),
        ];
        for (situation, object, expected) in rows {
            assert_eq!(host_key(&object).as_deref(), expected, "{situation}");
        }
    }

    /// Each row: Events asked for at an offset from the window's start, and how many of them
    /// the budget lets through.
    #[test]
    fn a_policys_events_are_bounded_per_minute() {
        let start = Instant::now();
        let max = MAX_EVENTS_PER_MINUTE as usize;
        // (situation, Events asked for as (seconds into the window, how many), let through)
        type Row = (&'static str, Vec<(u64, usize)>, usize);
        let rows: Vec<Row> = vec![
            ("within the minute's budget", vec![(0, max)], max),
            ("past it in the same minute", vec![(0, max), (59, 10)], max),
            (
                "a new minute, a new budget",
                vec![(0, max + 5), (60, 10)],
                max + 10,
            ),
        ];
        for (situation, asks, allowed) in rows {
            let mut budget = EventBudget::new(start);
            let mut passed = 0;
            for (at, count) in asks {
                for _ in 0..count {
                    passed += usize::from(budget.take(start + Duration::from_secs(at)));
                }
            }
            assert_eq!(passed, allowed, "{situation}");
        }
    }

    #[test]
    fn event_reasons_are_bounded_in_bytes_not_characters() {
        let rows = [
            ("ascii under the limit", "Reconciled".to_owned()),
            ("ascii over the limit", "R".repeat(300)),
            ("two-byte characters over the limit", "é".repeat(100)),
            ("a cut inside a character", format!("a{}", "é".repeat(100))),
        ];
        for (situation, reason) in rows {
            let cut = event_reason(&reason);
            assert!(cut.len() <= 128, "{situation}: {} bytes", cut.len());
            assert!(reason.starts_with(&cut), "{situation}");
            assert!(
                cut.len() >= reason.len().min(127),
                "{situation}: cut too much"
            );
        }
    }
}
