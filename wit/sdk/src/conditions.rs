//! Status conditions in the Kubernetes convention (`type`, `status`, `reason`, `message`,
//! `lastTransitionTime`), and RFC 3339 time from the observation's clock.
//!
//! `lastTransitionTime` must change only when `status` changes, or every reconcile would
//! rewrite the status and wake every watcher: [`set_condition`] keeps it.
//!
//! Embed `Vec<Condition>` in your status type: it derives `JsonSchema`, and its doc comments
//! (which become the CRD's field descriptions) speak to the resource's users.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::contract::Timestamp;

/// A status condition, following the Kubernetes `metav1.Condition` conventions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The aspect this condition reports, e.g. `Available`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Short CamelCase reason for the last change.
    #[serde(default)]
    pub reason: String,
    /// What is going on, for a human.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default)]
    pub last_transition_time: String,
    /// The parent's `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    /// A condition with `status` `True` or `False` (no transition time yet:
    /// [`set_condition`] fills it in).
    pub fn new(type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Condition {
            type_: type_.to_owned(),
            status: if status { "True" } else { "False" }.to_owned(),
            reason: reason.to_owned(),
            message: message.into(),
            last_transition_time: String::new(),
            observed_generation: None,
        }
    }

    /// Sets `observedGeneration`.
    pub fn observed(mut self, generation: Option<i64>) -> Self {
        self.observed_generation = generation;
        self
    }
}

/// Puts `condition` into `conditions`, replacing one of the same type. Its
/// `lastTransitionTime` is kept from the old one when the status did not change, and is
/// `now` otherwise.
pub fn set_condition(conditions: &mut Vec<Condition>, mut condition: Condition, now: Timestamp) {
    let previous = conditions.iter().position(|c| c.type_ == condition.type_);
    condition.last_transition_time = match previous.map(|i| &conditions[i]) {
        Some(old) if old.status == condition.status && !old.last_transition_time.is_empty() => {
            old.last_transition_time.clone()
        }
        _ => rfc3339(now),
    };
    match previous {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

/// Whether `conditions` already say exactly `condition` (type, status, reason and message):
/// record the Event that goes with a condition only when this is false, so it is recorded
/// once when the condition appears, not on every reconcile while it holds.
pub fn already_set(conditions: &[Condition], condition: &Condition) -> bool {
    conditions.iter().any(|c| {
        c.type_ == condition.type_
            && c.status == condition.status
            && c.reason == condition.reason
            && c.message == condition.message
    })
}

/// `at` as RFC 3339 in UTC with second precision, e.g. `2024-05-01T12:00:00Z`.
pub fn rfc3339(at: Timestamp) -> String {
    let days = at.seconds.div_euclid(86_400);
    let secs = at.seconds.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp {
            seconds,
            nanoseconds: 0,
        }
    }

    #[test]
    fn rfc3339_table() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_714_564_800, "2024-05-01T12:00:00Z"),
            (4_102_444_799, "2099-12-31T23:59:59Z"),
        ];
        for (seconds, want) in cases {
            assert_eq!(rfc3339(at(seconds)), want);
        }
    }

    #[test]
    fn set_condition_table() {
        let ready = |status| Condition::new("Ready", status, "R", "m");
        // (situation, before, update, expected lastTransitionTime)
        let cases = [
            (
                "a new condition starts now",
                vec![],
                ready(true),
                rfc3339(at(100)),
            ),
            (
                "an unchanged status keeps its transition time",
                vec![Condition {
                    last_transition_time: rfc3339(at(5)),
                    ..ready(true)
                }],
                Condition::new("Ready", true, "Other", "new message"),
                rfc3339(at(5)),
            ),
            (
                "a changed status transitions now",
                vec![Condition {
                    last_transition_time: rfc3339(at(5)),
                    ..ready(false)
                }],
                ready(true),
                rfc3339(at(100)),
            ),
        ];
        for (situation, mut conditions, update, want) in cases {
            set_condition(&mut conditions, update.clone(), at(100));
            assert_eq!(conditions.len(), 1, "{situation}");
            assert_eq!(conditions[0].last_transition_time, want, "{situation}");
            assert_eq!(conditions[0].reason, update.reason, "{situation}");
        }
    }

    #[test]
    fn already_set_compares_everything_but_the_times() {
        let mut conditions = Vec::new();
        let degraded = Condition::new("Degraded", true, "InvalidSpec", "fix spec.size");
        assert!(!already_set(&conditions, &degraded));
        set_condition(&mut conditions, degraded.clone(), at(100));
        assert!(already_set(&conditions, &degraded));
        let other_message = Condition::new("Degraded", true, "InvalidSpec", "fix spec.version");
        assert!(!already_set(&conditions, &other_message));
        let cleared = Condition::new("Degraded", false, "InvalidSpec", "fix spec.size");
        assert!(!already_set(&conditions, &cleared));
    }
}
