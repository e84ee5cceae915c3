//! Backups: when one is due (on demand or on schedule), the Pod that takes it, and what its
//! result does to the status.
//!
//! One backup Pod at a time (`<name>-backup`, [`children::backup_pod`]). It dumps the primary,
//! proves the dump loads into a fresh server, and hands its result over in its termination
//! message; the plugin records it in `status.backup` and deletes the Pod. What the Pod was
//! for (a trigger's value, or a schedule's due time) is on the Pod, so a result is recorded
//! once, whatever the order in which the status write and the Pod's end are seen.

use policy_host_sdk::conditions::rfc3339;
use policy_host_sdk::prelude::*;
use policy_host_sdk::schedule::{due_time_to_record, next_due, parse_duration, parse_rfc3339};

use crate::children;
use crate::spec::{BackupRecord, BackupStatus, MariaDBClusterSpec};

/// How long a backup Pod may go without a result before it is given up on: long enough for a
/// dump of some GiB and its proof, short enough that a Pod that never starts (its claim
/// unbound, its image missing) does not hold every later backup back for long.
pub const BACKUP_DEADLINE_SECONDS: i64 = 3_600;

/// How often a running backup is looked at.
const BACKUP_POLL_MS: u64 = 5_000;

/// The backup Pod as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupPod {
    /// `status.phase`.
    pub phase: String,
    /// Being deleted.
    pub terminating: bool,
    /// What it was for ([`children::BACKUP_REASON_ANNOTATION`]).
    pub reason: Option<String>,
    /// When it was created (RFC 3339, [`children::BACKUP_STARTED_ANNOTATION`]).
    pub started: Option<String>,
    /// The backup step's termination message: the result, or why it failed.
    pub message: Option<String>,
    /// The upload's, with a store: why it failed (`mc`'s last lines).
    pub upload_message: Option<String>,
    /// Where the upload puts it ([`children::BACKUP_LOCATION_ANNOTATION`]).
    pub location: Option<String>,
}

/// What the backup step adds to a decision.
#[derive(Debug, Default)]
pub struct BackupPlan {
    /// The claim, the Pod to create or delete, Events.
    pub actions: Vec<Action>,
    /// When to look again, if sooner than the rest of the decision asks.
    pub requeue_ms: Option<u64>,
}

/// Why a backup is taken, as the Pod's annotation says it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reason {
    /// `spec.backup.trigger` changed to this value.
    Trigger(String),
    /// The schedule made one due at this time (RFC 3339).
    Scheduled(String),
}

impl Reason {
    fn annotation(&self) -> String {
        match self {
            Reason::Trigger(value) => format!("trigger:{value}"),
            Reason::Scheduled(due) => format!("scheduled:{due}"),
        }
    }

    fn parse(text: &str) -> Option<Reason> {
        if let Some(value) = text.strip_prefix("trigger:") {
            return Some(Reason::Trigger(value.to_owned()));
        }
        text.strip_prefix("scheduled:")
            .map(|due| Reason::Scheduled(due.to_owned()))
    }

    /// What `status.backup.backups[].reason` says.
    fn summary(&self) -> String {
        match self {
            Reason::Trigger(value) => format!("trigger:{value}"),
            Reason::Scheduled(_) => "scheduled".to_owned(),
        }
    }

    /// Whether `status` already records the outcome of a backup taken for this reason.
    fn recorded(&self, status: &BackupStatus) -> bool {
        match self {
            Reason::Trigger(value) => status.last_trigger.as_deref() == Some(value.as_str()),
            Reason::Scheduled(due) => status
                .last_scheduled_time
                .as_deref()
                .is_some_and(|last| parse_rfc3339(last) >= parse_rfc3339(due)),
        }
    }

    fn record(&self, status: &mut BackupStatus) {
        match self {
            Reason::Trigger(value) => status.last_trigger = Some(value.clone()),
            Reason::Scheduled(due) => status.last_scheduled_time = Some(due.clone()),
        }
    }
}

/// The backup file for a backup started at `now`: `<name>-<YYYYMMDDTHHMMSSZ>.sql`.
pub fn file_name(parent: &str, now: Timestamp) -> String {
    let stamp: String = rfc3339(Timestamp {
        seconds: now.seconds,
        nanoseconds: 0,
    })
    .chars()
    .filter(|c| !matches!(c, '-' | ':'))
    .collect();
    format!("{parent}-{stamp}.sql")
}

/// Reads the backup Pod's result (`file=… gtid=… bytes=… tables=… rows=… accounts=…`; a Pod of
/// an earlier plugin version names no accounts).
fn parse_result(message: &str) -> Option<BackupRecord> {
    let mut record = BackupRecord::default();
    for field in message.split_whitespace() {
        let (key, value) = field.split_once('=')?;
        match key {
            "file" => record.file = value.to_owned(),
            "gtid" => record.gtid = value.to_owned(),
            "bytes" => record.bytes = value.parse().ok()?,
            "tables" => record.tables = value.parse().ok()?,
            "rows" => record.rows = value.parse().ok()?,
            "accounts" => record.accounts = Some(value.parse().ok()?),
            _ => {}
        }
    }
    (!record.file.is_empty()).then_some(record)
}

/// The backup step of a decision. `can_start`: a primary takes writes and nothing else is
/// under way, so a new backup may start now (one already running carries on regardless).
/// Writes `status.backup`.
pub fn plan(
    parent: &str,
    namespace: &str,
    spec: &MariaDBClusterSpec,
    pod: Option<&BackupPod>,
    status: &mut Option<BackupStatus>,
    now: Timestamp,
    can_start: bool,
) -> BackupPlan {
    let mut plan = BackupPlan::default();
    let pod_name = children::backup_pod_name(parent);
    let delete_pod = || Action::Delete {
        kind: children::pod_kind(),
        name: pod_name.clone(),
    };
    let Some(backup) = &spec.backup else {
        // None asked for any more: a Pod still running goes; the records and the claim stay.
        if pod.is_some_and(|p| !p.terminating) {
            plan.actions.push(delete_pod());
        }
        return plan;
    };
    let recorded = status.get_or_insert_with(BackupStatus::default);
    plan.actions
        .extend(children::backups_claim(parent, spec).map(Action::Apply));
    let every = backup.every.as_deref().and_then(parse_duration);
    let mut running = false;
    match pod {
        Some(pod) if pod.terminating => running = true,
        Some(pod) => {
            // A Pod whose outcome is recorded (its delete was not seen yet), or of unknown
            // purpose, goes; so does one that just ended.
            if let Some(reason) = pod.reason.as_deref().and_then(Reason::parse)
                && !reason.recorded(recorded)
            {
                running = follow(&mut plan, parent, pod, &reason, recorded, backup.keep, now);
            }
            if !running {
                plan.actions.push(delete_pod());
            }
        }
        None => {}
    }
    recorded.next_scheduled_time = every.map(|every| {
        let due = next_due(recorded.last_scheduled_time.as_deref(), every, now.seconds);
        if !running && due > now.seconds {
            plan.requeue_ms = u64::try_from((due - now.seconds) * 1_000).ok();
        }
        rfc3339(Timestamp {
            seconds: due,
            nanoseconds: 0,
        })
    });
    if running {
        plan.requeue_ms = Some(BACKUP_POLL_MS);
        return plan;
    }
    if pod.is_some() || !can_start {
        return plan;
    }
    let reason = match (&backup.trigger, every) {
        (Some(value), _) if recorded.last_trigger.as_ref() != Some(value) => {
            Reason::Trigger(value.clone())
        }
        (_, Some(every)) => {
            let due = next_due(recorded.last_scheduled_time.as_deref(), every, now.seconds);
            if now.seconds < due {
                return plan;
            }
            Reason::Scheduled(rfc3339(Timestamp {
                seconds: due_time_to_record(due, every, now.seconds),
                nanoseconds: 0,
            }))
        }
        _ => return plan,
    };
    let file = file_name(parent, now);
    plan.actions.push(Action::Apply(children::backup_pod(
        parent,
        namespace,
        &spec.image(),
        &file,
        &reason.annotation(),
        &rfc3339(now),
        spec,
    )));
    plan.actions.push(Action::RecordEvent(Event::normal(
        "BackupStarted",
        format!(
            "backing up the primary into {file} on claim {} ({})",
            children::backups_claim_name(parent),
            reason.summary()
        ),
    )));
    plan.requeue_ms = Some(BACKUP_POLL_MS);
    plan
}

/// Follows a backup Pod not yet recorded: its result into `status` once it ended (then it may
/// go); returns whether it is still running.
fn follow(
    plan: &mut BackupPlan,
    parent: &str,
    pod: &BackupPod,
    reason: &Reason,
    status: &mut BackupStatus,
    keep: i32,
    now: Timestamp,
) -> bool {
    let pod_name = children::backup_pod_name(parent);
    let failure = match pod.phase.as_str() {
        "Succeeded" => match pod.message.as_deref().and_then(parse_result) {
            Some(mut record) => {
                record.taken_at = pod.started.clone().unwrap_or_default();
                record.reason = reason.summary();
                record.location = pod.location.clone();
                plan.actions.push(Action::RecordEvent(Event::normal(
                    "BackupTaken",
                    format!(
                        "{} proven: it loads into a fresh server ({} tables, {} rows, {} bytes, GTID {})",
                        record.file, record.tables, record.rows, record.bytes, record.gtid
                    ),
                )));
                status.backups.retain(|b| b.file != record.file);
                status.backups.insert(0, record);
                status
                    .backups
                    .truncate(usize::try_from(keep.max(1)).unwrap_or(1));
                status.last_failure = None;
                reason.record(status);
                return false;
            }
            None => format!(
                "pod {pod_name} ended without a result ({:?}); kubectl logs {pod_name} says what it did",
                pod.message.clone().unwrap_or_default()
            ),
        },
        "Failed" => match (pod.message.as_deref(), pod.location.as_deref()) {
            // The backup step ended well: the upload after it failed.
            (Some(message), Some(location)) if parse_result(message).is_some() => format!(
                "the backup was proven but its upload to {location} failed: {}; check spec.backup.s3 (endpoint, bucket, the keys in its Secret)",
                pod.upload_message
                    .as_deref()
                    .map_or("no message", |m| m.trim())
            ),
            (Some(message), _) => message.trim_start_matches("failed: ").to_owned(),
            (None, _) => format!(
                "pod {pod_name} failed without saying why; kubectl describe pod {pod_name} and kubectl logs {pod_name}"
            ),
        },
        phase => {
            let age = pod
                .started
                .as_deref()
                .and_then(parse_rfc3339)
                .map(|started| now.seconds - started);
            if age.is_none_or(|age| age < BACKUP_DEADLINE_SECONDS) {
                return true;
            }
            format!(
                "pod {pod_name} had no result {} minutes after it was created (phase {}); check that claim {} binds and the image can be pulled",
                BACKUP_DEADLINE_SECONDS / 60,
                if phase.is_empty() { "unknown" } else { phase },
                children::backups_claim_name(parent)
            )
        }
    };
    let retry = match reason {
        Reason::Trigger(_) => "set spec.backup.trigger to a new value to try again",
        Reason::Scheduled(_) => "the next scheduled backup tries again",
    };
    plan.actions.push(Action::RecordEvent(Event::warning(
        "BackupFailed",
        format!("{failure}; {retry}"),
    )));
    status.last_failure = Some(failure);
    reason.record(status);
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Backup;

    const NOON: i64 = 1_714_564_800;

    fn at(seconds: i64) -> Timestamp {
        Timestamp {
            seconds,
            nanoseconds: 0,
        }
    }

    fn spec(trigger: Option<&str>, every: Option<&str>) -> MariaDBClusterSpec {
        MariaDBClusterSpec {
            backup: Some(Backup {
                every: every.map(str::to_owned),
                trigger: trigger.map(str::to_owned),
                keep: 2,
                storage: Default::default(),
                s3: None,
            }),
            ..MariaDBClusterSpec::default()
        }
    }

    fn pod(phase: &str, reason: &str, message: Option<&str>) -> BackupPod {
        BackupPod {
            phase: phase.to_owned(),
            terminating: false,
            reason: Some(reason.to_owned()),
            started: Some(rfc3339(at(NOON))),
            message: message.map(str::to_owned),
            upload_message: None,
            location: None,
        }
    }

    fn applied_pod(plan: &BackupPlan) -> Option<&serde_json::Value> {
        plan.actions.iter().find_map(|a| match a {
            Action::Apply(object) if object["kind"] == "Pod" => Some(object),
            _ => None,
        })
    }

    fn deletes_pod(plan: &BackupPlan) -> bool {
        plan.actions
            .iter()
            .any(|a| matches!(a, Action::Delete { name, .. } if name == "db-backup"))
    }

    fn event(plan: &BackupPlan, reason: &str) -> Option<String> {
        plan.actions.iter().find_map(|a| match a {
            Action::RecordEvent(e) if e.reason == reason => Some(e.message.clone()),
            _ => None,
        })
    }

    #[test]
    fn a_new_trigger_starts_one_backup_pod_on_the_claim_and_only_with_a_primary() {
        let spec = spec(Some("first"), None);
        let mut status = None;
        let plan = plan("db", "ns", &spec, None, &mut status, at(NOON), true);
        let pod = applied_pod(&plan).expect("a backup Pod");
        assert_eq!(pod["metadata"]["name"], "db-backup");
        assert_eq!(
            pod["metadata"]["annotations"][children::BACKUP_REASON_ANNOTATION],
            "trigger:first"
        );
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        let env = pod["spec"]["containers"][0]["env"].to_string();
        assert!(
            env.contains("db-20240501T120000Z.sql") && env.contains("db-primary"),
            "{env}"
        );
        assert!(
            plan.actions
                .iter()
                .any(|a| matches!(a, Action::Apply(o) if o["metadata"]["name"] == "db-backups"))
        );
        assert!(event(&plan, "BackupStarted").is_some());
        assert_eq!(plan.requeue_ms, Some(BACKUP_POLL_MS));

        let mut status = None;
        let waiting = super::plan("db", "ns", &spec, None, &mut status, at(NOON), false);
        assert!(
            applied_pod(&waiting).is_none(),
            "no primary taking writes: no backup yet"
        );

        let mut done = Some(BackupStatus {
            last_trigger: Some("first".into()),
            ..BackupStatus::default()
        });
        let again = super::plan("db", "ns", &spec, None, &mut done, at(NOON), true);
        assert!(
            applied_pod(&again).is_none(),
            "a trigger carried out is not taken again"
        );
    }

    #[test]
    fn a_proven_backup_is_listed_newest_first_the_oldest_beyond_keep_dropped_and_its_pod_deleted() {
        let spec = spec(Some("third"), None);
        let old = |file: &str| BackupRecord {
            file: file.into(),
            ..BackupRecord::default()
        };
        let mut status = Some(BackupStatus {
            backups: vec![old("db-2.sql"), old("db-1.sql")],
            last_trigger: Some("second".into()),
            last_failure: Some("an earlier one failed".into()),
            ..BackupStatus::default()
        });
        let ended = pod(
            "Succeeded",
            "trigger:third",
            Some("file=db-3.sql gtid=0-1-42 bytes=2048 tables=2 rows=77 accounts=3"),
        );
        let plan = plan(
            "db",
            "ns",
            &spec,
            Some(&ended),
            &mut status,
            at(NOON + 60),
            true,
        );
        let status = status.expect("a status");
        let files: Vec<&str> = status.backups.iter().map(|b| b.file.as_str()).collect();
        assert_eq!(files, ["db-3.sql", "db-2.sql"]);
        let newest = &status.backups[0];
        assert_eq!(
            (
                newest.gtid.as_str(),
                newest.bytes,
                newest.tables,
                newest.rows,
                newest.accounts
            ),
            ("0-1-42", 2048, 2, 77, Some(3))
        );
        assert_eq!(newest.taken_at, rfc3339(at(NOON)));
        assert_eq!(newest.reason, "trigger:third");
        assert_eq!(status.last_trigger.as_deref(), Some("third"));
        assert_eq!(status.last_failure, None);
        assert!(deletes_pod(&plan));
        assert!(event(&plan, "BackupTaken").is_some_and(|m| m.contains("77 rows")));
        assert!(
            applied_pod(&plan).is_none(),
            "no second backup for the same trigger"
        );
    }

    #[test]
    fn a_failed_backup_says_why_and_how_to_try_again_and_is_not_retried_in_a_loop() {
        let spec = spec(Some("first"), None);
        let mut status = None;
        let failed = pod(
            "Failed",
            "trigger:first",
            Some("failed: mariadb-dump from db-primary failed: Access denied"),
        );
        let plan = plan(
            "db",
            "ns",
            &spec,
            Some(&failed),
            &mut status,
            at(NOON + 60),
            true,
        );
        let status = status.expect("a status");
        assert_eq!(
            status.last_failure.as_deref(),
            Some("mariadb-dump from db-primary failed: Access denied")
        );
        assert_eq!(status.last_trigger.as_deref(), Some("first"));
        assert!(status.backups.is_empty());
        assert!(deletes_pod(&plan));
        let warning = event(&plan, "BackupFailed").expect("a warning");
        assert!(warning.contains("Access denied") && warning.contains("spec.backup.trigger"));
        assert!(applied_pod(&plan).is_none());
    }

    #[test]
    fn a_running_backup_is_waited_for_until_its_deadline() {
        let spec = spec(Some("first"), None);
        let running = pod("Running", "trigger:first", None);
        let mut status = None;
        let plan = plan(
            "db",
            "ns",
            &spec,
            Some(&running),
            &mut status,
            at(NOON + 60),
            true,
        );
        assert!(!deletes_pod(&plan) && applied_pod(&plan).is_none());
        assert_eq!(plan.requeue_ms, Some(BACKUP_POLL_MS));

        let stuck = pod("Pending", "trigger:first", None);
        let mut status = None;
        let late = NOON + BACKUP_DEADLINE_SECONDS + 1;
        let plan = super::plan("db", "ns", &spec, Some(&stuck), &mut status, at(late), true);
        assert!(deletes_pod(&plan));
        assert!(
            status
                .and_then(|s| s.last_failure)
                .is_some_and(|f| f.contains("claim db-backups binds"))
        );
    }

    #[test]
    fn the_schedule_takes_one_when_due_keeps_its_phase_and_says_when_the_next_is_due() {
        let spec = spec(None, Some("6h"));
        let mut status = Some(BackupStatus {
            last_scheduled_time: Some(rfc3339(at(NOON - 6 * 3_600))),
            ..BackupStatus::default()
        });
        let early = plan("db", "ns", &spec, None, &mut status, at(NOON - 10), true);
        assert!(applied_pod(&early).is_none());
        assert_eq!(early.requeue_ms, Some(10_000));
        assert_eq!(
            status.as_ref().and_then(|s| s.next_scheduled_time.clone()),
            Some(rfc3339(at(NOON)))
        );
        let due = plan("db", "ns", &spec, None, &mut status, at(NOON + 7), true);
        let pod = applied_pod(&due).expect("a scheduled backup");
        assert_eq!(
            pod["metadata"]["annotations"][children::BACKUP_REASON_ANNOTATION],
            format!("scheduled:{}", rfc3339(at(NOON)))
        );
    }

    #[test]
    fn a_proven_backup_whose_upload_failed_says_so_and_where_it_stays() {
        let spec = spec(Some("first"), None);
        let mut failed = pod(
            "Failed",
            "trigger:first",
            Some("file=db-1.sql gtid=0-1-4 bytes=9 tables=1 rows=3"),
        );
        failed.location = Some("s3://backups/ns/db-1.sql".into());
        failed.upload_message = Some("mc: Access Denied.".into());
        let mut status = None;
        let outcome = plan(
            "db",
            "ns",
            &spec,
            Some(&failed),
            &mut status,
            at(NOON + 60),
            true,
        );
        let failure = status.and_then(|s| s.last_failure).unwrap_or_default();
        assert!(
            failure.contains("upload to s3://backups/ns/db-1.sql failed: mc: Access Denied."),
            "{failure}"
        );
        assert!(deletes_pod(&outcome));

        let mut uploaded = pod(
            "Succeeded",
            "trigger:first",
            Some("file=db-1.sql gtid=0-1-4 bytes=9 tables=1 rows=3"),
        );
        uploaded.location = Some("s3://backups/ns/db-1.sql".into());
        let mut status = None;
        plan(
            "db",
            "ns",
            &spec,
            Some(&uploaded),
            &mut status,
            at(NOON + 60),
            true,
        );
        assert_eq!(
            status.and_then(|s| s.backups.first().and_then(|b| b.location.clone())),
            Some("s3://backups/ns/db-1.sql".into())
        );
    }

    #[test]
    fn no_backup_asked_removes_a_running_pod_and_keeps_the_records() {
        let spec = MariaDBClusterSpec::default();
        let kept = BackupStatus {
            backups: vec![BackupRecord {
                file: "db-1.sql".into(),
                ..BackupRecord::default()
            }],
            ..BackupStatus::default()
        };
        let mut status = Some(kept.clone());
        let running = pod("Running", "trigger:first", None);
        let plan = plan(
            "db",
            "ns",
            &spec,
            Some(&running),
            &mut status,
            at(NOON),
            true,
        );
        assert!(deletes_pod(&plan));
        assert_eq!(status, Some(kept));
    }
}
