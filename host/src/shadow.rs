//! Shadow mode: a candidate plugin decides on the same observation as the active plugin of its
//! kind, its app-calls answered from the active run's recorded answers, and the two decisions
//! are compared. Only the active decision is ever carried out; the candidate has no side
//! effect but a metric, a log line and, when it disagrees, an Event with a short diff.
//!
//! Promoting a candidate is one field: `data.mode: active` in its ConfigMap
//! ([`crate::load::config_maps`]).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::capability::replay::AppCallRecorder;
use crate::capability::scope::AppCallScope;
use crate::contract::{Action, Decision, Observation};
use crate::decide::{DecideError, Plugin};

/// The longest diff text a report carries (an Event note holds 1 kB).
const DIFF_LIMIT: usize = 600;

/// A decision reduced to what is compared: each action as JSON (objects parsed, so key order
/// and whitespace do not count), the requeue, or the refusal.
#[derive(Clone, Debug, PartialEq)]
pub struct ComparableDecision(Result<Value, String>);

impl ComparableDecision {
    /// The comparable form of a plugin's outcome.
    pub fn of(outcome: &Result<Decision, DecideError>) -> Self {
        Self(match outcome {
            Ok(decision) => Ok(json!({
                "actions": decision.actions.iter().map(action_json).collect::<Vec<_>>(),
                "requeueAfterMs": decision.requeue_after_ms,
            })),
            // The plugin's own words, not the host's (which name the version and the run).
            Err(DecideError::Refused {
                reason, message, ..
            }) => Err(format!("{reason}: {message}")),
            Err(error) => Err(error.reason().to_string()),
        })
    }
}

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

fn action_json(action: &Action) -> Value {
    match action {
        Action::Apply(object) => json!({ "apply": parsed(object) }),
        Action::Delete(target) => {
            json!({ "delete": format!("{} {}", target.kind.kind, target.name) })
        }
        Action::SetStatus(status) => json!({ "setStatus": parsed(status) }),
        Action::RecordEvent(event) => json!({ "event": {
            "type": format!("{:?}", event.event_type),
            "reason": event.reason,
            "message": event.message,
        }}),
    }
}

/// How a candidate's decision compares with the active one's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// The same actions, in the same order, and the same requeue.
    Same,
    /// They differ; the text says where first, e.g.
    /// `action 2 (set-status): .pluginVersion: "0.1.0" → "0.2.0"`.
    Different(String),
}

/// Compares the active plugin's decision with the candidate's, and the app-calls each made.
pub fn compare(
    active: &ComparableDecision,
    candidate: &ComparableDecision,
    active_calls: usize,
    candidate_unanswered: &[String],
) -> Comparison {
    let mut diff = decision_diff(&active.0, &candidate.0).unwrap_or_default();
    if !candidate_unanswered.is_empty() {
        if !diff.is_empty() {
            diff.push_str("; ");
        }
        let _ = write!(
            diff,
            "the candidate made app-calls the active run ({active_calls} calls) did not, answered `unreachable`: {}",
            candidate_unanswered.join(", ")
        );
    }
    if diff.is_empty() {
        Comparison::Same
    } else {
        Comparison::Different(clip(diff))
    }
}

fn decision_diff(
    active: &Result<Value, String>,
    candidate: &Result<Value, String>,
) -> Option<String> {
    match (active, candidate) {
        (Ok(a), Ok(c)) => {
            let empty = Vec::new();
            let a_actions = a["actions"].as_array().unwrap_or(&empty);
            let c_actions = c["actions"].as_array().unwrap_or(&empty);
            for index in 0..a_actions.len().max(c_actions.len()) {
                match (a_actions.get(index), c_actions.get(index)) {
                    (Some(x), Some(y)) if x == y => continue,
                    (Some(x), Some(y)) if summary(x) == summary(y) => {
                        let (path, from, to) = first_difference(x, y, String::new())?;
                        // The first path segment is the action's own wrapper (`.apply`).
                        let path = path.split_once('.').map_or(path.clone(), |(_, rest)| {
                            rest.find(['.', '['])
                                .map_or(String::new(), |i| rest[i..].to_string())
                        });
                        return Some(format!(
                            "action {} ({}): {}: {} → {}",
                            index + 1,
                            summary(x),
                            if path.is_empty() { "." } else { &path },
                            snippet(&from),
                            snippet(&to)
                        ));
                    }
                    (x, y) => {
                        return Some(format!(
                            "action {}: active {}, candidate {} ({} vs {} actions)",
                            index + 1,
                            x.map_or("has none".to_string(), summary),
                            y.map_or("has none".to_string(), summary),
                            a_actions.len(),
                            c_actions.len()
                        ));
                    }
                }
            }
            (a["requeueAfterMs"] != c["requeueAfterMs"]).then(|| {
                format!(
                    "requeue: active {}, candidate {}",
                    requeue_text(&a["requeueAfterMs"]),
                    requeue_text(&c["requeueAfterMs"])
                )
            })
        }
        (Ok(_), Err(refusal)) => Some(format!("the candidate refused to decide: {refusal}")),
        (Err(refusal), Ok(c)) => Some(format!(
            "the active plugin refused ({refusal}) but the candidate decided {} action(s)",
            c["actions"].as_array().map_or(0, Vec::len)
        )),
        (Err(a), Err(c)) if a == c => None,
        (Err(a), Err(c)) => Some(format!(
            "both refused, differently: active {a}; candidate {c}"
        )),
    }
}

fn requeue_text(value: &Value) -> String {
    value
        .as_u64()
        .map_or("none".to_string(), |ms| format!("after {ms} ms"))
}

/// `apply Pod ex-1`, `set-status`, `delete Service ex`, `event MemberAdded`.
fn summary(action: &Value) -> String {
    if let Some(object) = action.get("apply") {
        let kind = object["kind"].as_str().unwrap_or("?");
        let name = object["metadata"]["name"].as_str().unwrap_or("?");
        format!("apply {kind} {name}")
    } else if let Some(target) = action.get("delete") {
        format!("delete {}", target.as_str().unwrap_or("?"))
    } else if action.get("setStatus").is_some() {
        "set-status".to_string()
    } else if let Some(event) = action.get("event") {
        format!("event {}", event["reason"].as_str().unwrap_or("?"))
    } else {
        action.to_string()
    }
}

/// The first path at which `a` and `b` differ (depth first, keys in order), with both values
/// there (`null` for an absent key).
fn first_difference(a: &Value, b: &Value, path: String) -> Option<(String, Value, Value)> {
    match (a, b) {
        _ if a == b => None,
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|key| {
                let (xa, ya) = (
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                );
                first_difference(xa, ya, format!("{path}.{key}"))
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (xa, ya))| first_difference(xa, ya, format!("{path}[{i}]"))),
        _ => Some((path, a.clone(), b.clone())),
    }
}

fn snippet(value: &Value) -> String {
    let text = value.to_string();
    if text.len() <= 80 {
        return text;
    }
    let mut cut = 77;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

fn clip(mut text: String) -> String {
    if text.len() > DIFF_LIMIT {
        let mut cut = DIFF_LIMIT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// Runs `candidate` on `observation` with the active run's recorded app-call answers, and
/// compares its decision with the active one.
pub async fn run_candidate(
    candidate: &Plugin,
    observation: &Observation,
    parent: String,
    active: &ComparableDecision,
    recording: &AppCallRecorder,
) -> Comparison {
    let script = recording.replay();
    let scope = AppCallScope::scripted(parent.clone(), script.clone())
        .with_credentials(recording.credentials());
    let doing = format!("shadowing {parent}");
    let outcome = candidate.reconcile(observation, scope, &doing).await;
    let recorded = recording.calls();
    let unanswered: Vec<String> = script
        .calls()
        .into_iter()
        .filter(|call| !recorded.contains(call))
        .map(|call| format!("{:?} {} on {}", call.method, call.path, call.pod))
        .collect();
    compare(
        active,
        &ComparableDecision::of(&outcome),
        recorded.len(),
        &unanswered,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Event, EventType, KindRef, ObjectRef};

    fn decision(actions: Vec<Action>, requeue: Option<u64>) -> ComparableDecision {
        ComparableDecision::of(&Ok(Decision {
            actions,
            requeue_after_ms: requeue,
        }))
    }

    fn pod(name: &str, image: &str) -> Action {
        Action::Apply(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                   "spec": {"containers": [{"name": "etcd", "image": image}]}})
            .to_string(),
        )
    }

    fn status(version: &str) -> Action {
        Action::SetStatus(json!({"pluginVersion": version, "ready": 3}).to_string())
    }

    fn event(reason: &str) -> Action {
        Action::RecordEvent(Event {
            event_type: EventType::Normal,
            reason: reason.into(),
            message: "m".into(),
        })
    }

    fn delete(name: &str) -> Action {
        Action::Delete(ObjectRef {
            kind: KindRef {
                group: String::new(),
                version: "v1".into(),
                kind: "Pod".into(),
                plural: "pods".into(),
                namespaced: true,
            },
            name: name.into(),
        })
    }

    fn refused() -> ComparableDecision {
        ComparableDecision::of(&Err(DecideError::Refused {
            plugin: "p@1".into(),
            doing: "reconciling ns/x".into(),
            reason: "InvalidSpec".into(),
            message: "size must be odd".into(),
        }))
    }

    #[test]
    fn comparison_table() {
        let rows: Vec<(&str, ComparableDecision, ComparableDecision, Option<&str>)> = vec![
            (
                "equal decisions are the same, whatever the JSON key order",
                decision(vec![pod("ex-0", "etcd:v3.6"), status("1")], Some(2000)),
                decision(
                    vec![
                        Action::Apply(
                            r#"{"spec":{"containers":[{"image":"etcd:v3.6","name":"etcd"}]},"metadata":{"name":"ex-0"},"kind":"Pod","apiVersion":"v1"}"#.into(),
                        ),
                        status("1"),
                    ],
                    Some(2000),
                ),
                None,
            ),
            (
                "a changed field of the same child names its path and both values",
                decision(vec![pod("ex-0", "etcd:v3.5")], None),
                decision(vec![pod("ex-0", "etcd:v3.6")], None),
                Some(r#"action 1 (apply Pod ex-0): .spec.containers[0].image: "etcd:v3.5" → "etcd:v3.6""#),
            ),
            (
                "a changed status field",
                decision(vec![status("0.1.0")], None),
                decision(vec![status("0.2.0")], None),
                Some(r#"action 1 (set-status): .pluginVersion: "0.1.0" → "0.2.0""#),
            ),
            (
                "a different action at the same place",
                decision(vec![delete("ex-2")], None),
                decision(vec![event("MemberRemoved")], None),
                Some("action 1: active delete Pod ex-2, candidate event MemberRemoved (1 vs 1 actions)"),
            ),
            (
                "an extra action",
                decision(vec![status("1")], None),
                decision(vec![status("1"), event("Scaled")], None),
                Some("action 2: active has none, candidate event Scaled (1 vs 2 actions)"),
            ),
            (
                "only the requeue differs",
                decision(vec![status("1")], Some(2000)),
                decision(vec![status("1")], None),
                Some("requeue: active after 2000 ms, candidate none"),
            ),
            (
                "the candidate refuses what the active decided",
                decision(vec![status("1")], None),
                refused(),
                Some("the candidate refused to decide: InvalidSpec: size must be odd"),
            ),
            (
                "both refuse alike",
                refused(),
                refused(),
                None,
            ),
        ];
        for (situation, active, candidate, expected) in rows {
            let got = compare(&active, &candidate, 0, &[]);
            match (expected, got) {
                (None, Comparison::Same) => {}
                (Some(fragment), Comparison::Different(text)) => {
                    assert!(text.contains(fragment), "{situation}: {text}")
                }
                (expected, got) => panic!("{situation}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn calls_the_active_run_never_made_are_a_difference() {
        let same = decision(vec![status("1")], None);
        let got = compare(&same, &same, 2, &["Get /health on ex-3".to_string()]);
        assert!(
            matches!(&got, Comparison::Different(t) if t.contains("Get /health on ex-3")),
            "{got:?}"
        );
    }

    #[test]
    fn a_long_diff_is_clipped_for_the_event() {
        let long = "x".repeat(5000);
        let got = compare(
            &decision(
                vec![Action::SetStatus(json!({"a": long}).to_string())],
                None,
            ),
            &decision(vec![Action::SetStatus(json!({"a": "y"}).to_string())], None),
            0,
            &[],
        );
        match got {
            Comparison::Different(text) => assert!(text.chars().count() <= DIFF_LIMIT + 1),
            Comparison::Same => panic!("differs"),
        }
    }
}
