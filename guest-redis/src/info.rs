//! What a Redis server says about its replication (`INFO replication`), parsed.

/// A server's replication role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Takes writes (`role:master`).
    Primary,
    /// Follows a primary (`role:slave`).
    Replica,
}

/// The fields of `INFO replication` the plugin decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replication {
    /// Primary or replica.
    pub role: Role,
    /// For a replica: the primary it follows.
    pub primary_host: Option<String>,
    /// For a replica: the primary's port.
    pub primary_port: Option<u16>,
    /// For a replica: whether its link to the primary is up.
    pub link_up: bool,
    /// The replication offset: how much of the primary's stream this server has
    /// (`slave_repl_offset` for a replica, `master_repl_offset` for a primary).
    pub offset: i64,
}

impl Replication {
    /// Parses the text of `INFO replication` (`key:value` lines); `None` without a `role`.
    pub fn parse(text: &str) -> Option<Replication> {
        let field = |key: &str| {
            text.lines()
                .filter_map(|line| line.trim_end().split_once(':'))
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_owned())
        };
        let role = match field("role")?.as_str() {
            "master" => Role::Primary,
            "slave" => Role::Replica,
            _ => return None,
        };
        let offset_key = match role {
            Role::Primary => "master_repl_offset",
            Role::Replica => "slave_repl_offset",
        };
        Some(Replication {
            role,
            primary_host: field("master_host"),
            primary_port: field("master_port").and_then(|p| p.parse().ok()),
            link_up: field("master_link_status").as_deref() == Some("up"),
            offset: field(offset_key).and_then(|o| o.parse().ok()).unwrap_or(0),
        })
    }

    /// A primary (tests and examples).
    pub fn primary(offset: i64) -> Replication {
        Replication {
            role: Role::Primary,
            primary_host: None,
            primary_port: None,
            link_up: false,
            offset,
        }
    }

    /// A replica following `host` (tests and examples).
    pub fn replica_of(host: &str, link_up: bool, offset: i64) -> Replication {
        Replication {
            role: Role::Replica,
            primary_host: Some(host.to_owned()),
            primary_port: Some(crate::children::REDIS_PORT),
            link_up,
            offset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_replication_parses_for_both_roles() {
        let replica = "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.5\r\nmaster_port:6379\r\nmaster_link_status:up\r\nslave_repl_offset:1234\r\nmaster_repl_offset:1234\r\n";
        assert_eq!(
            Replication::parse(replica),
            Some(Replication::replica_of("127.0.0.5", true, 1234))
        );
        let primary = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.6,port=6379,state=online,offset=99,lag=0\r\nmaster_repl_offset:99\r\n";
        assert_eq!(Replication::parse(primary), Some(Replication::primary(99)));
        assert_eq!(Replication::parse("# Replication\r\n"), None);
    }
}
