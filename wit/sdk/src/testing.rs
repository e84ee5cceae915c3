//! A native test harness for decision logic: build observations, run a [`Plugin`] against a
//! scripted app, inspect the decision, and play the host's part ([`Harness::act`]) to check
//! that a plugin converges and stays put.
//!
//! Everything here is a fake for pure-logic tests: [`ScriptedAppCall`] answers from a
//! script, not from the app, and [`Harness::act`] applies a decision the simplest way (no
//! server-side apply merge, no defaulting, no other controllers). Prove behaviour against
//! real processes in end-to-end tests.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::Plugin;
use crate::app_call::AppCall;
use crate::contract::{
    Action, AppCallError, AppCallRequest, AppCallResponse, Child, Decision, Event,
    FinalizeDecision, KindRef, Method, Observation, PolicyError, Timestamp,
};

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

/// A fake app for pure-logic tests: answers each `(method, pod, path)` from a script and
/// records every request. An unscripted request is `Unreachable`, like a pod that is not up.
#[derive(Clone, Debug, Default)]
pub struct ScriptedAppCall {
    script: HashMap<(Method, String, String), Result<AppCallResponse, AppCallError>>,
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
}

impl AppCall for ScriptedAppCall {
    fn call(&mut self, request: &AppCallRequest) -> Result<AppCallResponse, AppCallError> {
        self.requests.push(request.clone());
        let key = (request.method, request.pod.clone(), request.path.clone());
        self.script.get(&key).cloned().unwrap_or_else(|| {
            Err(AppCallError::Unreachable(format!(
                "no scripted response for {:?} {} on {}",
                request.method, request.path, request.pod
            )))
        })
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

/// Runs a [`Plugin`] natively, as the host would, against a [`ScriptedAppCall`].
#[derive(Debug, Default)]
pub struct Harness<P> {
    /// The fake app the plugin talks to; inspect `app.requests` after a call.
    pub app: ScriptedAppCall,
    plugin: std::marker::PhantomData<P>,
}

impl<P: Plugin> Harness<P> {
    /// A harness whose app answers nothing.
    pub fn new() -> Self {
        Harness::with_app(ScriptedAppCall::new())
    }

    /// A harness whose app answers from `app`.
    pub fn with_app(app: ScriptedAppCall) -> Self {
        Harness {
            app,
            plugin: std::marker::PhantomData,
        }
    }

    /// Calls the plugin's `reconcile`.
    pub fn reconcile(&mut self, observation: &Observation) -> Result<Decision, PolicyError> {
        P::reconcile(observation, &mut self.app)
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
