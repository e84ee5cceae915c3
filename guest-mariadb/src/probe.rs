//! What the plugin asks each server, and the answer as facts: is it read-only, what has it
//! written and executed (GTIDs), and whom does it replicate from, how far.
//!
//! Two statements per server and decision: one `SELECT` of global variables, and
//! `SHOW SLAVE STATUS` (MariaDB 10.11 also knows `SHOW REPLICA STATUS`; the older name works
//! on every 10.x).

use crate::gtid::{GtidList, ParseGtidError};
use crate::wire::ResultSet;

/// The global variables read from every server.
pub const VARIABLES_SQL: &str = "SELECT @@global.read_only AS read_only, \
@@global.gtid_binlog_pos AS binlog_pos, @@global.gtid_binlog_state AS binlog_state, \
@@global.gtid_current_pos AS current_pos, @@global.gtid_slave_pos AS slave_pos, \
@@global.rpl_semi_sync_master_enabled AS semi_sync, \
(SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_STATUS') AS semi_sync_status";

/// The replication link's state.
pub const REPLICA_STATUS_SQL: &str = "SHOW SLAVE STATUS";

/// One server's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// `@@read_only`: no writes but from accounts with `READ_ONLY ADMIN` (root has it).
    pub read_only: bool,
    /// `@@gtid_binlog_pos`: the last GTID per domain in its binlog (its own writes and, with
    /// `log_slave_updates`, what it applied).
    pub binlog_pos: GtidList,
    /// `@@gtid_binlog_state`: the last GTID per domain and server id: what errant-transaction
    /// checks compare.
    pub binlog_state: GtidList,
    /// `@@gtid_current_pos`: what it executed, as a replica or a primary.
    pub current_pos: GtidList,
    /// `@@gtid_slave_pos`: what it applied as a replica.
    pub slave_pos: GtidList,
    /// `@@rpl_semi_sync_master_enabled`: commits wait for a replica's acknowledgement.
    pub semi_sync_primary: bool,
    /// The status `Rpl_semi_sync_master_status`: semi-sync is in force (enabled, and not
    /// fallen back to asynchronous for want of an acknowledging replica).
    pub semi_sync_active: bool,
    /// Its replication link, if one is configured.
    pub link: Option<Link>,
}

/// A configured replication link (`SHOW SLAVE STATUS`, one row).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Link {
    /// `Master_Host`.
    pub source_host: String,
    /// `Slave_IO_Running` is `Yes` or `Connecting`: the IO thread lives and may still
    /// retrieve (and acknowledge) the source's transactions.
    pub io_running: bool,
    /// `Slave_SQL_Running` is `Yes`.
    pub sql_running: bool,
    /// `Using_Gtid` is `Slave_Pos`.
    pub uses_slave_pos: bool,
    /// `Gtid_IO_Pos`: what it retrieved from the source.
    pub io_pos: GtidList,
    /// `Last_IO_Error` or `Last_SQL_Error`, whichever is set.
    pub last_error: String,
}

impl Probe {
    /// Everything this server holds: what it executed and what it retrieved but may not have
    /// applied yet. Failover compares these.
    pub fn holds(&self) -> GtidList {
        let retrieved = self
            .link
            .as_ref()
            .map(|l| l.io_pos.clone())
            .unwrap_or_default();
        self.current_pos.union(&retrieved)
    }

    /// Whether this server has written transactions of its own beyond what it applied as a
    /// replica (an old primary): it rejoins with `MASTER_DEMOTE_TO_SLAVE=1`, which makes its
    /// replication position start from what it wrote.
    pub fn wrote_as_primary(&self) -> bool {
        !self.slave_pos.contains(&self.binlog_pos)
    }

    /// Replication running with both threads.
    pub fn replicating(&self) -> bool {
        self.link
            .as_ref()
            .is_some_and(|l| l.io_running && l.sql_running)
    }
}

/// Why an answer does not make a [`Probe`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// A column is missing (not a MariaDB server, or another version's names).
    #[error("the server's answer lacks `{0}`; is it MariaDB 10.5 or later?")]
    Missing(&'static str),
    /// A GTID list does not parse.
    #[error(transparent)]
    Gtid(#[from] ParseGtidError),
}

fn flag(text: Option<&str>) -> bool {
    matches!(text, Some("1" | "ON" | "Yes"))
}

/// The probe from the answers to [`VARIABLES_SQL`] and [`REPLICA_STATUS_SQL`].
pub fn from_answers(variables: &ResultSet, link: &ResultSet) -> Result<Probe, ProbeError> {
    if variables.rows.is_empty() {
        return Err(ProbeError::Missing("read_only"));
    }
    let list = |column: &'static str| -> Result<GtidList, ProbeError> {
        if !variables.columns.iter().any(|c| c == column) {
            return Err(ProbeError::Missing(column));
        }
        Ok(GtidList::parse(variables.get(0, column).unwrap_or(""))?)
    };
    let link = if link.rows.is_empty() {
        None
    } else {
        let text = |column: &'static str| link.get(0, column).unwrap_or("");
        Some(Link {
            source_host: text("Master_Host").to_owned(),
            io_running: matches!(text("Slave_IO_Running"), "Yes" | "Connecting"),
            sql_running: text("Slave_SQL_Running") == "Yes",
            uses_slave_pos: text("Using_Gtid") == "Slave_Pos",
            io_pos: GtidList::parse(text("Gtid_IO_Pos"))?,
            last_error: [text("Last_IO_Error"), text("Last_SQL_Error")]
                .into_iter()
                .find(|e| !e.is_empty())
                .unwrap_or("")
                .to_owned(),
        })
    };
    Ok(Probe {
        read_only: flag(variables.get(0, "read_only")),
        binlog_pos: list("binlog_pos")?,
        binlog_state: list("binlog_state")?,
        current_pos: list("current_pos")?,
        slave_pos: list("slave_pos")?,
        semi_sync_primary: flag(variables.get(0, "semi_sync")),
        semi_sync_active: flag(variables.get(0, "semi_sync_status")),
        link,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(columns: &[&str], row: &[Option<&str>]) -> ResultSet {
        ResultSet {
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: vec![row.iter().map(|v| v.map(str::to_owned)).collect()],
        }
    }

    #[test]
    fn a_replica_answer_becomes_its_probe() {
        let variables = set(
            &[
                "read_only",
                "binlog_pos",
                "binlog_state",
                "current_pos",
                "slave_pos",
                "semi_sync",
            ],
            &[
                Some("1"),
                Some("0-1-9"),
                Some("0-1-9"),
                Some("0-1-9"),
                Some("0-1-9"),
                Some("0"),
            ],
        );
        let link = set(
            &[
                "Master_Host",
                "Slave_IO_Running",
                "Slave_SQL_Running",
                "Using_Gtid",
                "Gtid_IO_Pos",
                "Last_IO_Error",
                "Last_SQL_Error",
            ],
            &[
                Some("db-0.db-headless"),
                Some("Connecting"),
                Some("Yes"),
                Some("Slave_Pos"),
                Some("0-1-12"),
                Some("error connecting to master"),
                Some(""),
            ],
        );
        let probe = from_answers(&variables, &link).expect("a probe");
        assert!(probe.read_only);
        let l = probe.link.clone().expect("a link");
        assert!(l.io_running, "Connecting is a live IO thread");
        assert!(l.uses_slave_pos);
        assert_eq!(l.last_error, "error connecting to master");
        assert_eq!(probe.holds().to_string(), "0-1-12", "retrieved counts");
        assert!(!probe.wrote_as_primary());
    }

    #[test]
    fn an_answer_without_gtid_variables_is_refused_naming_the_column() {
        let variables = set(&["read_only"], &[Some("0")]);
        assert_eq!(
            from_answers(&variables, &ResultSet::default()),
            Err(ProbeError::Missing("binlog_pos"))
        );
    }
}
