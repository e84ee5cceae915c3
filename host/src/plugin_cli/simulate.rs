//! `policy-host simulate`: a plugin's reconcile loop against an in-memory model of its parent
//! and children, app-calls and sessions answered from a scripted responder file, each decision
//! printed —
//! so a plugin author sees, with no cluster, what the host would do step by step.
//!
//! The model is deliberately small (it is a model, not an API server): an applied child replaces
//! the stored one (keeping its status), gets the namespace, the controller owner reference and
//! the host's policy label; deletes remove; `set-status` replaces the parent's status; Events
//! are printed. A simulated kubelet makes every new Pod Running and Ready with an IP, and
//! every new PersistentVolumeClaim Bound, one step after it is applied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::CliError;
use crate::act::{AppliedObject, POLICY_LABEL};
use crate::capability::credentials::CredentialSource;
use crate::capability::replay::{AppCallScript, ExchangeRound};
use crate::capability::scope::AppCallScope;
use crate::contract::app_call::{CallError, Method, Response};
use crate::contract::exchange::ExchangeError;
use crate::contract::{Action, Child, EventType, KindRef, Observation, Timestamp};
use crate::decide::Plugin;

/// Where the simulation starts the clock when the CR names no time (2026-01-01T00:00:00Z):
/// a fixed time, so two runs of the same inputs print the same decisions.
const START_SECONDS: i64 = 1_767_225_600;

/// How far the clock moves between steps when the plugin asks for no requeue.
const DEFAULT_STEP_MS: u64 = 30_000;

/// What `simulate` was asked to do.
#[derive(Clone, Debug)]
pub struct SimulateRequest {
    /// The parent custom resource (YAML or JSON).
    pub cr: PathBuf,
    /// The scripted app-call answers (YAML), if any.
    pub responses: Option<PathBuf>,
    /// At most this many decisions.
    pub steps: u32,
    /// Print one JSON object per step instead of text.
    pub json: bool,
}

/// The responder file: canned answers to app-calls, by pod and path, and to sessions, by
/// round. The SDK's fake app (`ScriptedAppCall::from_responses`) reads the same file, so one
/// script serves a plugin's native tests and its simulation.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Responses {
    /// One row per pod and path; the last row for a pod and path wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub app_calls: Vec<ResponseRow>,
    /// One row per round of a session (the `exchange` interface), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<SessionRow>,
    /// Values `credentials.read` answers, by Secret and key. Never printed: a decision that
    /// carries one is refused, as on a live host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialRow>,
}

/// A value the simulated plugin may read as a credential.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialRow {
    /// The Secret's name.
    pub secret: String,
    /// Its key.
    pub key: String,
    /// The value.
    pub value: String,
}

impl std::fmt::Debug for CredentialRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CredentialRow({}/{})", self.secret, self.key)
    }
}

impl Responses {
    /// The credential rows as a scripted source.
    fn credential_source(&self) -> CredentialSource {
        CredentialSource::Scripted(std::sync::Arc::new(
            self.credentials
                .iter()
                .map(|row| {
                    (
                        (row.secret.clone(), row.key.clone()),
                        row.value.clone().into_bytes(),
                    )
                })
                .collect(),
        ))
    }
}

/// One round of a session: the bytes the plugin sent since it last read on a connection (none
/// when the server speaks first), and the app's reply, as text or hex. The host's recordings
/// of live sessions write themselves as these rows ([`SessionRow::from_round`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionRow {
    /// The pod's name, or `*` for every pod in the model.
    pub pod: String,
    /// The port as the plugin names it; absent answers on any port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// The bytes sent, as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<String>,
    /// The bytes sent, as hexadecimal (for binary protocols).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_hex: Option<String>,
    /// The reply, as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// The reply, as hexadecimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_hex: Option<String>,
    /// Instead of a reply: `unreachable`, `timeout`, `refused` or `closed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SessionRow {
    /// The row of a recorded round: bytes as text when they are printable UTF-8, else as hex.
    pub fn from_round(round: &ExchangeRound) -> SessionRow {
        let (send, send_hex) = text_or_hex(&round.request);
        let mut row = SessionRow {
            pod: round.pod.clone(),
            port: round.port.clone(),
            send,
            send_hex,
            ..SessionRow::default()
        };
        match &round.reply {
            Ok(reply) => (row.reply, row.reply_hex) = text_or_hex(reply),
            Err(error) => {
                row.error = Some(
                    match error {
                        ExchangeError::Unreachable(_) => "unreachable",
                        ExchangeError::Timeout => "timeout",
                        ExchangeError::Refused(_) => "refused",
                        ExchangeError::Closed => "closed",
                    }
                    .to_owned(),
                )
            }
        }
        row
    }

    fn round(&self, pod: &str) -> Result<ExchangeRound, String> {
        let whose = format!(
            "session row for pod `{}` port `{}`",
            self.pod,
            self.port.as_deref().unwrap_or("*")
        );
        let request = bytes_of(&self.send, &self.send_hex, &whose, "send")?;
        let reply = match self.error.as_deref() {
            None => Ok(bytes_of(&self.reply, &self.reply_hex, &whose, "reply")?),
            Some("unreachable") => Err(ExchangeError::Unreachable("scripted: unreachable".into())),
            Some("timeout") => Err(ExchangeError::Timeout),
            Some("refused") => Err(ExchangeError::Refused("scripted: refused".into())),
            Some("closed") => Err(ExchangeError::Closed),
            Some(other) => {
                return Err(format!(
                    "{whose}: error `{other}` is not one of unreachable, timeout, refused, closed"
                ));
            }
        };
        Ok(ExchangeRound {
            pod: pod.to_owned(),
            port: self.port.clone(),
            request,
            reply,
        })
    }
}

/// Bytes as a row writes them: printable UTF-8 as text, anything else as hex.
fn text_or_hex(bytes: &[u8]) -> (Option<String>, Option<String>) {
    if bytes.is_empty() {
        return (None, None);
    }
    match std::str::from_utf8(bytes) {
        Ok(text)
            if !text
                .chars()
                .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t')) =>
        {
            (Some(text.to_owned()), None)
        }
        _ => (
            None,
            Some(bytes.iter().map(|b| format!("{b:02x}")).collect()),
        ),
    }
}

/// The bytes a row gives as text or as hex (not both); none is no bytes.
fn bytes_of(
    text: &Option<String>,
    hex: &Option<String>,
    whose: &str,
    field: &str,
) -> Result<Vec<u8>, String> {
    match (text, hex) {
        (Some(_), Some(_)) => Err(format!("{whose}: give `{field}` or `{field}Hex`, not both")),
        (Some(text), None) => Ok(text.as_bytes().to_vec()),
        (None, Some(hex)) => from_hex(hex).ok_or_else(|| {
            format!("{whose}: `{field}Hex` is not hexadecimal bytes (two digits per byte)")
        }),
        (None, None) => Ok(Vec::new()),
    }
}

fn from_hex(hex: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// One canned answer. Method and body of the request are not matched.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResponseRow {
    /// The pod's name, or `*` for every pod in the model.
    pub pod: String,
    /// Path and query, as the plugin sends it.
    pub path: String,
    /// HTTP status of the answer (default 200).
    #[serde(default)]
    pub status: Option<u16>,
    /// Body of the answer (default empty).
    #[serde(default)]
    pub body: Option<String>,
    /// Instead of an answer: `unreachable`, `timeout` or `refused`.
    #[serde(default)]
    pub error: Option<String>,
}

impl ResponseRow {
    fn answer(&self) -> Result<Result<Response, CallError>, String> {
        match self.error.as_deref() {
            None => Ok(Ok(Response {
                status: self.status.unwrap_or(200),
                body: self.body.clone().unwrap_or_default(),
            })),
            Some("unreachable") => Ok(Err(CallError::Unreachable(
                self.body
                    .clone()
                    .unwrap_or_else(|| "scripted: unreachable".into()),
            ))),
            Some("timeout") => Ok(Err(CallError::Timeout)),
            Some("refused") => Ok(Err(CallError::Refused(
                self.body
                    .clone()
                    .unwrap_or_else(|| "scripted: refused".into()),
            ))),
            Some(other) => Err(format!(
                "pod `{}` path `{}`: error `{other}` is not one of unreachable, timeout, refused",
                self.pod, self.path
            )),
        }
    }
}

/// One step of the simulation, as printed.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// 1-based.
    pub step: u32,
    /// The observation's time, RFC 3339.
    pub now: String,
    /// Children in the observation.
    pub children: usize,
    /// The app-calls the plugin made: `GET /health on example-0:http`.
    pub app_calls: Vec<String>,
    /// The session rounds the plugin made: `db-0:admin sent 12 bytes, got 3 bytes`.
    pub sessions: Vec<String>,
    /// The decision's actions, one line each, or the refusal.
    pub actions: Vec<String>,
    /// The parent's status after the step, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Requested requeue.
    pub requeue_after_ms: Option<u64>,
    /// The plugin refused or failed: what the host would record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Nothing changed in the model: the plugin is at rest.
    pub converged: bool,
}

/// The in-memory world: the parent and the children it controls.
struct Model {
    parent: Value,
    /// (kind display, name) → (kind, object).
    children: BTreeMap<(String, String), (KindRef, Value)>,
    declared: Vec<KindRef>,
    policy: String,
    next_ip: u32,
    next_uid: u32,
}

impl Model {
    fn namespace(&self) -> String {
        self.parent["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string()
    }

    fn label(&self) -> String {
        format!(
            "{}/{}",
            self.namespace(),
            self.parent["metadata"]["name"].as_str().unwrap_or("?")
        )
    }

    fn observation(&self, now: Timestamp) -> Observation {
        let mut children = Vec::new();
        for kind in &self.declared {
            for ((key, _), (child_kind, object)) in &self.children {
                if *key == kind.to_string() {
                    children.push(Child {
                        kind: child_kind.clone(),
                        object: object.to_string(),
                    });
                }
            }
        }
        Observation {
            parent: self.parent.to_string(),
            children,
            now,
        }
    }

    fn pod_names(&self) -> Vec<String> {
        self.children
            .values()
            .filter(|(kind, _)| kind.group.is_empty() && kind.kind == "Pod")
            .filter_map(|(_, o)| o["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    }

    /// The simulated kubelet and volume binder: new Pods run, new claims bind.
    fn settle(&mut self) {
        for (kind, object) in self.children.values_mut() {
            if !kind.group.is_empty() || object.get("status").is_some() {
                continue;
            }
            match kind.kind.as_str() {
                "Pod" => {
                    self.next_ip += 1;
                    let ip = format!("10.0.{}.{}", self.next_ip / 250, self.next_ip % 250 + 1);
                    let containers: Vec<Value> = object["spec"]["containers"]
                        .as_array()
                        .map(|cs| {
                            cs.iter()
                                .map(|c| json!({"name": c["name"], "image": c["image"], "ready": true, "restartCount": 0, "started": true, "state": {"running": {}}}))
                                .collect()
                        })
                        .unwrap_or_default();
                    object["status"] = json!({
                        "phase": "Running",
                        "podIP": ip,
                        "podIPs": [{"ip": ip}],
                        "conditions": [
                            {"type": "Ready", "status": "True"},
                            {"type": "ContainersReady", "status": "True"},
                        ],
                        "containerStatuses": containers,
                    });
                }
                "PersistentVolumeClaim" => object["status"] = json!({"phase": "Bound"}),
                _ => {}
            }
        }
    }

    /// Carries out one action the way the host would; an error is what the host would refuse.
    fn act(&mut self, action: &Action) -> Result<String, String> {
        match action {
            Action::Apply(text) => {
                let AppliedObject {
                    mut object,
                    api_version,
                    kind: kind_name,
                    name,
                } = AppliedObject::parse(text)?;
                let kind = self
                    .declared
                    .iter()
                    .find(|k| k.matches(&api_version, &kind_name))
                    .cloned()
                    .ok_or_else(|| {
                        format!(
                            "apply {kind_name} {name}: {api_version}/{kind_name} is not a child kind the plugin declared; the host refuses it"
                        )
                    })?;
                let key = (kind.to_string(), name.clone());
                let existing = self.children.get(&key).map(|(_, o)| o.clone());
                let uid = match &existing {
                    Some(old) => old["metadata"]["uid"].clone(),
                    None => {
                        self.next_uid += 1;
                        json!(format!("sim-{:08}", self.next_uid))
                    }
                };
                let metadata = &mut object["metadata"];
                metadata["namespace"] = json!(self.namespace());
                metadata["uid"] = uid;
                metadata["labels"][POLICY_LABEL] = json!(self.policy);
                metadata["ownerReferences"] = json!([{
                    "apiVersion": self.parent["apiVersion"],
                    "kind": self.parent["kind"],
                    "name": self.parent["metadata"]["name"],
                    "uid": self.parent["metadata"]["uid"],
                    "controller": true,
                    "blockOwnerDeletion": true,
                }]);
                if let Some(status) = existing.as_ref().and_then(|o| o.get("status")) {
                    object["status"] = status.clone();
                }
                let verb = if existing.is_some() {
                    "apply"
                } else {
                    "create"
                };
                let changed = existing.as_ref() != Some(&object);
                self.children.insert(key, (kind.clone(), object));
                Ok(format!(
                    "{verb} {} {name}{}",
                    kind.kind,
                    if changed { "" } else { " (unchanged)" }
                ))
            }
            Action::Delete(target) => {
                let key = (target.kind.to_string(), target.name.clone());
                match self.children.remove(&key) {
                    Some(_) => Ok(format!("delete {} {}", target.kind.kind, target.name)),
                    None => Ok(format!(
                        "delete {} {} (absent: nothing to do)",
                        target.kind.kind, target.name
                    )),
                }
            }
            Action::SetStatus(text) => {
                let status: Value = serde_json::from_str(text)
                    .map_err(|e| format!("set-status: the status is not JSON: {e}"))?;
                self.parent["status"] = status;
                Ok("set-status".to_string())
            }
            Action::RecordEvent(event) => Ok(format!(
                "event {} {}: {}",
                match event.event_type {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                },
                event.reason,
                event.message
            )),
        }
    }

    fn script(&self, responses: &Responses) -> Result<AppCallScript, String> {
        let pods = self.pod_names();
        let mut script = Vec::new();
        for row in &responses.app_calls {
            let answer = row.answer()?;
            let targets = if row.pod == "*" {
                pods.clone()
            } else {
                vec![row.pod.clone()]
            };
            for pod in targets {
                script.push((pod, row.path.clone(), answer.clone()));
            }
        }
        let mut rounds = Vec::new();
        for row in &responses.sessions {
            if row.pod == "*" {
                for pod in &pods {
                    rounds.push(row.round(pod)?);
                }
            } else {
                rounds.push(row.round(&row.pod)?);
            }
        }
        Ok(AppCallScript::new(script).with_exchanges(rounds))
    }

    /// Everything that a decision can change, to tell a step that changed nothing.
    fn snapshot(&self) -> Value {
        json!({ "status": self.parent.get("status"), "children": self.children.values().map(|(_, o)| o).collect::<Vec<_>>() })
    }
}

fn read_yaml(path: &Path, what: &str) -> Result<Value, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::Simulate(format!("cannot read the {what} {}: {e}", path.display()))
    })?;
    serde_yaml::from_str(&text).map_err(|e| {
        CliError::Simulate(format!(
            "the {what} {} is not valid YAML or JSON: {e}",
            path.display()
        ))
    })
}

fn timestamp_text(t: &Timestamp) -> String {
    k8s_openapi::jiff::Timestamp::new(t.seconds, 0)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.seconds.to_string())
}

/// Runs the simulation and returns its steps; `print` sees each step as it happens.
pub async fn simulate(
    plugin: &Plugin,
    request: &SimulateRequest,
    mut print: impl FnMut(&Step),
) -> Result<Vec<Step>, CliError> {
    let info = plugin.info();
    let mut parent = read_yaml(&request.cr, "custom resource")?;
    let (api_version, kind) = (
        parent["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        parent["kind"].as_str().unwrap_or_default().to_string(),
    );
    if !info.target.matches(&api_version, &kind) {
        return Err(CliError::Simulate(format!(
            "{} is a {api_version} {kind}, but plugin {} reconciles {} {}; give it a custom resource of that kind",
            request.cr.display(),
            plugin.label(),
            info.target.api_version(),
            info.target.kind
        )));
    }
    if parent["metadata"]["name"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        return Err(CliError::Simulate(format!(
            "{} has no metadata.name; name the custom resource",
            request.cr.display()
        )));
    }
    let metadata = &mut parent["metadata"];
    if metadata["namespace"].as_str().is_none() {
        metadata["namespace"] = json!("default");
    }
    metadata["uid"] = json!("sim-parent");
    if metadata["generation"].as_i64().is_none() {
        metadata["generation"] = json!(1);
    }
    let responses = match &request.responses {
        Some(path) => {
            let value = read_yaml(path, "responder file")?;
            serde_json::from_value::<Responses>(value).map_err(|e| {
                CliError::Simulate(format!(
                    "the responder file {} is not valid: {e}; see `policy-host simulate --help`",
                    path.display()
                ))
            })?
        }
        None => Responses::default(),
    };
    let mut model = Model {
        parent,
        children: BTreeMap::new(),
        declared: info.children.clone(),
        policy: info.name.clone(),
        next_ip: 0,
        next_uid: 0,
    };
    let mut now = Timestamp {
        seconds: START_SECONDS,
        nanoseconds: 0,
    };
    let mut steps = Vec::new();
    for number in 1..=request.steps {
        let script = model.script(&responses).map_err(CliError::Simulate)?;
        let scope = AppCallScope::scripted(model.label(), script.clone())
            .with_credentials(responses.credential_source());
        let observation = model.observation(now);
        let doing = format!("simulating {}", model.label());
        let outcome = plugin.reconcile(&observation, scope, &doing).await;
        let calls: Vec<String> = script
            .calls()
            .iter()
            .map(|c| {
                format!(
                    "{} {} on {}:{}",
                    method_text(&c.method),
                    c.path,
                    c.pod,
                    c.port
                )
            })
            .collect();
        let sessions: Vec<String> = script
            .exchanges()
            .iter()
            .map(|round| {
                format!(
                    "{}:{} sent {} bytes, {}",
                    round.pod,
                    round.port.as_deref().unwrap_or("*"),
                    round.request.len(),
                    match &round.reply {
                        Ok(reply) => format!("got {} bytes", reply.len()),
                        Err(error) => format!("got {error:?}"),
                    }
                )
            })
            .collect();
        let before = model.snapshot();
        let mut step = Step {
            step: number,
            now: timestamp_text(&now),
            children: observation.children.len(),
            app_calls: calls,
            sessions,
            actions: Vec::new(),
            status: None,
            requeue_after_ms: None,
            error: None,
            converged: false,
        };
        match outcome {
            Err(error) => {
                step.error = Some(format!(
                    "{error} (the host would record it as a Warning Event and retry with backoff)"
                ));
            }
            Ok(decision) => {
                step.requeue_after_ms = decision.requeue_after_ms;
                for action in &decision.actions {
                    match model.act(action) {
                        Ok(line) => step.actions.push(line),
                        Err(refusal) => {
                            step.error = Some(format!("the host refuses: {refusal}"));
                            break;
                        }
                    }
                }
            }
        }
        let after = model.snapshot();
        if before["status"] != after["status"] {
            step.status = model.parent.get("status").cloned();
        }
        step.converged = step.error.is_none() && before == after;
        let stop = step.converged || step.error.is_some();
        let advance = step.requeue_after_ms.unwrap_or(DEFAULT_STEP_MS);
        print(&step);
        steps.push(step);
        if stop {
            break;
        }
        model.settle();
        let millis = i64::try_from(advance).unwrap_or(i64::MAX);
        now.seconds = now.seconds.saturating_add(millis / 1000);
    }
    Ok(steps)
}

fn method_text(method: &Method) -> &'static str {
    match method {
        Method::Get => "GET",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
    }
}

/// A step as text: the header, then one indented line per app-call and action.
pub fn step_text(step: &Step) -> String {
    let mut text = format!(
        "step {} at {} ({} children observed)\n",
        step.step, step.now, step.children
    );
    for call in &step.app_calls {
        text.push_str(&format!("  app-call  {call}\n"));
    }
    for round in &step.sessions {
        text.push_str(&format!("  session   {round}\n"));
    }
    for action in &step.actions {
        text.push_str(&format!("  {action}\n"));
    }
    if let Some(status) = &step.status {
        text.push_str(&format!("  status    {status}\n"));
    }
    if let Some(error) = &step.error {
        text.push_str(&format!("  ERROR     {error}\n"));
    }
    match (step.converged, step.requeue_after_ms) {
        (true, _) => text.push_str("  converged: this decision changes nothing\n"),
        (false, Some(ms)) => text.push_str(&format!("  requeue after {ms} ms\n")),
        (false, None) => {}
    }
    text
}
