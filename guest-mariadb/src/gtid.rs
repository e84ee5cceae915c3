//! MariaDB GTIDs as the servers report them, and the two questions failover asks of them: does
//! one position contain another (who retrieved the most), and what has a replica executed that
//! the primary never had (an errant transaction).
//!
//! A MariaDB GTID is `domain-server_id-sequence` (`0-1-42`), not MySQL's `uuid:interval` set.
//! A *position* (`@@gtid_binlog_pos`, `@@gtid_current_pos`, `Gtid_IO_Pos`) holds the last GTID
//! of each domain; a *binlog state* (`@@gtid_binlog_state`) the last GTID of each domain and
//! server id. With `gtid_strict_mode` the sequence numbers of a domain only grow, whichever
//! server wrote them (MariaDB KB, "Global Transaction ID", gtid_strict_mode), so "contains" is
//! a per-domain comparison of sequence numbers.

use std::collections::BTreeMap;
use std::fmt;

/// One GTID: `domain-server_id-sequence`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gtid {
    /// Replication domain (`gtid_domain_id`).
    pub domain: u32,
    /// The `server_id` of the server that first wrote it.
    pub server: u32,
    /// Sequence number within the domain.
    pub sequence: u64,
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.sequence)
    }
}

/// A list of GTIDs as a server prints it (`0-1-42,1-3-7`): a position, or a binlog state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GtidList(pub Vec<Gtid>);

/// Why a GTID list does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a MariaDB GTID list (domain-server_id-sequence, comma-separated)")]
pub struct ParseGtidError {
    /// The text the server sent.
    pub text: String,
}

impl GtidList {
    /// Parses what a server prints; the empty string is the empty list.
    pub fn parse(text: &str) -> Result<Self, ParseGtidError> {
        let error = || ParseGtidError {
            text: text.to_owned(),
        };
        let mut gtids = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut fields = part.splitn(3, '-');
            let mut next = || fields.next().ok_or_else(error);
            let domain = next()?.parse().map_err(|_| error())?;
            let server = next()?.parse().map_err(|_| error())?;
            let sequence = next()?.parse().map_err(|_| error())?;
            gtids.push(Gtid {
                domain,
                server,
                sequence,
            });
        }
        Ok(GtidList(gtids))
    }

    /// The highest sequence number of each domain.
    fn per_domain(&self) -> BTreeMap<u32, u64> {
        let mut domains = BTreeMap::new();
        for g in &self.0 {
            let seq = domains.entry(g.domain).or_insert(g.sequence);
            *seq = (*seq).max(g.sequence);
        }
        domains
    }

    /// Whether this position holds everything `other` does: every domain of `other` is here,
    /// at least as far.
    pub fn contains(&self, other: &GtidList) -> bool {
        let mine = self.per_domain();
        other
            .per_domain()
            .iter()
            .all(|(domain, seq)| mine.get(domain).is_some_and(|m| m >= seq))
    }

    /// Both positions merged: per domain, the further one (what a replica holds, counting
    /// what it retrieved and what it executed).
    pub fn union(&self, other: &GtidList) -> GtidList {
        let mut by_domain: BTreeMap<u32, Gtid> = BTreeMap::new();
        for g in self.0.iter().chain(&other.0) {
            let entry = by_domain.entry(g.domain).or_insert(*g);
            if g.sequence > entry.sequence {
                *entry = *g;
            }
        }
        GtidList(by_domain.into_values().collect())
    }

    /// The entries of a replica's binlog state `self` that the primary's binlog state
    /// `primary` lacks: transactions the replica executed and the primary never had (errant).
    /// An entry is covered when the primary saw the same domain and server id at least as far.
    pub fn errant_against(&self, primary: &GtidList) -> Vec<Gtid> {
        self.0
            .iter()
            .filter(|g| {
                !primary.0.iter().any(|p| {
                    p.domain == g.domain && p.server == g.server && p.sequence >= g.sequence
                })
            })
            .copied()
            .collect()
    }

    /// True for the empty list.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for GtidList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(Gtid::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str) -> GtidList {
        GtidList::parse(text).expect("a GTID list")
    }

    #[test]
    fn parses_what_servers_print_and_refuses_the_rest() {
        assert_eq!(list(""), GtidList::default());
        assert_eq!(list("0-1-42,1-3-7").to_string(), "0-1-42,1-3-7");
        for bad in ["0-1", "a-1-2", "0-1-2-3x", "0--2"] {
            assert!(GtidList::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn containment_table() {
        // (situation, position, other, contains)
        let rows = [
            ("anything contains the empty position", "0-1-5", "", true),
            ("the empty position contains nothing", "", "0-1-1", false),
            ("further in the same domain", "0-1-9", "0-1-5", true),
            ("behind in the same domain", "0-1-4", "0-1-5", false),
            (
                "the server id does not matter in a strict domain",
                "0-2-9",
                "0-1-5",
                true,
            ),
            ("a domain missing", "0-1-9", "0-1-5,1-1-1", false),
            ("every domain further", "0-1-9,1-2-3", "0-1-5,1-2-3", true),
        ];
        for (situation, position, other, want) in rows {
            assert_eq!(list(position).contains(&list(other)), want, "{situation}");
        }
    }

    #[test]
    fn errant_transactions_table() {
        // (situation, replica's binlog state, primary's binlog state, errant)
        let rows = [
            ("a fresh replica has none", "", "0-1-10", ""),
            (
                "a replica behind the primary has none",
                "0-1-7",
                "0-1-10",
                "",
            ),
            (
                "a replica that wrote with its own server id has them",
                "0-1-7,0-2-8",
                "0-1-10",
                "0-2-8",
            ),
            (
                "an old primary with writes its successor never received has them",
                "0-1-12",
                "0-1-10,0-2-11",
                "0-1-12",
            ),
            (
                "an old primary whose writes all reached the successor has none",
                "0-1-10",
                "0-1-10,0-2-11",
                "",
            ),
            (
                "a domain the primary never saw is errant",
                "0-1-5,1-1-1",
                "0-1-10",
                "1-1-1",
            ),
        ];
        for (situation, replica, primary, errant) in rows {
            let got = GtidList(list(replica).errant_against(&list(primary)));
            assert_eq!(got, list(errant), "{situation}");
        }
    }

    #[test]
    fn the_union_keeps_the_further_gtid_of_each_domain() {
        assert_eq!(
            list("0-1-5,1-1-2").union(&list("0-2-7")).to_string(),
            "0-2-7,1-1-2"
        );
    }
}
