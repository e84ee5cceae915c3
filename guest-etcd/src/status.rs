//! Status bookkeeping: conditions that keep their `lastTransitionTime` while their status
//! does not change, and RFC 3339 time from the observation's clock.

use crate::protocol::Timestamp;
use crate::spec::Condition;

/// Condition type: a quorum of voting members is ready, so the cluster serves requests.
pub const AVAILABLE: &str = "Available";
/// Condition type: membership is changing or the plugin waits for members to start.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: something needs attention (invalid spec, lost members).
pub const DEGRADED: &str = "Degraded";

/// Formats a timestamp as RFC 3339 UTC with whole seconds, e.g. `2024-05-01T12:00:00Z`
/// (the format of `metav1.Time`).
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

/// A condition as the plugin decides it now, before merging with the observed one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionUpdate {
    /// Condition type.
    pub type_: &'static str,
    /// Whether the condition holds.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable details.
    pub message: String,
}

impl ConditionUpdate {
    /// Builds an update.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        ConditionUpdate {
            type_,
            status,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

fn status_text(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Merges the decided conditions with the observed ones: a condition whose status did not
/// change keeps its `lastTransitionTime`; otherwise it is `now`.
pub fn merge_conditions(
    observed: &[Condition],
    updates: &[ConditionUpdate],
    now: Timestamp,
    generation: Option<i64>,
) -> Vec<Condition> {
    updates
        .iter()
        .map(|update| {
            let status = status_text(update.status).to_owned();
            let last_transition_time = observed
                .iter()
                .find(|c| c.type_ == update.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| rfc3339(now));
            Condition {
                type_: update.type_.to_owned(),
                status,
                reason: update.reason.clone(),
                message: update.message.clone(),
                last_transition_time,
                observed_generation: generation,
            }
        })
        .collect()
}

/// Whether the observed conditions already say exactly this (used to emit a warning Event
/// once, not on every reconcile).
pub fn already_reported(observed: &[Condition], update: &ConditionUpdate) -> bool {
    observed.iter().any(|c| {
        c.type_ == update.type_
            && c.status == status_text(update.status)
            && c.reason == update.reason
            && c.message == update.message
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_table() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_714_564_800, "2024-05-01T12:00:00Z"),
            (4_102_444_799, "2099-12-31T23:59:59Z"),
        ];
        for (seconds, want) in cases {
            assert_eq!(
                rfc3339(Timestamp {
                    seconds,
                    nanoseconds: 0
                }),
                want
            );
        }
    }

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let observed = vec![Condition {
            type_: AVAILABLE.into(),
            status: "True".into(),
            reason: "QuorumReady".into(),
            message: "old".into(),
            last_transition_time: "2020-01-01T00:00:00Z".into(),
            observed_generation: Some(1),
        }];
        let now = Timestamp {
            seconds: 1_714_564_800,
            nanoseconds: 0,
        };
        let same = merge_conditions(
            &observed,
            &[ConditionUpdate::new(AVAILABLE, true, "QuorumReady", "new")],
            now,
            Some(2),
        );
        assert_eq!(same[0].last_transition_time, "2020-01-01T00:00:00Z");
        assert_eq!(same[0].message, "new");
        let flipped = merge_conditions(
            &observed,
            &[ConditionUpdate::new(AVAILABLE, false, "QuorumLost", "x")],
            now,
            Some(2),
        );
        assert_eq!(flipped[0].last_transition_time, "2024-05-01T12:00:00Z");
    }
}
