//! The decisions: which server is the primary, who follows it, which Pods exist, and what the
//! status says. Pure: facts in ([`Facts`]: the parent, each server's Pod and what it said to
//! `INFO replication`), a [`Plan`] out (Redis commands to send, then Kubernetes actions).
//!
//! The rules:
//! - The primary is `status.primary`, persisted so that a restarted host (or a fresh instance,
//!   since decisions are stateless) never elects another while it lives.
//! - A primary is lost when its Pod is gone or has ended (Failed or Succeeded). Then the replica
//!   with the largest replication offset is promoted (`REPLICAOF NO ONE`): it holds the most of
//!   the primary's stream, so every write a replica acknowledged (Redis `WAIT`) survives on it.
//!   A server already promoted by an earlier decision whose status never landed counts with
//!   its offset, so the same one is chosen again (see `promotion_candidate`).
//!   A primary that runs but does not answer is not replaced: it may still take writes.
//! - With no replica to promote, nothing is elected: an empty server would make its replicas
//!   drop their data. A server with offset 0 (none of the primary's stream: fresh, or a replica
//!   that never finished its first sync) is none: the one with the data may only be slow to
//!   answer. Nor is the lost primary's Pod created again under its name, where a fresh, empty
//!   server would pass for it. The status says `Degraded` until a replica with data answers, or
//!   every other server answers with offset 0 (then no copy of the stream is left and the
//!   lowest ordinal takes over), or, with a single server, the dead one is replaced: there was
//!   no copy to keep.
//! - Every other answering server follows the primary (`REPLICAOF <primary IP> 6379`).
//! - Pods `<name>-0..replicas-1`; an ended one is deleted (and created again, fresh, as a
//!   replica, on the next reconcile); the primary is never deleted by a scale-down.

use policy_host_sdk::conditions::{Condition, already_set, set_condition};
use policy_host_sdk::prelude::*;

use crate::children::{self, REDIS_PORT};
use crate::info::{Replication, Role};
use crate::spec::{RedisReplicationSpec, RedisReplicationStatus};
use policy_host_sdk::children::pod_kind;

/// Reconcile again this soon while anything is moving (ms).
pub const REQUEUE_BUSY_MS: u64 = 2_000;

/// Reconcile again this soon when all is well, to notice a broken link (ms).
pub const REQUEUE_STEADY_MS: u64 = 10_000;

/// One Redis server as observed: its Pod, and its answer to `INFO replication`.
#[derive(Clone, Debug, PartialEq)]
pub struct Server {
    /// Pod name.
    pub name: String,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// The image the Pod was created with.
    pub image: String,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, ...).
    pub phase: String,
    /// The Pod is being deleted.
    pub deleting: bool,
    /// What it said to `INFO replication`; `None` if it was not asked or did not answer.
    pub replication: Option<Replication>,
}

impl Server {
    /// The process has ended for good (`restartPolicy: Never`).
    pub fn ended(&self) -> bool {
        !self.deleting && matches!(self.phase.as_str(), "Failed" | "Succeeded")
    }

    /// Running, or about to.
    pub fn alive(&self) -> bool {
        !self.deleting && !self.ended()
    }

    /// Worth asking `INFO replication`: running with an IP.
    pub fn reachable(&self) -> bool {
        self.alive() && self.phase == "Running" && self.ip.is_some()
    }
}

/// Everything a decision is made from.
#[derive(Clone, Debug, PartialEq)]
pub struct Facts {
    /// `metadata.name` of the RedisReplication.
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The spec.
    pub spec: RedisReplicationSpec,
    /// The status as last written.
    pub status: RedisReplicationStatus,
    /// The server Pods the parent controls.
    pub servers: Vec<Server>,
    /// The observation's time.
    pub now: Timestamp,
}

/// A Redis command for one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `REPLICAOF NO ONE`: take writes.
    Promote {
        /// Pod name.
        pod: String,
    },
    /// `REPLICAOF <host> 6379`: follow the primary at `host`.
    Follow {
        /// Pod name.
        pod: String,
        /// The primary's IP.
        host: String,
    },
}

/// What to do: commands first (a failed one fails the reconcile before any action, so the
/// status never claims a promotion that did not happen), then the actions.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Redis commands, in order.
    pub commands: Vec<Command>,
    /// Kubernetes actions, in order.
    pub actions: Vec<Action>,
    /// When to look again.
    pub requeue_after_ms: Option<u64>,
}

/// Decides, from the facts alone.
pub fn decide(facts: &Facts) -> Plan {
    let mut status = facts.status.clone();
    let mut actions = Vec::new();
    // A name cannot be fixed by editing the spec: say so before anything else.
    let invalid = policy_host_sdk::names::check_child_names(&facts.name, children::CHILD_NAMES)
        .err()
        .map(|e| e.to_string())
        .or_else(|| facts.spec.invalid());
    if let Some(message) = invalid {
        let degraded = Condition::new("Degraded", true, "InvalidSpec", message.clone())
            .observed(facts.generation);
        if !already_set(&status.conditions, &degraded) {
            actions.push(Action::RecordEvent(Event::warning("InvalidSpec", message)));
        }
        set_condition(&mut status.conditions, degraded, facts.now);
        actions.push(status_action(&status));
        return Plan {
            commands: Vec::new(),
            actions,
            requeue_after_ms: None,
        };
    }

    let server = |name: &str| facts.servers.iter().find(|s| s.name == name);
    let mut commands = Vec::new();
    let mut primary_lost_without_candidate = false;
    let mut lost_primary_streaming = false;
    let primary: Option<String> = match status.primary.clone() {
        Some(current) if server(&current).is_some_and(Server::alive) => Some(current),
        Some(lost) if lost_primary_may_stream(facts, &lost) => {
            lost_primary_streaming = true;
            Some(lost)
        }
        Some(lost) => match promotion_candidate(facts, &lost) {
            Some(candidate) => {
                let offset = candidate.replication.as_ref().map_or(0, |r| r.offset);
                actions.push(Action::RecordEvent(Event::warning(
                    "Failover",
                    format!(
                        "primary {lost} is gone; promoted {} (replication offset {offset}, the largest of the answering replicas)",
                        candidate.name
                    ),
                )));
                commands.push(Command::Promote {
                    pod: candidate.name.clone(),
                });
                Some(candidate.name.clone())
            }
            None => match no_copy_left(facts, &lost) {
                Some(fresh) => {
                    actions.push(Action::RecordEvent(Event::warning(
                        "Failover",
                        format!(
                            "primary {lost} is gone; promoted {} (replication offset 0: no server has any of its stream)",
                            fresh.name
                        ),
                    )));
                    commands.push(Command::Promote {
                        pod: fresh.name.clone(),
                    });
                    Some(fresh.name.clone())
                }
                None => {
                    primary_lost_without_candidate = true;
                    Some(lost)
                }
            },
        },
        None => first_primary(facts).inspect(|elected| {
            actions.push(Action::RecordEvent(Event::normal(
                "PrimaryElected",
                format!("{elected} is the primary"),
            )));
        }),
    };
    let promoted_now = commands
        .iter()
        .any(|c| matches!(c, Command::Promote { .. }));

    // Pods: ended ones go (the primary only once replaced, or when it was the only copy),
    // missing ones come, live ones keep their spec and get their role label.
    let wanted = u32::try_from(facts.spec.replicas).unwrap_or(0);
    for s in &facts.servers {
        let is_primary = primary.as_deref() == Some(s.name.as_str());
        let in_range = children::ordinal(&facts.name, &s.name).is_some_and(|o| o < wanted);
        if s.deleting {
            continue;
        }
        if s.ended() {
            let keep = is_primary && primary_lost_without_candidate && facts.spec.replicas > 1;
            if !keep {
                actions.push(delete_pod(&s.name));
            }
            continue;
        }
        if !in_range && !is_primary {
            actions.push(delete_pod(&s.name));
            continue;
        }
        actions.push(Action::Apply(children::server_pod(
            &facts.name,
            &s.name,
            &s.image,
            is_primary,
        )));
    }
    // Not under the name of a lost primary not replaced yet (still streaming, or no replica
    // answers to take over): the fresh, empty server would pass for it and its replicas would
    // copy the emptiness (fault campaign, redis seeds 13, 14). A single server had no copy.
    let lost_unreplaced =
        lost_primary_streaming || (primary_lost_without_candidate && facts.spec.replicas > 1);
    for ordinal in 0..wanted {
        let name = children::pod_name(&facts.name, ordinal);
        if lost_unreplaced && primary.as_deref() == Some(name.as_str()) {
            continue;
        }
        if server(&name).is_none() {
            let is_primary = primary.as_deref() == Some(name.as_str());
            actions.push(Action::Apply(children::server_pod(
                &facts.name,
                &name,
                &children::image(&facts.spec.version),
                is_primary,
            )));
        }
    }
    actions.push(Action::Apply(children::client_service(&facts.name)));

    // Replication: the primary takes writes, every other answering server follows it.
    let primary_server = primary
        .as_deref()
        .and_then(server)
        .filter(|s| s.reachable());
    if let Some(p) =
        primary_server.filter(|_| !primary_lost_without_candidate && !lost_primary_streaming)
    {
        if !promoted_now
            && p.replication
                .as_ref()
                .is_some_and(|r| r.role == Role::Replica)
        {
            commands.push(Command::Promote {
                pod: p.name.clone(),
            });
        }
        let host = p.ip.clone().unwrap_or_default();
        for s in facts
            .servers
            .iter()
            .filter(|s| s.name != p.name && s.reachable())
        {
            let Some(r) = &s.replication else { continue };
            let follows = r.role == Role::Replica
                && r.primary_host.as_deref() == Some(host.as_str())
                && r.primary_port == Some(REDIS_PORT);
            if !follows || promoted_now {
                commands.push(Command::Follow {
                    pod: s.name.clone(),
                    host: host.clone(),
                });
            }
        }
    }

    // Status.
    let primary_ip = primary_server.and_then(|p| p.ip.clone());
    let following: Vec<String> = if promoted_now {
        Vec::new()
    } else {
        facts
            .servers
            .iter()
            .filter(|s| Some(&s.name) != primary.as_ref() && s.reachable())
            .filter(|s| {
                s.replication.as_ref().is_some_and(|r| {
                    r.role == Role::Replica && r.link_up && r.primary_host == primary_ip
                })
            })
            .map(|s| s.name.clone())
            .collect()
    };
    let answering = facts
        .servers
        .iter()
        .filter(|s| s.reachable() && s.replication.is_some());
    status.primary = primary.clone();
    status.ready_replicas = i32::try_from(answering.count()).unwrap_or(i32::MAX);
    status.following_replicas = i32::try_from(following.len()).unwrap_or(i32::MAX);
    status.replicas = following;
    status.observed_generation = facts.generation;
    let serving =
        primary_server.is_some_and(|p| p.replication.is_some()) && !primary_lost_without_candidate;
    let converged = serving
        && !promoted_now
        && commands.is_empty()
        && status.following_replicas == facts.spec.replicas - 1;
    let available = match (&primary, serving) {
        (Some(p), true) => Condition::new(
            "Available",
            true,
            "PrimaryServing",
            format!("{p} takes writes"),
        ),
        (Some(p), false) => Condition::new(
            "Available",
            false,
            "PrimaryNotServing",
            format!("primary {p} does not answer"),
        ),
        (None, _) => Condition::new("Available", false, "NoPrimary", "no server answers yet"),
    };
    let progressing = if converged {
        Condition::new(
            "Progressing",
            false,
            "Converged",
            format!("{} replicas follow the primary", status.following_replicas),
        )
    } else {
        Condition::new(
            "Progressing",
            true,
            "Converging",
            format!(
                "{} of {} replicas follow the primary",
                status.following_replicas,
                facts.spec.replicas - 1
            ),
        )
    };
    let degraded = if lost_primary_streaming {
        Condition::new(
            "Degraded",
            true,
            "PrimaryStillStreaming",
            format!(
                "primary {}'s Pod is gone or going but a replica still receives from it: its process has not ended yet, so the replicas' offsets still move; the replica with the most of its writes is promoted once it ends",
                primary.clone().unwrap_or_default()
            ),
        )
    } else if primary_lost_without_candidate {
        Condition::new(
            "Degraded",
            true,
            "PrimaryLostNoReplica",
            format!(
                "primary {} is gone and no replica answers to take over; waiting for one",
                primary.clone().unwrap_or_default()
            ),
        )
    } else if promoted_now {
        Condition::new(
            "Degraded",
            true,
            "FailedOver",
            "the primary was lost; a replica took over",
        )
    } else if facts.servers.iter().any(Server::ended) {
        Condition::new(
            "Degraded",
            true,
            "ServerLost",
            "a server ended; it is being replaced",
        )
    } else {
        Condition::new("Degraded", false, "Healthy", "no server lost")
    };
    if primary_lost_without_candidate && !already_set(&status.conditions, &degraded) {
        actions.push(Action::RecordEvent(Event::warning(
            "PrimaryLost",
            degraded.message.clone(),
        )));
    }
    for condition in [available, progressing, degraded] {
        set_condition(
            &mut status.conditions,
            condition.observed(facts.generation),
            facts.now,
        );
    }
    actions.push(status_action(&status));
    Plan {
        commands,
        actions,
        requeue_after_ms: Some(if converged {
            REQUEUE_STEADY_MS
        } else {
            REQUEUE_BUSY_MS
        }),
    }
}

/// Whether the lost primary's process may still be taking writes and streaming them: its
/// Pod is gone (a grace-0 delete removes it before the kubelet kills the container) or being
/// deleted, not ended, and a replica's link to a host that is none of the other live servers
/// still says up. Until that link drops the replicas' offsets still move, so the largest read
/// now may not be the largest once the primary stops: a replica `WAIT` saw acknowledge a write
/// could be passed over and the write lost (fault campaign, redis seeds 1 and 4). A primary
/// whose process ended (the Pod `Failed`) streams nothing more: its replicas' offsets are final.
fn lost_primary_may_stream(facts: &Facts, lost: &str) -> bool {
    let lost_server = facts.servers.iter().find(|s| s.name == lost);
    if lost_server.is_some_and(Server::ended) {
        return false;
    }
    let others: Vec<&str> = facts
        .servers
        .iter()
        .filter(|s| s.name != lost && s.alive())
        .filter_map(|s| s.ip.as_deref())
        .collect();
    facts
        .servers
        .iter()
        .filter(|s| s.name != lost && s.reachable())
        .filter_map(|s| s.replication.as_ref())
        .any(|r| {
            r.role == Role::Replica
                && r.link_up
                && r.primary_host
                    .as_deref()
                    .is_some_and(|host| !others.contains(&host))
        })
}

/// The server holding the most of the lost primary's stream (ties: the lowest ordinal): a
/// replica, or one already taking writes with data. The latter was promoted by a decision
/// whose status never landed (the host stopped between the command and the status write, or
/// the status write was refused as stale); promoted, its offset only grew, so it is chosen
/// again rather than a second server made primary beside it. A server with offset 0 holds
/// none of the stream (a fresh one, or a replica that never finished its first sync): never a
/// candidate, as a replica with the data may only be slow to answer; [`no_copy_left`] decides
/// when there is none.
fn promotion_candidate<'a>(facts: &'a Facts, lost: &str) -> Option<&'a Server> {
    facts
        .servers
        .iter()
        .filter(|s| s.name != lost && s.reachable())
        .filter_map(|s| {
            let r = s.replication.as_ref().filter(|r| r.offset > 0)?;
            Some((
                r.offset,
                std::cmp::Reverse(children::ordinal(&facts.name, &s.name)),
                s,
            ))
        })
        .max_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)))
        .map(|(_, _, s)| s)
}

/// The server that takes over from a lost primary whose stream no server has a copy of: every
/// other server the spec wants runs and answers with offset 0, and no other live server has
/// more. Nothing is kept by waiting then, and no one would ever become a candidate; the lowest
/// ordinal is promoted, as the first primary is. (Offset 0 is not always a server without
/// keys: a replica whose first sync carried a snapshot no write has followed yet says 0 too;
/// none of them is then better than another.) `None` while any server may have more or has
/// not answered.
fn no_copy_left<'a>(facts: &'a Facts, lost: &str) -> Option<&'a Server> {
    let empty = |s: &Server| s.reachable() && s.replication.as_ref().is_some_and(|r| r.offset == 0);
    let wanted = u32::try_from(facts.spec.replicas).unwrap_or(0);
    let mut others = (0..wanted)
        .map(|o| children::pod_name(&facts.name, o))
        .filter(|name| name != lost)
        .map(|name| facts.servers.iter().find(|s| s.name == name))
        .peekable();
    others.peek()?;
    let others: Option<Vec<&Server>> = others.collect();
    let others = others.filter(|o| o.iter().all(|s| empty(s)))?;
    let data_elsewhere = facts
        .servers
        .iter()
        .any(|s| s.name != lost && s.alive() && !empty(s));
    if data_elsewhere {
        return None;
    }
    others.into_iter().next()
}

/// The first primary of a new resource: a server already taking writes with the most data,
/// else the lowest ordinal that answers.
fn first_primary(facts: &Facts) -> Option<String> {
    facts
        .servers
        .iter()
        .filter(|s| s.reachable())
        .filter_map(|s| {
            let r = s.replication.as_ref().filter(|r| r.role == Role::Primary)?;
            Some((
                r.offset,
                std::cmp::Reverse(children::ordinal(&facts.name, &s.name)),
                &s.name,
            ))
        })
        .max_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)))
        .map(|(_, _, name)| name.clone())
}

fn delete_pod(name: &str) -> Action {
    Action::Delete {
        kind: pod_kind(),
        name: name.to_owned(),
    }
}

fn status_action(status: &RedisReplicationStatus) -> Action {
    Action::SetStatus(serde_json::to_value(status).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(ordinal: u32, phase: &str, replication: Option<Replication>) -> Server {
        Server {
            name: format!("r-{ordinal}"),
            ip: (phase == "Running").then(|| format!("10.0.0.{ordinal}")),
            image: "redis:7.0.15".into(),
            phase: phase.into(),
            deleting: false,
            replication,
        }
    }

    fn primary(ordinal: u32, offset: i64) -> Server {
        server(ordinal, "Running", Some(Replication::primary(offset)))
    }

    fn replica(ordinal: u32, of: u32, offset: i64) -> Server {
        server(
            ordinal,
            "Running",
            Some(Replication::replica_of(
                &format!("10.0.0.{of}"),
                true,
                offset,
            )),
        )
    }

    /// A replica whose link to its primary has dropped (the primary's process ended).
    fn orphan(ordinal: u32, of: u32, offset: i64) -> Server {
        server(
            ordinal,
            "Running",
            Some(Replication::replica_of(
                &format!("10.0.0.{of}"),
                false,
                offset,
            )),
        )
    }

    fn facts(primary: Option<&str>, replicas: i32, servers: Vec<Server>) -> Facts {
        Facts {
            name: "r".into(),
            generation: Some(1),
            spec: RedisReplicationSpec {
                replicas,
                version: "7.0.15".into(),
            },
            status: RedisReplicationStatus {
                primary: primary.map(str::to_owned),
                ..Default::default()
            },
            servers,
            now: Timestamp {
                seconds: 1_700_000_000,
                nanoseconds: 0,
            },
        }
    }

    fn promote(ordinal: u32) -> Command {
        Command::Promote {
            pod: format!("r-{ordinal}"),
        }
    }

    fn follow(ordinal: u32, of: u32) -> Command {
        Command::Follow {
            pod: format!("r-{ordinal}"),
            host: format!("10.0.0.{of}"),
        }
    }

    struct Outcome {
        primary: Option<String>,
        deleted: Vec<String>,
        created_primary_label: Vec<String>,
        degraded: String,
        events: Vec<String>,
    }

    fn outcome(plan: &Plan) -> Outcome {
        let status = plan.actions.iter().rev().find_map(|a| match a {
            Action::SetStatus(s) => Some(s.clone()),
            _ => None,
        });
        let status = status.unwrap_or_default();
        let degraded = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Degraded")
            .map(|c| {
                format!(
                    "{}:{}",
                    c["status"].as_str().unwrap_or(""),
                    c["reason"].as_str().unwrap_or("")
                )
            })
            .unwrap_or_default();
        Outcome {
            primary: status["primary"].as_str().map(str::to_owned),
            deleted: plan
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Delete { name, .. } => Some(name.clone()),
                    _ => None,
                })
                .collect(),
            created_primary_label: plan
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Apply(o)
                        if o["metadata"]["labels"][children::ROLE_LABEL] == "primary" =>
                    {
                        o["metadata"]["name"].as_str().map(str::to_owned)
                    }
                    _ => None,
                })
                .collect(),
            degraded,
            events: plan
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::RecordEvent(e) => Some(e.reason.clone()),
                    _ => None,
                })
                .collect(),
        }
    }

    /// Fault campaign, redis seeds 13 and 14: while the lost primary still streamed, its Pod
    /// was created again under its name, with the primary label; the fresh, empty server then
    /// passed for the primary and every replica copied its emptiness.
    #[test]
    fn a_lost_primary_still_streaming_is_not_recreated_under_its_name() {
        let plan = decide(&facts(
            Some("r-0"),
            3,
            vec![replica(1, 0, 100), orphan(2, 0, 90)],
        ));
        let created: Vec<&str> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Apply(o) if o["kind"] == "Pod" => o["metadata"]["name"].as_str(),
                _ => None,
            })
            .collect();
        assert!(!created.contains(&"r-0"), "{created:?}");
    }

    /// The lost primary's Pod is gone and no replica answers to take over: created again
    /// under its name, with the primary label, the fresh, empty server would pass for the
    /// primary (it is the one the status names, alive) and the replicas, once they answer,
    /// would be told to follow it and copy its emptiness.
    #[test]
    fn a_lost_primary_with_no_replica_answering_is_not_recreated_under_its_name() {
        let plan = decide(&facts(
            Some("r-0"),
            3,
            vec![server(1, "Running", None), server(2, "Running", None)],
        ));
        let created: Vec<&str> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Apply(o) if o["kind"] == "Pod" => o["metadata"]["name"].as_str(),
                _ => None,
            })
            .collect();
        assert!(!created.contains(&"r-0"), "{created:?}");
        assert_eq!(outcome(&plan).degraded, "True:PrimaryLostNoReplica");
    }

    #[test]
    fn decision_table() {
        struct Row {
            situation: &'static str,
            facts: Facts,
            commands: Vec<Command>,
            primary: Option<&'static str>,
            deleted: &'static [&'static str],
            degraded: &'static str,
            events: &'static [&'static str],
        }
        let rows = [
            Row {
                situation: "a new resource gets its servers and no primary until one answers",
                facts: facts(None, 3, vec![]),
                commands: vec![],
                primary: None,
                deleted: &[],
                degraded: "False:Healthy",
                events: &[],
            },
            Row {
                situation: "fresh servers: the lowest ordinal is elected and the others follow it",
                facts: facts(None, 3, vec![primary(0, 0), primary(1, 0), primary(2, 0)]),
                commands: vec![follow(1, 0), follow(2, 0)],
                primary: Some("r-0"),
                deleted: &[],
                degraded: "False:Healthy",
                events: &["PrimaryElected"],
            },
            Row {
                situation: "every replica follows the primary: nothing to send",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![primary(0, 10), replica(1, 0, 10), replica(2, 0, 10)],
                ),
                commands: vec![],
                primary: Some("r-0"),
                deleted: &[],
                degraded: "False:Healthy",
                events: &[],
            },
            Row {
                situation: "a replica following another host is repointed at the primary",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![primary(0, 10), replica(1, 0, 10), replica(2, 7, 3)],
                ),
                commands: vec![follow(2, 0)],
                primary: Some("r-0"),
                deleted: &[],
                degraded: "False:Healthy",
                events: &[],
            },
            Row {
                situation: "a recreated server that came up as a primary is made to follow",
                facts: facts(
                    Some("r-1"),
                    3,
                    vec![primary(0, 0), primary(1, 50), replica(2, 1, 50)],
                ),
                commands: vec![follow(0, 1)],
                primary: Some("r-1"),
                deleted: &[],
                degraded: "False:Healthy",
                events: &[],
            },
            Row {
                situation: "the primary failed: the replica with the largest offset is promoted, the other repointed, the dead pod deleted",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![
                        server(0, "Failed", None),
                        replica(1, 0, 90),
                        replica(2, 0, 120),
                    ],
                ),
                commands: vec![promote(2), follow(1, 2)],
                primary: Some("r-2"),
                deleted: &["r-0"],
                degraded: "True:FailedOver",
                events: &["Failover"],
            },
            Row {
                situation: "the primary failed after a replica was promoted by a decision whose status never landed (the host stopped between the two, or decided on a stale view): that one stays the primary, no second promotion",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![
                        server(0, "Failed", None),
                        primary(1, 100),
                        replica(2, 0, 100),
                    ],
                ),
                commands: vec![promote(1), follow(2, 1)],
                primary: Some("r-1"),
                deleted: &["r-0"],
                degraded: "True:FailedOver",
                events: &["Failover"],
            },
            Row {
                situation: "the primary failed and a recreated, empty server came up taking writes: the replica with the data is promoted, not it",
                facts: facts(Some("r-0"), 3, vec![primary(1, 0), orphan(2, 0, 80)]),
                commands: vec![promote(2), follow(1, 2)],
                primary: Some("r-2"),
                deleted: &[],
                degraded: "True:FailedOver",
                events: &["Failover"],
            },
            Row {
                situation: "the primary's pod is gone: equal offsets promote the lowest ordinal",
                facts: facts(Some("r-0"), 3, vec![orphan(1, 0, 100), orphan(2, 0, 100)]),
                commands: vec![promote(1), follow(2, 1)],
                primary: Some("r-1"),
                deleted: &[],
                degraded: "True:FailedOver",
                events: &["Failover"],
            },
            // Fault campaign, redis seeds 1 and 4: the primary's Pod deleted with grace 0 is
            // gone from the API before the kubelet kills its process, which goes on taking
            // writes and streaming them; offsets read then still move, and promoting the
            // largest of them lost writes `WAIT 1` saw a faster replica acknowledge.
            Row {
                situation: "the primary's pod is gone but a replica's link to it is still up: its process still streams, so nothing is promoted yet",
                facts: facts(Some("r-0"), 3, vec![replica(1, 0, 100), orphan(2, 0, 90)]),
                commands: vec![],
                primary: Some("r-0"),
                deleted: &[],
                degraded: "True:PrimaryStillStreaming",
                events: &[],
            },
            Row {
                situation: "the primary's pod is being deleted and its replicas still follow it: nothing is promoted before its process ends",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![
                        Server {
                            deleting: true,
                            ..primary(0, 100)
                        },
                        replica(1, 0, 100),
                        replica(2, 0, 100),
                    ],
                ),
                commands: vec![],
                primary: Some("r-0"),
                deleted: &[],
                degraded: "True:PrimaryStillStreaming",
                events: &[],
            },
            Row {
                situation: "the primary failed (its process ended) while a replica still says its link is up: the offsets are final, the largest is promoted",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![
                        server(0, "Failed", None),
                        replica(1, 0, 90),
                        orphan(2, 0, 120),
                    ],
                ),
                commands: vec![promote(2), follow(1, 2)],
                primary: Some("r-2"),
                deleted: &["r-0"],
                degraded: "True:FailedOver",
                events: &["Failover"],
            },
            Row {
                situation: "the primary is gone and no replica answers: nothing is elected and the dead pod is kept",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![
                        server(0, "Failed", None),
                        server(1, "Running", None),
                        server(2, "Pending", None),
                    ],
                ),
                commands: vec![],
                primary: Some("r-0"),
                deleted: &[],
                degraded: "True:PrimaryLostNoReplica",
                events: &["PrimaryLost"],
            },
            Row {
                situation: "the primary failed; a replica that never finished its first sync answers and the one with the data does not: nothing is promoted yet",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![
                        server(0, "Failed", None),
                        server(1, "Running", None),
                        orphan(2, 0, 0),
                    ],
                ),
                commands: vec![],
                primary: Some("r-0"),
                deleted: &[],
                degraded: "True:PrimaryLostNoReplica",
                events: &["PrimaryLost"],
            },
            Row {
                situation: "every server lost: the fresh ones all answer empty, so the lowest ordinal takes over, empty",
                facts: facts(Some("r-0"), 3, vec![primary(1, 0), primary(2, 0)]),
                commands: vec![promote(1), follow(2, 1)],
                primary: Some("r-1"),
                deleted: &[],
                degraded: "True:FailedOver",
                events: &["Failover"],
            },
            Row {
                situation: "the primary died with the only copy, its replicas never synced: the lowest ordinal takes over, empty",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![server(0, "Failed", None), orphan(1, 0, 0), orphan(2, 0, 0)],
                ),
                commands: vec![promote(1), follow(2, 1)],
                primary: Some("r-1"),
                deleted: &["r-0"],
                degraded: "True:FailedOver",
                events: &["Failover"],
            },
            Row {
                situation: "a single server that died is replaced: there was no copy to keep",
                facts: facts(Some("r-0"), 1, vec![server(0, "Failed", None)]),
                commands: vec![],
                primary: Some("r-0"),
                deleted: &["r-0"],
                degraded: "True:PrimaryLostNoReplica",
                events: &["PrimaryLost"],
            },
            Row {
                situation: "a running primary that does not answer is not replaced",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![
                        server(0, "Running", None),
                        replica(1, 0, 5),
                        replica(2, 0, 5),
                    ],
                ),
                commands: vec![],
                primary: Some("r-0"),
                deleted: &[],
                degraded: "False:Healthy",
                events: &[],
            },
            Row {
                situation: "a dead replica is deleted, to come back fresh",
                facts: facts(
                    Some("r-0"),
                    3,
                    vec![primary(0, 10), replica(1, 0, 10), server(2, "Failed", None)],
                ),
                commands: vec![],
                primary: Some("r-0"),
                deleted: &["r-2"],
                degraded: "True:ServerLost",
                events: &[],
            },
            Row {
                situation: "scaling down deletes the highest ordinals but never the primary",
                facts: facts(
                    Some("r-2"),
                    1,
                    vec![replica(0, 2, 10), replica(1, 2, 10), primary(2, 10)],
                ),
                commands: vec![],
                primary: Some("r-2"),
                deleted: &["r-1"],
                degraded: "False:Healthy",
                events: &[],
            },
        ];
        for row in rows {
            let plan = decide(&row.facts);
            let got = outcome(&plan);
            assert_eq!(plan.commands, row.commands, "{}: commands", row.situation);
            assert_eq!(
                got.primary.as_deref(),
                row.primary,
                "{}: primary",
                row.situation
            );
            assert_eq!(got.deleted, row.deleted, "{}: deleted", row.situation);
            assert_eq!(got.degraded, row.degraded, "{}: Degraded", row.situation);
            assert_eq!(got.events, row.events, "{}: events", row.situation);
            if let Some(p) = row.primary {
                assert!(
                    got.created_primary_label.iter().all(|n| n == p),
                    "{}: only the primary carries the primary label: {:?}",
                    row.situation,
                    got.created_primary_label
                );
            }
        }
    }

    #[test]
    fn a_name_too_long_for_the_server_pods_is_refused_with_invalid_spec_and_changes_nothing() {
        let mut f = facts(None, 3, vec![]);
        f.name = "r".repeat(62);
        let plan = decide(&f);
        assert!(plan.commands.is_empty());
        assert!(
            plan.actions
                .iter()
                .all(|a| matches!(a, Action::SetStatus(_) | Action::RecordEvent(_))),
            "{:?}",
            plan.actions
        );
        let got = outcome(&plan);
        assert_eq!(got.degraded, "True:InvalidSpec");
        assert_eq!(got.events, ["InvalidSpec"]);
    }

    #[test]
    fn an_invalid_spec_changes_nothing_but_the_status() {
        let mut f = facts(Some("r-0"), 0, vec![primary(0, 1)]);
        f.spec.replicas = 0;
        let plan = decide(&f);
        assert!(plan.commands.is_empty());
        assert!(
            plan.actions
                .iter()
                .all(|a| matches!(a, Action::SetStatus(_) | Action::RecordEvent(_)))
        );
        assert_eq!(outcome(&plan).degraded, "True:InvalidSpec");
    }
}
