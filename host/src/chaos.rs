//! Chaos drills: a parent's opt-in annotation and its grammar, each parent's schedule, and the
//! choice of which of the parent's own Pods to kill, and when not to.
//!
//! A parent annotated `policy-host.io/chaos: "kill-pod every=30s"` gets one of its own Pods
//! (controlled by it, in its namespace) evicted every 30 s, each kill an Event on the parent.
//! Only while the annotation is there, and only when the admin granted `chaos: true` to the
//! plugin that reconciles the parent: a CR author cannot turn it on alone, and the host never
//! touches anything the parent does not control.
//!
//! A drill tests how an app survives losing a pod, not two at once (review M7): a kill goes
//! through the Eviction API, so the plugin's PodDisruptionBudget can refuse it and the pod gets
//! its grace period, and a turn is skipped while the last victim is not back: while any of the
//! parent's pods is terminating or not Ready, or the parent reports `Progressing=True` (the
//! Kubernetes convention both shipped plugins follow; an etcd member added as a learner is Ready
//! before it votes).
//!
//! The schedule lives in memory: after a host restart (or a leader change) the first kill of a
//! drill comes one period after the parent is next reconciled, never at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::contract::Observation;

/// The annotation that asks for a drill.
pub const CHAOS_ANNOTATION: &str = "policy-host.io/chaos";
/// The shortest period of a drill: a kill a second is already more than any app survives for
/// long.
pub const MIN_EVERY: Duration = Duration::from_secs(1);

/// A parsed drill: the only action is `kill-pod`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drill {
    /// Time between two kills.
    pub every: Duration,
}

impl Drill {
    /// Parses `kill-pod every=<duration>` (`500ms`, `30s`, `2m`, `1h`); the error says what to
    /// write instead.
    pub fn parse(text: &str) -> Result<Drill, String> {
        let usage = "write `kill-pod every=30s` (units ms, s, m, h; at least 1s)";
        let mut words = text.split_whitespace();
        if words.next() != Some("kill-pod") {
            return Err(format!(
                "{CHAOS_ANNOTATION}: {text:?} is not a drill; {usage}"
            ));
        }
        let mut every = None;
        for word in words {
            match word.split_once('=') {
                Some(("every", value)) => every = parse_duration(value),
                _ => {
                    return Err(format!(
                        "{CHAOS_ANNOTATION}: {word:?} in {text:?} is not understood; {usage}"
                    ));
                }
            }
        }
        match every {
            Some(every) if every >= MIN_EVERY => Ok(Drill { every }),
            _ => Err(format!(
                "{CHAOS_ANNOTATION}: {text:?} needs a period of at least 1s; {usage}"
            )),
        }
    }
}

/// `500ms`, `30s`, `2m`, `1h`.
fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    number.checked_mul(millis).map(Duration::from_millis)
}

/// What a parent's drill asks for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// No drill (no annotation, or a refusal already reported): nothing to do.
    Idle,
    /// The drill cannot run: report this once (reason, message), as a Warning Event.
    Refused(&'static str, String),
    /// The next kill is due in this long: look again then.
    Wait(Duration),
    /// Kill one pod now; the next is due after this long.
    Kill(Duration),
}

/// One parent's drill as last seen.
struct Entry {
    /// The annotation it was read from: a changed annotation starts a new drill.
    text: String,
    /// When the next kill is due; `None` for a refused drill.
    next: Option<Instant>,
}

/// The drills of one policy's parents, by parent uid.
#[derive(Default)]
pub struct ChaosSchedule {
    drills: Mutex<HashMap<String, Entry>>,
}

impl ChaosSchedule {
    /// What the drill of parent `uid` (annotation `annotation`, chaos `granted` or not) asks
    /// for at `now`.
    pub fn turn(&self, uid: &str, annotation: Option<&str>, granted: bool, now: Instant) -> Turn {
        let mut drills = self.drills.lock().unwrap_or_else(|e| e.into_inner());
        let Some(text) = annotation.map(str::trim).filter(|t| !t.is_empty()) else {
            drills.remove(uid);
            return Turn::Idle;
        };
        if let Some(entry) = drills.get_mut(uid)
            && entry.text == text
        {
            let Some(next) = entry.next else {
                return Turn::Idle;
            };
            if now < next {
                return Turn::Wait(next - now);
            }
            // Checked when the entry was made; a changed text makes a new entry.
            let every = Drill::parse(text).map_or(MIN_EVERY, |d| d.every);
            entry.next = Some(now + every);
            return Turn::Kill(every);
        }
        let refused = |reason, message: String| {
            (
                Entry {
                    text: text.to_owned(),
                    next: None,
                },
                Turn::Refused(reason, message),
            )
        };
        let (entry, turn) = match Drill::parse(text) {
            Err(message) => refused("ChaosInvalid", message),
            Ok(_) if !granted => refused(
                "ChaosNotGranted",
                format!(
                    "{CHAOS_ANNOTATION} asks for {text:?}, but the admin has not granted chaos to this plugin; add `chaos: true` to data.grants of its ConfigMap (or remove the annotation)"
                ),
            ),
            Ok(drill) => (
                Entry {
                    text: text.to_owned(),
                    next: Some(now + drill.every),
                },
                Turn::Wait(drill.every),
            ),
        };
        drills.insert(uid.to_owned(), entry);
        turn
    }

    /// Forgets a parent (deleted).
    pub fn forget(&self, uid: &str) {
        self.drills
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// Keeps only the drills of parents whose uid `keep` accepts (those still cached).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.drills
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| keep(uid));
    }

    /// How many parents' drills are kept.
    pub fn len(&self) -> usize {
        self.drills.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when no drill is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether a Pod (as JSON) is Ready and not terminating.
fn settled(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The victim among the Pods of the observation, by name with its uid: the `seed`-th of them
/// (modulo their number). None while any of them is terminating or not Ready (the last victim
/// is not back yet), or there is none.
pub fn pick_pod(observation: &Observation, seed: u64) -> Option<(String, String)> {
    let pods: Vec<Value> = observation
        .children
        .iter()
        .filter(|c| c.kind.group.is_empty() && c.kind.kind == "Pod")
        .filter_map(|c| serde_json::from_str(&c.object).ok())
        .collect();
    if !pods.iter().all(settled) {
        return None;
    }
    let mut named: Vec<(String, String)> = pods
        .iter()
        .filter_map(|pod| {
            let meta = &pod["metadata"];
            Some((
                meta["name"].as_str()?.to_owned(),
                meta["uid"].as_str()?.to_owned(),
            ))
        })
        .collect();
    if named.is_empty() {
        return None;
    }
    named.sort();
    let index = usize::try_from(seed % u64::try_from(named.len()).unwrap_or(1)).unwrap_or(0);
    named.into_iter().nth(index)
}

/// Why parent `parent` (as JSON) is still changing, from its `Progressing=True` condition: a
/// drill waits for it to settle.
pub fn progressing(parent: &Value) -> Option<String> {
    parent["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Progressing" && c["status"] == "True")
        .map(|c| {
            format!(
                "the parent reports Progressing=True ({})",
                c["reason"].as_str().unwrap_or("no reason")
            )
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::contract::{Child, KindRef, Timestamp};

    #[test]
    fn the_grammar_reads_kill_pod_every_and_refuses_the_rest_saying_what_to_write() {
        assert_eq!(
            Drill::parse("kill-pod every=30s"),
            Ok(Drill {
                every: Duration::from_secs(30)
            })
        );
        assert_eq!(
            Drill::parse("  kill-pod   every=2m "),
            Ok(Drill {
                every: Duration::from_secs(120)
            })
        );
        for bad in [
            "",
            "kill-node every=30s",
            "kill-pod",
            "kill-pod every=500ms",
            "kill-pod every=30",
            "kill-pod every=30d",
            "kill-pod every=30s count=2",
            "kill-pod every=99999999999999999999h",
        ] {
            let error = Drill::parse(bad).expect_err(bad);
            assert!(error.contains("kill-pod every=30s"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_granted_drill_waits_one_period_then_kills_every_period() {
        let schedule = ChaosSchedule::default();
        let start = Instant::now();
        let every = Duration::from_secs(5);
        let text = Some("kill-pod every=5s");
        assert_eq!(schedule.turn("u", text, true, start), Turn::Wait(every));
        assert_eq!(
            schedule.turn("u", text, true, start + Duration::from_secs(2)),
            Turn::Wait(Duration::from_secs(3))
        );
        assert_eq!(
            schedule.turn("u", text, true, start + every),
            Turn::Kill(every)
        );
        assert_eq!(
            schedule.turn("u", text, true, start + every + Duration::from_secs(1)),
            Turn::Wait(Duration::from_secs(4))
        );
        // The annotation removed: the drill stops, and starts afresh when it is back.
        assert_eq!(
            schedule.turn("u", None, true, start + every * 3),
            Turn::Idle
        );
        assert_eq!(
            schedule.turn("u", text, true, start + every * 3),
            Turn::Wait(every)
        );
    }

    #[test]
    fn an_ungranted_or_invalid_drill_is_refused_once_and_never_kills() {
        let schedule = ChaosSchedule::default();
        let start = Instant::now();
        let text = Some("kill-pod every=1s");
        assert!(matches!(
            schedule.turn("u", text, false, start),
            Turn::Refused("ChaosNotGranted", ref m) if m.contains("chaos: true")
        ));
        for later in 1..5 {
            assert_eq!(
                schedule.turn("u", text, false, start + Duration::from_secs(later)),
                Turn::Idle
            );
        }
        assert!(matches!(
            schedule.turn("v", Some("kill-pod every=soon"), true, start),
            Turn::Refused("ChaosInvalid", _)
        ));
        assert_eq!(
            schedule.turn(
                "v",
                Some("kill-pod every=soon"),
                true,
                start + MIN_EVERY * 9
            ),
            Turn::Idle
        );
    }

    fn pod(name: &str, terminating: bool) -> Child {
        let mut object = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        if terminating {
            object["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        Child {
            kind: KindRef {
                group: String::new(),
                version: "v1".into(),
                kind: "Pod".into(),
                plural: "pods".into(),
                namespaced: true,
            },
            object: object.to_string(),
        }
    }

    fn not_ready(name: &str) -> Child {
        let mut child = pod(name, false);
        let mut object: Value = serde_json::from_str(&child.object).expect("json");
        object["status"]["conditions"][0]["status"] = "False".into();
        child.object = object.to_string();
        child
    }

    fn observation(children: Vec<Child>) -> Observation {
        Observation {
            parent: "{}".into(),
            children,
            now: Timestamp {
                seconds: 0,
                nanoseconds: 0,
            },
        }
    }

    #[test]
    fn the_victim_is_one_of_the_observed_pods() {
        let observation = observation(vec![pod("a", false), pod("b", false), pod("c", false)]);
        let victims: Vec<_> = (0..4)
            .filter_map(|seed| pick_pod(&observation, seed))
            .collect();
        assert_eq!(
            victims.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c", "a"]
        );
        assert_eq!(victims[0].1, "uid-a");
    }

    #[test]
    fn no_pod_is_killed_while_the_last_victim_is_not_back() {
        let rows = [
            (
                "a pod terminating (the last victim going)",
                vec![pod("a", false), pod("b", true), pod("c", false)],
            ),
            (
                "a pod not Ready (the replacement starting)",
                vec![pod("a", false), not_ready("b"), pod("c", false)],
            ),
            ("the only pod terminating", vec![pod("b", true)]),
            ("no pod", vec![]),
        ];
        for (situation, children) in rows {
            let observation = observation(children);
            for seed in 0..3 {
                assert_eq!(pick_pod(&observation, seed), None, "{situation}");
            }
        }
    }

    #[test]
    fn no_pod_is_killed_while_the_parent_reports_progress() {
        let rows = [
            (
                "Progressing=True (a member being added)",
                json!({"status": {"conditions": [{"type": "Progressing", "status": "True", "reason": "AddingMember"}]}}),
                Some("AddingMember"),
            ),
            (
                "Progressing=False",
                json!({"status": {"conditions": [{"type": "Progressing", "status": "False", "reason": "Reconciled"}]}}),
                None,
            ),
            ("no status yet", json!({}), None),
        ];
        for (situation, parent, expected) in rows {
            let why = progressing(&parent);
            match expected {
                Some(reason) => assert!(
                    why.as_ref().is_some_and(|w| w.contains(reason)),
                    "{situation}: {why:?}"
                ),
                None => assert_eq!(why, None, "{situation}"),
            }
        }
    }
}
