//! The MariaDB plugin's domain metrics, as MOCO exports them for MySQL: failovers and
//! switchovers, errant replicas, and how far each replica is behind the primary. The host
//! exports them per MariaDBCluster as `policy_host_plugin_mariadb_<name>` (counters with
//! `_total`).
//!
//! A failover or switchover is counted in the decision that promotes (the one that records its
//! Event): the host adds it once that decision is carried out, status included, and the next
//! decisions see the new primary in status and promote nobody.

use policy_host_sdk::metrics::{Counter, Gauge, Metric, Sample};

use crate::gtid::GtidList;
use crate::spec::MariaDBClusterStatus;

/// Failovers: a lost primary replaced by the replica holding every other's transactions.
pub const FAILOVERS: Counter = Counter::new(
    "failovers",
    "Failovers: a lost primary replaced by the replica that holds every other's transactions",
);
/// Switchovers carried out on request.
pub const SWITCHOVERS: Counter = Counter::new(
    "switchovers",
    "Switchovers carried out on request (the switchover annotation)",
);
/// Replicas holding transactions the primary lacks.
pub const ERRANT_REPLICAS: Gauge = Gauge::new(
    "errant_replicas",
    "Replicas holding transactions the primary lacks (quarantined, never promoted)",
);
/// Transactions a replica is behind the primary.
pub const REPLICA_LAG: Gauge = Gauge::new(
    "replica_lag_transactions",
    "Transactions of the primary's binlog a replica has not executed yet, summed over GTID domains",
)
.labelled(&["replica"]);
/// Replicas replicating from the primary.
pub const READY_REPLICAS: Gauge = Gauge::new(
    "ready_replicas",
    "Replicas replicating from the primary with both threads running",
);
/// Replicas the spec asks for.
pub const REPLICAS_DESIRED: Gauge = Gauge::new(
    "replicas_desired",
    "Replicas the spec asks for (spec.replicas)",
);
/// 1 while a primary takes writes.
pub const PRIMARY_WRITABLE: Gauge = Gauge::new(
    "primary_writable",
    "1 while the primary takes writes (condition Available), 0 otherwise",
);

/// Every metric the plugin declares.
pub fn declared() -> Vec<Metric> {
    vec![
        Metric::Counter(&FAILOVERS),
        Metric::Counter(&SWITCHOVERS),
        Metric::Gauge(&ERRANT_REPLICAS),
        Metric::Gauge(&REPLICA_LAG),
        Metric::Gauge(&READY_REPLICAS),
        Metric::Gauge(&REPLICAS_DESIRED),
        Metric::Gauge(&PRIMARY_WRITABLE),
    ]
}

/// Transactions of `primary` that `replica` has not executed: per domain, the primary's last
/// sequence number less the replica's (nothing when the replica is ahead, which errant checks
/// judge, not this one).
pub fn lag(primary: &GtidList, replica: &GtidList) -> u64 {
    primary
        .0
        .iter()
        .map(|p| {
            let executed = replica
                .0
                .iter()
                .filter(|r| r.domain == p.domain)
                .map(|r| r.sequence)
                .max()
                .unwrap_or(0);
            p.sequence.saturating_sub(executed)
        })
        .sum()
}

/// What one decision knew, for its metrics.
pub struct Seen<'a> {
    /// The status it writes.
    pub status: &'a MariaDBClusterStatus,
    /// `spec.replicas`.
    pub desired: i32,
    /// The primary's `@@gtid_binlog_pos`, when the primary answered.
    pub primary_pos: Option<&'a GtidList>,
    /// Each replica that answered, with its `@@gtid_current_pos`.
    pub replicas: Vec<(&'a str, &'a GtidList)>,
    /// Reasons of the Events the decision records.
    pub events: Vec<&'a str>,
}

/// The samples of one decision.
pub fn report(seen: &Seen<'_>) -> Vec<Sample> {
    let status = seen.status;
    let writable = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Available" && c.status == "True");
    let mut samples = vec![
        Sample::gauge(&ERRANT_REPLICAS, &[], status.errant_replicas.len() as f64),
        Sample::gauge(&READY_REPLICAS, &[], f64::from(status.ready_replicas)),
        Sample::gauge(&REPLICAS_DESIRED, &[], f64::from(seen.desired)),
        Sample::gauge(&PRIMARY_WRITABLE, &[], if writable { 1.0 } else { 0.0 }),
    ];
    if let Some(primary) = seen.primary_pos {
        for (name, executed) in &seen.replicas {
            samples.push(Sample::gauge(
                &REPLICA_LAG,
                &[name],
                lag(primary, executed) as f64,
            ));
        }
    }
    for (reason, counter) in [("Failover", &FAILOVERS), ("Switchover", &SWITCHOVERS)] {
        let times = seen.events.iter().filter(|r| **r == reason).count();
        if times > 0 {
            samples.push(Sample::count(counter, &[], times as u64));
        }
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gtids(text: &str) -> GtidList {
        GtidList::parse(text).expect("valid GTIDs")
    }

    /// Each row: the primary's binlog position, a replica's executed position, the lag.
    #[test]
    fn lag_is_the_primary_transactions_a_replica_has_not_executed() {
        for (situation, primary, replica, lag_expected) in [
            ("caught up", "0-1-42", "0-1-42", 0),
            ("behind", "0-1-42", "0-1-40", 2),
            ("nothing executed yet", "0-1-42", "", 42),
            ("two domains", "0-1-42,1-2-10", "0-1-41,1-2-7", 4),
            ("ahead is no lag", "0-1-42", "0-2-50", 0),
        ] {
            assert_eq!(
                lag(&gtids(primary), &gtids(replica)),
                lag_expected,
                "{situation}"
            );
        }
    }
}
