//! Plain-Rust mirrors of the WIT contract (`wit/policy.wit`), so a plugin's decision logic
//! never touches wit-bindgen and tests natively with `cargo test`.
//!
//! Kubernetes objects cross the boundary as JSON text; here they are [`serde_json::Value`] on
//! the way out (actions, status) and `String` on the way in (the observation), exactly as the
//! host hands them over. The SDK's wasm glue converts between these types and the generated
//! ones, so a plugin author never sees the latter.

use serde_json::Value;

/// A Kubernetes resource type, as the API server serves it (WIT `kind-ref`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindRef {
    /// API group; empty for the core group.
    pub group: String,
    /// API version within the group, e.g. `v1`.
    pub version: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Plural resource name, e.g. `pods`.
    pub plural: String,
    /// Whether objects of this kind live in a namespace.
    pub namespaced: bool,
}

impl KindRef {
    /// Builds a namespaced kind reference.
    pub fn namespaced(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        KindRef {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            namespaced: true,
        }
    }

    /// True when `self` names the same resource type as `group`/`kind` (versions ignored:
    /// the host may serve a child kind at the version it was declared with only).
    pub fn is(&self, group: &str, kind: &str) -> bool {
        self.group == group && self.kind == kind
    }
}

/// Something the plugin asks the host to allow (WIT `capability`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Capability {
    /// HTTP/JSON requests to this container port (name or number) of pods the parent owns.
    AppCall(String),
    /// Raw TCP request/response exchanges ([`crate::exchange`]) with this container port (name
    /// or number) of pods the parent owns, for apps whose protocol is not HTTP.
    Exchange(String),
}

/// What the plugin says about itself (WIT `policy-info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyInfo {
    /// Plugin name, DNS-label-like.
    pub name: String,
    /// Plugin version (semver).
    pub version: String,
    /// The custom resource kind this plugin reconciles.
    pub target: KindRef,
    /// Kinds of the children the plugin creates.
    pub children: Vec<KindRef>,
    /// Capabilities the plugin asks for.
    pub capabilities: Vec<Capability>,
    /// Whether the host should put a finalizer on each parent.
    pub wants_finalizer: bool,
}

/// A point in time: seconds and nanoseconds since the Unix epoch, UTC (WIT `timestamp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    /// Whole seconds since the epoch.
    pub seconds: i64,
    /// Nanoseconds within the second.
    pub nanoseconds: u32,
}

/// A child the parent owns, as the host's cache saw it (WIT `child`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Child {
    /// Which of the declared child kinds this is.
    pub kind: KindRef,
    /// The whole object as JSON text.
    pub object: String,
}

/// Everything the plugin may know when it decides (WIT `observation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The parent custom resource as JSON text (metadata, spec, status).
    pub parent: String,
    /// Every child of the declared kinds that the parent controls.
    pub children: Vec<Child>,
    /// The time of the observation; the plugin has no other clock.
    pub now: Timestamp,
}

/// Severity of a Kubernetes Event (WIT `event-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something a human should look at.
    Warning,
}

/// A Kubernetes Event about the parent (WIT `event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Normal or warning.
    pub event_type: EventType,
    /// Short CamelCase reason, e.g. `MemberAdded`.
    pub reason: String,
    /// What happened, for a human.
    pub message: String,
}

/// One thing the host should do (WIT `action`).
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Server-side apply this child (with apiVersion, kind and metadata.name).
    Apply(Value),
    /// Delete this child, if the parent controls it.
    Delete {
        /// Which of the declared child kinds.
        kind: KindRef,
        /// Name in the parent's namespace.
        name: String,
    },
    /// Replace the parent's `.status` with this JSON object.
    SetStatus(Value),
    /// Record an Event on the parent.
    RecordEvent(Event),
}

/// What the plugin decided for one observation (WIT `decision`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Actions, carried out in order; the host stops at the first that fails.
    pub actions: Vec<Action>,
    /// Reconcile again after this many milliseconds even if nothing changes.
    pub requeue_after_ms: Option<u64>,
    /// Domain metrics about the parent (contract 0.2.3; see [`crate::metrics`]): not part of
    /// the WIT `decision`, the SDK reports them through the `metrics` import before it returns
    /// the decision.
    pub metrics: Vec<crate::metrics::Sample>,
}

/// What the plugin decided while its parent is being deleted (WIT `finalize-decision`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FinalizeDecision {
    /// Cleanup actions, as for reconcile.
    pub actions: Vec<Action>,
    /// True once cleanup is complete.
    pub done: bool,
    /// Call finalize again after this many milliseconds if not done.
    pub requeue_after_ms: Option<u64>,
}

/// A refusal to decide (WIT `policy-error`): the host logs it, records an Event and retries
/// with backoff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// Short CamelCase reason.
    pub reason: String,
    /// What is wrong and what to do about it.
    pub message: String,
}

impl PolicyError {
    /// Builds an error from a reason and a message.
    pub fn new(reason: &str, message: impl Into<String>) -> Self {
        PolicyError {
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

impl std::error::Error for PolicyError {}

/// HTTP method of an app-call (WIT `app-call.method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// GET
    Get,
    /// POST
    Post,
    /// PUT
    Put,
    /// DELETE
    Delete,
}

/// An HTTP/JSON request to a pod the parent owns (WIT `app-call.request`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppCallRequest {
    /// Name of a Pod child of the parent.
    pub pod: String,
    /// Container port name or number, as granted.
    pub port: String,
    /// HTTP method.
    pub method: Method,
    /// Path and query, starting with `/`.
    pub path: String,
    /// JSON request body, if any.
    pub body: Option<String>,
    /// Send over HTTPS with these certificates (WIT `call-tls`, contract 0.2.1); `None` sends
    /// plain HTTP (WIT `call`).
    pub tls: Option<TlsClient>,
}

/// Client TLS for an app-call (WIT `app-call.tls-client`): the host reads the certificates
/// from a Secret in the parent's namespace; the plugin only names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlsClient {
    /// A Secret in the parent's namespace with `ca.crt` and, for a client certificate,
    /// `tls.crt` and `tls.key`.
    pub secret: String,
    /// The DNS name the app's server certificate must be valid for.
    pub server_name: String,
}

/// A response to an app-call, whatever its status code (WIT `app-call.response`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppCallResponse {
    /// HTTP status code.
    pub status: u16,
    /// Response body as text.
    pub body: String,
}

/// Why an app-call got no response (WIT `app-call.call-error`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppCallError {
    /// The host refused the request (pod not owned, port not granted, ...).
    Refused(String),
    /// The pod could not be reached.
    Unreachable(String),
    /// No answer within the host's timeout.
    Timeout,
}

impl std::fmt::Display for AppCallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppCallError::Refused(why) => write!(f, "refused by the host: {why}"),
            AppCallError::Unreachable(why) => write!(f, "unreachable: {why}"),
            AppCallError::Timeout => write!(f, "timed out"),
        }
    }
}

impl KindRef {
    /// Builds a cluster-scoped kind reference (e.g. a `ClusterRole`).
    pub fn cluster_scoped(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        KindRef {
            namespaced: false,
            ..KindRef::namespaced(group, version, kind, plural)
        }
    }

    /// The `apiVersion` field of objects of this kind: `group/version`, or only `version`
    /// for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

impl Event {
    /// A `Normal` event: something expected happened.
    pub fn normal(reason: &str, message: impl Into<String>) -> Self {
        Event {
            event_type: EventType::Normal,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    /// A `Warning` event: something a human should look at.
    pub fn warning(reason: &str, message: impl Into<String>) -> Self {
        Event {
            event_type: EventType::Warning,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

impl Action {
    /// Apply any serializable object (a `k8s-openapi` type, or a `serde_json::json!` value).
    /// Fails, as a [`PolicyError`], only if the object does not serialize to JSON.
    pub fn apply(object: &impl serde::Serialize) -> Result<Action, PolicyError> {
        serde_json::to_value(object)
            .map(Action::Apply)
            .map_err(|e| PolicyError::new("Serialize", format!("a child does not serialize: {e}")))
    }

    /// Delete the child `name` of kind `kind`.
    pub fn delete(kind: &KindRef, name: impl Into<String>) -> Action {
        Action::Delete {
            kind: kind.clone(),
            name: name.into(),
        }
    }

    /// Replace the parent's status with any serializable value.
    pub fn set_status(status: &impl serde::Serialize) -> Result<Action, PolicyError> {
        serde_json::to_value(status)
            .map(Action::SetStatus)
            .map_err(|e| {
                PolicyError::new("Serialize", format!("the status does not serialize: {e}"))
            })
    }
}

impl Decision {
    /// A decision with no actions and no requeue: "all is as it should be".
    pub fn nothing() -> Self {
        Decision::default()
    }

    /// Adds an action at the end (actions run in order).
    pub fn with(mut self, action: Action) -> Self {
        self.actions.push(action);
        self
    }

    /// Asks the host to reconcile again after `after`, even if nothing changes (for
    /// progress that the host cannot observe, such as an app becoming healthy).
    pub fn requeue_after(mut self, after: std::time::Duration) -> Self {
        self.requeue_after_ms = Some(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
        self
    }
}

impl FinalizeDecision {
    /// Cleanup is complete: the host may remove its finalizer.
    pub fn done() -> Self {
        FinalizeDecision {
            done: true,
            ..FinalizeDecision::default()
        }
    }
}
