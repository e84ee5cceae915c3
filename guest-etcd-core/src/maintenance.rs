//! `spec.maintenance`: what keeps an etcd database healthy over time — the history compacted
//! (etcd's own auto-compaction, passed as flags), the backend quota, defragmentation above a
//! share of free pages, and recovery from the NOSPACE alarm.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Smallest database file worth defragmenting when none is given: below it the free pages
/// are too few to matter and a defragmentation only blocks the member for nothing.
pub const DEFAULT_DEFRAGMENT_MIN_BYTES: i64 = 64 << 20;

/// Database maintenance of the members.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceSpec {
    /// etcd's `--auto-compaction-mode`: `periodic` (keep `autoCompactionRetention` of time)
    /// or `revision` (keep that many revisions). Read when a member's pod is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self in ['periodic', 'revision']",
        "message": "spec.maintenance.autoCompactionMode must be periodic or revision"
    }]))]
    pub auto_compaction_mode: Option<String>,
    /// etcd's `--auto-compaction-retention`, e.g. `1h` (periodic) or `10000` (revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compaction_retention: Option<String>,
    /// etcd's `--quota-backend-bytes`: the database size at which etcd raises NOSPACE and
    /// takes no more writes (etcd's default: 2 GiB). Read when a member's pod is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self > 0",
        "message": "spec.maintenance.quotaBackendBytes must be a size in bytes, e.g. 8589934592 for 8 GiB"
    }]))]
    pub quota_backend_bytes: Option<i64>,
    /// Defragment a member when at least this percentage of its database file is free pages
    /// (1 to 100), one member at a time, followers first and the leader last, only while the
    /// cluster is steady.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 1 && self <= 100",
        "message": "spec.maintenance.defragmentAbovePercent must be a percentage from 1 to 100"
    }]))]
    pub defragment_above_percent: Option<i64>,
    /// ... and its database file is at least this large (default 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defragment_min_bytes: Option<i64>,
    /// When etcd raises NOSPACE: compact the history, defragment every member, then disarm
    /// the alarm. Off by default: the alarm is then reported with what to do.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recover_from_no_space: bool,
}

/// A checked `spec.maintenance`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidMaintenance {
    /// Flags for the member pods.
    pub flags: Vec<String>,
    /// `(percent, min bytes)` above which a member is defragmented.
    pub defragment: Option<(i64, i64)>,
    /// Recover from NOSPACE by itself.
    pub recover_from_no_space: bool,
    /// The quota, if set.
    pub quota_backend_bytes: Option<i64>,
}

impl MaintenanceSpec {
    /// Checks the fields; on failure the message says what to write.
    pub fn validate(&self) -> Result<ValidMaintenance, String> {
        let mut flags = Vec::new();
        match self.auto_compaction_mode.as_deref() {
            None => {}
            Some(mode @ ("periodic" | "revision")) => {
                flags.push(format!("--auto-compaction-mode={mode}"))
            }
            Some(other) => {
                return Err(format!(
                    "spec.maintenance.autoCompactionMode {other:?} is not one of periodic, revision"
                ));
            }
        }
        if let Some(retention) = &self.auto_compaction_retention {
            let valid = !retention.is_empty()
                && retention
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.');
            if !valid {
                return Err(format!(
                    "spec.maintenance.autoCompactionRetention {retention:?} is not a duration (1h, 30m) or a revision count (10000)"
                ));
            }
            flags.push(format!("--auto-compaction-retention={retention}"));
        }
        if let Some(quota) = self.quota_backend_bytes {
            if quota <= 0 {
                return Err(format!(
                    "spec.maintenance.quotaBackendBytes is {quota}: give a size in bytes, e.g. 8589934592 for 8 GiB"
                ));
            }
            flags.push(format!("--quota-backend-bytes={quota}"));
        }
        let defragment = match self.defragment_above_percent {
            None => None,
            Some(percent) if (1..=100).contains(&percent) => Some((
                percent,
                self.defragment_min_bytes
                    .unwrap_or(DEFAULT_DEFRAGMENT_MIN_BYTES)
                    .max(0),
            )),
            Some(percent) => {
                return Err(format!(
                    "spec.maintenance.defragmentAbovePercent is {percent}: give a percentage from 1 to 100"
                ));
            }
        };
        Ok(ValidMaintenance {
            flags,
            defragment,
            recover_from_no_space: self.recover_from_no_space,
            quota_backend_bytes: self.quota_backend_bytes,
        })
    }
}
