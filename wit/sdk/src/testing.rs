//! A native test harness for decision logic: build observations, run a [`Plugin`] against a
//! scripted app, inspect the decision, and play the host's part ([`Harness::act`]) to check
//! that a plugin converges and stays put.
//!
//! Everything here is a fake for pure-logic tests: [`ScriptedAppCall`] answers from a
//! script, not from the app, and [`Harness::act`] applies a decision the simplest way (no
//! server-side apply merge, no defaulting, no other controllers). Prove behaviour against
//! real processes in end-to-end tests.
//!
//! One fake answers both doors: HTTP app-calls by pod and path, and sessions (and exchanges)
//! by *rounds*, as the host's own script does in `policy-host simulate` and shadow mode. A
//! round is the bytes the plugin sent on a connection since it last read (none: the server
//! speaks first) and the reply the app gives; [`ScriptedAppCall::from_responses`] reads the
//! responder file `simulate` reads, so one script serves a native test and a simulation.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::Plugin;
use crate::app_call::AppCall;
use crate::contract::{
    Action, AppCallError, AppCallRequest, AppCallResponse, Child, Decision, Event,
    FinalizeDecision, KindRef, Method, Observation, PolicyError, Timestamp,
};
use crate::credentials::{Credential, CredentialError};
use crate::exchange::ExchangeError;
use crate::session::{Connection, Session};

/// Builds an [`Observation`] the way the host would hand it over.
#[derive(Clone, Debug)]
pub struct ObservationBuilder {
    parent: Value,
    children: Vec<Child>,
    now: Timestamp,
}

/// Starts an observation of `parent` (the whole custom resource as JSON), with no children,
/// at 2023-11-14T22:13:20Z.
pub fn observation(parent: Value) -> ObservationBuilder {
    ObservationBuilder {
        parent,
        children: Vec::new(),
        now: Timestamp {
            seconds: 1_700_000_000,
            nanoseconds: 0,
        },
    }
}

impl ObservationBuilder {
    /// Adds a child of `kind`.
    pub fn child(mut self, kind: &KindRef, object: Value) -> Self {
        self.children.push(Child {
            kind: kind.clone(),
            object: object.to_string(),
        });
        self
    }

    /// Sets the observation's clock, in seconds since the Unix epoch.
    pub fn at(mut self, seconds: i64) -> Self {
        self.now = Timestamp {
            seconds,
            nanoseconds: 0,
        };
        self
    }

    /// The observation.
    pub fn build(self) -> Observation {
        Observation {
            parent: self.parent.to_string(),
            children: self.children,
            now: self.now,
        }
    }
}

/// A fake app for pure-logic tests: answers each `(method, pod, path)` from a script, answers
/// sessions round by round ([`SessionRound`]), and records every request and round. An
/// unscripted request, or a session with a pod and port no round names, is `Unreachable`, like
/// a pod that is not up.
///
/// Clones share the session rounds (which were answered, and the log), as connections of one
/// app would.
#[derive(Clone, Debug, Default)]
pub struct ScriptedAppCall {
    script: HashMap<(Method, String, String), Result<AppCallResponse, AppCallError>>,
    /// `(pod or "*", path)` → answer, whatever the method (the responder file's rows).
    any_method: HashMap<(String, String), Result<AppCallResponse, AppCallError>>,
    sessions: Rc<RefCell<ScriptedSessions>>,
    /// Credentials by `(secret, key)`.
    credentials: HashMap<(String, String), Credential>,
    /// Every request received, in order.
    pub requests: Vec<AppCallRequest>,
}

impl ScriptedAppCall {
    /// An app that answers nothing (every request is `Unreachable`).
    pub fn new() -> Self {
        ScriptedAppCall::default()
    }

    /// Answers `method path` on `pod` with `status` and `body`, every time it is asked.
    pub fn respond(
        mut self,
        method: Method,
        pod: &str,
        path: &str,
        status: u16,
        body: Value,
    ) -> Self {
        let response = AppCallResponse {
            status,
            body: body.to_string(),
        };
        self.script
            .insert((method, pod.to_owned(), path.to_owned()), Ok(response));
        self
    }

    /// Fails `method path` on `pod` with `error`, every time it is asked.
    pub fn fail(mut self, method: Method, pod: &str, path: &str, error: AppCallError) -> Self {
        self.script
            .insert((method, pod.to_owned(), path.to_owned()), Err(error));
        self
    }

    /// Adds session rounds: on a session with `round.port` of `round.pod`, the bytes
    /// `round.request` sent since the last read are answered with `round.reply`.
    pub fn rounds(self, rounds: impl IntoIterator<Item = SessionRound>) -> Self {
        {
            let mut sessions = self.sessions.borrow_mut();
            for round in rounds {
                sessions.rounds.push(round);
                sessions.used.push(false);
            }
        }
        self
    }

    /// The server of `port` on `pod` speaks first: a new session reads `greeting` before
    /// sending anything.
    pub fn greets(self, pod: &str, port: &str, greeting: impl AsRef<[u8]>) -> Self {
        self.rounds([SessionRound::new(pod, port, b"", greeting)])
    }

    /// On a session with `port` of `pod`, `request` (all the bytes sent since the last read) is
    /// answered with `reply`.
    pub fn answers(
        self,
        pod: &str,
        port: &str,
        request: impl AsRef<[u8]>,
        reply: impl AsRef<[u8]>,
    ) -> Self {
        self.rounds([SessionRound::new(pod, port, request, reply)])
    }

    /// Hands out `value` for `key` of the Secret `secret`, as a host whose admin granted it
    /// would. An unscripted credential is refused, like an ungranted one.
    pub fn with_credential(mut self, secret: &str, key: &str, value: impl Into<Vec<u8>>) -> Self {
        self.credentials
            .insert((secret.to_owned(), key.to_owned()), Credential::new(value));
        self
    }

    /// The session rounds answered so far (through any clone), in order, with their replies.
    pub fn session_log(&self) -> Vec<SessionRound> {
        self.sessions.borrow().log.clone()
    }

    /// A fake from a responder file as `policy-host simulate --responses` reads it, given as
    /// JSON (YAML is a superset: a JSON responder file serves both):
    ///
    /// ```json
    /// { "appCalls": [ { "pod": "*", "path": "/health", "status": 200, "body": "{}" } ],
    ///   "sessions": [ { "pod": "db-0", "port": "admin", "reply": "HELLO 42\n" },
    ///                 { "pod": "db-0", "port": "admin", "send": "AUTH x\n", "reply": "OK\n" },
    ///                 { "pod": "db-1", "sendHex": "0100", "error": "closed" } ] }
    /// ```
    ///
    /// `appCalls` rows answer whatever the method; `pod: "*"` is every pod. `sessions` rows are
    /// rounds: `send`/`sendHex` the bytes sent since the last read (absent: the server speaks
    /// first), `reply`/`replyHex` the answer, or `error` (`unreachable`, `timeout`, `refused`,
    /// `closed`); without `port` a row answers on any port. A `credentials` section
    /// (`[{ "secret": "db-credentials", "key": "password", "value": "..." }]`) holds the
    /// values [`AppCall::credential`] hands out.
    pub fn from_responses(json: &str) -> Result<Self, String> {
        let responses: Responses = serde_json::from_str(json)
            .map_err(|e| format!("the responder file is not valid: {e}"))?;
        let mut app = ScriptedAppCall::new();
        for row in responses.app_calls {
            let answer = match row.error.as_deref() {
                None => Ok(AppCallResponse {
                    status: row.status.unwrap_or(200),
                    body: row.body.unwrap_or_default(),
                }),
                Some(error) => Err(match error {
                    "unreachable" => AppCallError::Unreachable(
                        row.body.unwrap_or_else(|| "scripted: unreachable".into()),
                    ),
                    "timeout" => AppCallError::Timeout,
                    "refused" => AppCallError::Refused(
                        row.body.unwrap_or_else(|| "scripted: refused".into()),
                    ),
                    other => {
                        return Err(format!(
                            "pod `{}` path `{}`: error `{other}` is not one of unreachable, timeout, refused",
                            row.pod, row.path
                        ));
                    }
                }),
            };
            app.any_method.insert((row.pod, row.path), answer);
        }
        for row in responses.credentials {
            app = app.with_credential(&row.secret, &row.key, row.value);
        }
        let rounds = responses
            .sessions
            .into_iter()
            .map(SessionRow::into_round)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(app.rounds(rounds))
    }
}

/// One round of a session: the bytes the plugin sent since it last read, and the app's answer.
/// The unit the fake, `policy-host simulate` and the host's recordings share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRound {
    /// The pod, or `*` for any pod.
    pub pod: String,
    /// The port as the plugin names it; `None` answers on any port.
    pub port: Option<String>,
    /// The bytes sent since the last read; empty when the server speaks first.
    pub request: Vec<u8>,
    /// The reply, or why there is none.
    pub reply: Result<Vec<u8>, ExchangeError>,
}

impl SessionRound {
    /// `request` on `port` of `pod` is answered with `reply`.
    pub fn new(pod: &str, port: &str, request: impl AsRef<[u8]>, reply: impl AsRef<[u8]>) -> Self {
        SessionRound {
            pod: pod.to_owned(),
            port: Some(port.to_owned()),
            request: request.as_ref().to_vec(),
            reply: Ok(reply.as_ref().to_vec()),
        }
    }

    /// `request` on `port` of `pod` fails with `error`.
    pub fn failing(pod: &str, port: &str, request: impl AsRef<[u8]>, error: ExchangeError) -> Self {
        SessionRound {
            pod: pod.to_owned(),
            port: Some(port.to_owned()),
            request: request.as_ref().to_vec(),
            reply: Err(error),
        }
    }

    fn is_for(&self, pod: &str, port: &str) -> bool {
        (self.pod == "*" || self.pod == pod) && self.port.as_deref().is_none_or(|p| p == port)
    }
}

/// The responder file (`policy-host simulate --responses`): what the fake reads of it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Responses {
    #[serde(default)]
    app_calls: Vec<AppCallRow>,
    #[serde(default)]
    sessions: Vec<SessionRow>,
    #[serde(default)]
    credentials: Vec<CredentialRow>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CredentialRow {
    secret: String,
    key: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AppCallRow {
    pod: String,
    path: String,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SessionRow {
    pod: String,
    #[serde(default)]
    port: Option<String>,
    #[serde(default)]
    send: Option<String>,
    #[serde(default)]
    send_hex: Option<String>,
    #[serde(default)]
    reply: Option<String>,
    #[serde(default)]
    reply_hex: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

impl SessionRow {
    fn into_round(self) -> Result<SessionRound, String> {
        let whose = format!(
            "session row for pod `{}` port `{}`",
            self.pod,
            self.port.as_deref().unwrap_or("*")
        );
        let request = bytes_of(self.send, self.send_hex, &whose, "send")?;
        let reply = match self.error.as_deref() {
            None => Ok(bytes_of(self.reply, self.reply_hex, &whose, "reply")?),
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
        Ok(SessionRound {
            pod: self.pod,
            port: self.port,
            request,
            reply,
        })
    }
}

/// The bytes a row gives as text or as hex (not both).
fn bytes_of(
    text: Option<String>,
    hex: Option<String>,
    whose: &str,
    field: &str,
) -> Result<Vec<u8>, String> {
    match (text, hex) {
        (Some(_), Some(_)) => Err(format!("{whose}: give `{field}` or `{field}Hex`, not both")),
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(hex)) => from_hex(&hex).ok_or_else(|| {
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

/// The session rounds of a [`ScriptedAppCall`], shared by its connections.
#[derive(Debug, Default)]
struct ScriptedSessions {
    rounds: Vec<SessionRound>,
    /// Which rounds were answered already: the same request twice gets the second answer the
    /// second time, as in the host's replay.
    used: Vec<bool>,
    log: Vec<SessionRound>,
}

impl ScriptedSessions {
    /// The first unused round for this pod, port and request, else the last such (as the
    /// host's `AppCallScript` answers).
    fn answer(&mut self, pod: &str, port: &str, request: &[u8]) -> Result<Vec<u8>, ExchangeError> {
        let equal: Vec<usize> = self
            .rounds
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_for(pod, port) && r.request == request)
            .map(|(i, _)| i)
            .collect();
        let chosen = equal
            .iter()
            .copied()
            .find(|&i| !self.used[i])
            .or_else(|| equal.last().copied());
        let reply = match chosen {
            Some(index) => {
                self.used[index] = true;
                self.rounds[index].reply.clone()
            }
            None => Err(ExchangeError::Unreachable(format!(
                "no scripted round with pod `{pod}` port `{port}` for the {} bytes sent ({:?})",
                request.len(),
                String::from_utf8_lossy(request)
            ))),
        };
        self.log.push(SessionRound {
            pod: pod.to_owned(),
            port: Some(port.to_owned()),
            request: request.to_vec(),
            reply: reply.clone(),
        });
        reply
    }
}

/// One scripted session: rounds as the host's scripted connection plays them.
struct ScriptedConnection {
    pod: String,
    port: String,
    sessions: Rc<RefCell<ScriptedSessions>>,
    /// Bytes sent in the current round.
    request: Vec<u8>,
    /// Bytes of the current round's reply already read.
    replied: usize,
    /// The current round's reply not yet read; `None` until the plugin first reads.
    pending: Option<VecDeque<u8>>,
}

impl Connection for ScriptedConnection {
    fn send(&mut self, bytes: &[u8]) -> Result<(), ExchangeError> {
        if self.replied > 0 {
            self.request.clear();
            self.replied = 0;
        }
        self.pending = None;
        self.request.extend_from_slice(bytes);
        Ok(())
    }

    fn receive(&mut self, max_bytes: u32, _timeout_ms: u32) -> Result<Vec<u8>, ExchangeError> {
        if self.pending.is_none() {
            let reply = self
                .sessions
                .borrow_mut()
                .answer(&self.pod, &self.port, &self.request);
            match reply {
                Ok(reply) => self.pending = Some(reply.into()),
                Err(error) => {
                    self.request.clear();
                    return Err(error);
                }
            }
        }
        match &mut self.pending {
            // Past the scripted reply the app says nothing more, as a live one would.
            Some(bytes) if !bytes.is_empty() => {
                let n = (max_bytes as usize).clamp(1, bytes.len());
                self.replied += n;
                Ok(bytes.drain(..n).collect())
            }
            _ => Err(ExchangeError::Timeout),
        }
    }
}

impl AppCall for ScriptedAppCall {
    fn call(&mut self, request: &AppCallRequest) -> Result<AppCallResponse, AppCallError> {
        self.requests.push(request.clone());
        let key = (request.method, request.pod.clone(), request.path.clone());
        let answer = self.script.get(&key).or_else(|| {
            self.any_method
                .get(&(request.pod.clone(), request.path.clone()))
                .or_else(|| self.any_method.get(&("*".to_owned(), request.path.clone())))
        });
        answer.cloned().unwrap_or_else(|| {
            Err(AppCallError::Unreachable(format!(
                "no scripted response for {:?} {} on {}",
                request.method, request.path, request.pod
            )))
        })
    }

    fn credential(&mut self, secret: &str, key: &str) -> Result<Credential, CredentialError> {
        self.credentials
            .get(&(secret.to_owned(), key.to_owned()))
            .cloned()
            .ok_or_else(|| {
                CredentialError::Refused(format!(
                    "no scripted credential for Secret `{secret}` key `{key}`"
                ))
            })
    }

    fn connect(&mut self, pod: &str, port: &str) -> Result<Session, ExchangeError> {
        if !self
            .sessions
            .borrow()
            .rounds
            .iter()
            .any(|r| r.is_for(pod, port))
        {
            return Err(ExchangeError::Unreachable(format!(
                "no scripted session with pod `{pod}` port `{port}`"
            )));
        }
        Ok(Session::new(
            pod,
            port,
            Box::new(ScriptedConnection {
                pod: pod.to_owned(),
                port: port.to_owned(),
                sessions: Rc::clone(&self.sessions),
                request: Vec::new(),
                replied: 0,
                pending: None,
            }),
        ))
    }
}

/// A closure is an app too: for a fake whose answers depend on earlier requests or on a
/// model of the app, which a fixed script cannot express.
impl<F> AppCall for F
where
    F: FnMut(&AppCallRequest) -> Result<AppCallResponse, AppCallError>,
{
    fn call(&mut self, request: &AppCallRequest) -> Result<AppCallResponse, AppCallError> {
        self(request)
    }
}

/// Runs a [`Plugin`] natively, as the host would, against a fake app: a [`ScriptedAppCall`]
/// by default, or any [`AppCall`] (a model of the app that keeps state between requests).
#[derive(Debug, Default)]
pub struct Harness<P, A = ScriptedAppCall> {
    /// The fake app the plugin talks to; inspect `app.requests` or `app.session_log()` after a
    /// call.
    pub app: A,
    plugin: std::marker::PhantomData<P>,
}

impl<P: Plugin> Harness<P> {
    /// A harness whose app answers nothing.
    pub fn new() -> Self {
        Harness::with_app(ScriptedAppCall::new())
    }
}

impl<P: Plugin, A: AppCall> Harness<P, A> {
    /// A harness whose app is `app`.
    pub fn with_app(app: A) -> Self {
        Harness {
            app,
            plugin: std::marker::PhantomData,
        }
    }

    /// Calls the plugin's `reconcile`. Panics when the decision reports a metric sample the
    /// host would refuse (not declared in [`Plugin::metrics`], or with other labels): that is
    /// a bug in the plugin, and the host would drop the sample.
    pub fn reconcile(&mut self, observation: &Observation) -> Result<Decision, PolicyError> {
        let decision = P::reconcile(observation, &mut self.app)?;
        if let Err(why) = crate::metrics::check(&P::metrics(), &decision.metrics) {
            panic!("the host would refuse a metric sample of this decision: {why}");
        }
        Ok(decision)
    }

    /// Calls the plugin's `finalize`.
    pub fn finalize(&mut self, observation: &Observation) -> Result<FinalizeDecision, PolicyError> {
        P::finalize(observation, &mut self.app)
    }

    /// Plays the host: the observation after `decision` was carried out. Applied children
    /// replace same-named ones of their kind (only kinds the plugin declared: any other is
    /// a panic, as the host would refuse it), deletes remove, and a status replaces the
    /// parent's. Events are dropped.
    pub fn act(&self, observation: &Observation, decision: &Decision) -> Observation {
        let declared = P::describe().children;
        let mut parent: Value = serde_json::from_str(&observation.parent).unwrap_or(Value::Null);
        let mut children = observation.children.clone();
        for action in &decision.actions {
            match action {
                Action::Apply(object) => {
                    let api_version = object["apiVersion"].as_str().unwrap_or_default();
                    let kind_name = object["kind"].as_str().unwrap_or_default();
                    let Some(kind) = declared
                        .iter()
                        .find(|k| k.api_version() == api_version && k.kind == kind_name)
                    else {
                        panic!(
                            "the plugin applied a {api_version} {kind_name} it did not declare in describe().children; the host refuses it"
                        )
                    };
                    let name = object["metadata"]["name"].as_str().unwrap_or_default();
                    children.retain(|c| {
                        !(c.kind.is(&kind.group, &kind.kind) && c.name().as_deref() == Some(name))
                    });
                    children.push(Child {
                        kind: kind.clone(),
                        object: object.to_string(),
                    });
                }
                Action::Delete { kind, name } => children.retain(|c| {
                    !(c.kind.is(&kind.group, &kind.kind) && c.name().as_deref() == Some(name))
                }),
                Action::SetStatus(status) => {
                    if let Some(parent) = parent.as_object_mut() {
                        parent.insert("status".to_owned(), status.clone());
                    }
                }
                Action::RecordEvent(_) => {}
            }
        }
        Observation {
            parent: parent.to_string(),
            children,
            now: observation.now,
        }
    }

    /// Reconciles and carries out decisions until one has nothing left to apply, delete or
    /// change in status, at most `rounds` times; returns the settled observation. Panics
    /// (naming the last decision) if the plugin has not settled by then, or refuses.
    pub fn converge(&mut self, observation: &Observation, rounds: usize) -> Observation {
        let mut current = observation.clone();
        for _ in 0..rounds {
            let decision = match self.reconcile(&current) {
                Ok(decision) => decision,
                Err(e) => panic!("the plugin refused while converging: {e}"),
            };
            let next = self.act(&current, &decision);
            if same_state(&next, &current) {
                return current;
            }
            current = next;
        }
        panic!("the plugin did not settle within {rounds} reconciles: {current:?}")
    }
}

/// Parent and children equal as JSON (key order and child order ignored).
fn same_state(a: &Observation, b: &Observation) -> bool {
    let state = |o: &Observation| {
        let parent: Value = serde_json::from_str(&o.parent).unwrap_or(Value::Null);
        let mut children: Vec<Value> = o
            .children
            .iter()
            .map(|c| {
                json!([
                    c.kind.kind,
                    serde_json::from_str::<Value>(&c.object).unwrap_or(Value::Null)
                ])
            })
            .collect();
        children.sort_by_key(|c| c.to_string());
        (parent, children)
    };
    state(a) == state(b)
}

impl Decision {
    /// The object applied with this `kind` and `metadata.name`, if any.
    pub fn applied(&self, kind: &str, name: &str) -> Option<&Value> {
        self.actions.iter().find_map(|a| match a {
            Action::Apply(o) if o["kind"] == kind && o["metadata"]["name"] == name => Some(o),
            _ => None,
        })
    }

    /// Names of the deleted children of this `kind`.
    pub fn deleted(&self, kind: &str) -> Vec<&str> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { kind: k, name } if k.kind == kind => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The last status set, if any.
    pub fn status(&self) -> Option<&Value> {
        self.actions.iter().rev().find_map(|a| match a {
            Action::SetStatus(s) => Some(s),
            _ => None,
        })
    }

    /// The events recorded.
    pub fn events(&self) -> Vec<&Event> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::RecordEvent(e) => Some(e),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::frames;

    #[test]
    fn the_fake_hands_out_scripted_credentials_only_and_never_prints_them() {
        let json = r#"{ "credentials": [
            { "secret": "db-credentials", "key": "password", "value": "from-the-file" } ] }"#;
        let mut app = ScriptedAppCall::from_responses(json)
            .expect("a responder file")
            .with_credential("db-credentials", "replication", "by-hand");
        let password = app
            .credential("db-credentials", "password")
            .expect("scripted");
        assert_eq!(password.as_str(), Some("from-the-file"));
        let replication = app
            .credential("db-credentials", "replication")
            .expect("scripted");
        assert_eq!(replication.as_bytes(), b"by-hand");
        assert!(!format!("{password:?}").contains("from-the-file"));
        assert!(matches!(
            app.credential("other", "password"),
            Err(CredentialError::Refused(_))
        ));
    }

    /// The rounds the host's script plays (`capability/exchange.rs`), so a recording replays
    /// the same in both.
    #[test]
    fn scripted_sessions_play_rounds_as_the_host_does() {
        let app = ScriptedAppCall::new()
            .greets("db-0", "admin", "HI\n")
            .answers("db-0", "admin", "A\nB\n", "AB\n")
            .answers("db-0", "admin", "PING\n", "PONG 1\n")
            .answers("db-0", "admin", "PING\n", "PONG 2\n");
        let mut client = app.clone();
        let mut session = client.connect("db-0", "admin").expect("connects");
        assert_eq!(
            session.receive_frame(frames::line).as_deref(),
            Ok(&b"HI\n"[..]),
            "the server speaks first: the round with nothing sent"
        );
        session.send(b"A\n").expect("sends");
        assert_eq!(
            session.request(b"B\n", frames::line).as_deref(),
            Ok(&b"AB\n"[..]),
            "two sends before a read are one round"
        );
        for expected in ["PONG 1\n", "PONG 2\n", "PONG 2\n"] {
            assert_eq!(
                session.request(b"PING\n", frames::line).as_deref(),
                Ok(expected.as_bytes()),
                "the same request gets the next unused answer, then the last"
            );
        }
        assert_eq!(
            session.receive_frame(frames::line),
            Err(ExchangeError::Timeout),
            "past its reply the app says nothing more"
        );
        assert!(
            matches!(session.request(b"QUIT\n", frames::line), Err(ExchangeError::Unreachable(m)) if m.contains("no scripted round")),
            "an unscripted round"
        );
        assert_eq!(app.session_log().len(), 6, "clones share the log");
        assert!(matches!(
            client.connect("db-1", "admin"),
            Err(ExchangeError::Unreachable(_))
        ));
    }

    #[test]
    fn the_responder_file_answers_app_calls_by_pod_and_path_whatever_the_method() {
        let mut app = ScriptedAppCall::from_responses(
            r#"{ "appCalls": [ { "pod": "*", "path": "/health", "body": "ok" },
                               { "pod": "db-1", "path": "/health", "error": "timeout" } ],
                 "sessions": [ { "pod": "*", "sendHex": "0102", "replyHex": "ff" } ] }"#,
        )
        .expect("parses");
        assert_eq!(
            app.get("db-0", "http", "/health").map(|r| r.body),
            Ok("ok".to_owned())
        );
        assert_eq!(
            app.get("db-1", "http", "/health"),
            Err(AppCallError::Timeout)
        );
        let mut session = app.connect("db-7", "any").expect("any pod, any port");
        assert_eq!(
            session.request(&[1, 2], |b| Some(b.len()).filter(|&n| n > 0)),
            Ok(vec![0xff])
        );

        let refused = [
            r#"{ "sessions": [ { "pod": "a", "send": "x", "sendHex": "78" } ] }"#,
            r#"{ "sessions": [ { "pod": "a", "replyHex": "7" } ] }"#,
            r#"{ "sessions": [ { "pod": "a", "error": "gone" } ] }"#,
            r#"{ "exchanges": [] }"#,
        ];
        for text in refused {
            assert!(ScriptedAppCall::from_responses(text).is_err(), "{text}");
        }
    }
}
