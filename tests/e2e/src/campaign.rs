//! The fault campaign's judgements (`benches/fault_campaign.rs`): whose doing an etcd stretch
//! without quorum was (the campaign's faults', the operator's, or the machine's), and which
//! Redis writes a replica acknowledged that Redis promises to keep. Pure, so their rows are
//! tested natively, some from what failed runs recorded.
//!
//! A stretch is the operator's only when the campaign's faults do not explain it **and** the
//! operator did something to the members in it or shortly before it: a membership change, a
//! member restarted, moved or deleted (its Events, or the kubelet's `Killing` of a member pod
//! the campaign did not delete). A stretch with neither is a stall of the machine: on this
//! shared 2-core node a starved etcd leader ("leader failed to send out heartbeat on time")
//! stops answering for 5–15 s with every member up and the host idle (seeds 14, 26 and 35 of
//! the first campaign, BENCHMARKS.md). An operator action that left no Event cannot hide
//! here: a membership change without its Event fails the campaign's membership check, a pod
//! deleted or restarted leaves the kubelet's `Killing` Event.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;

/// A stretch without quorum shorter than this is an election or a member restarting.
pub const QUORUM_LOSS: Duration = Duration::from_secs(5);

/// A fault counts against the quorum from when it is made until this long after (a killed
/// member restarts and catches up, a replacement is added and starts, within it).
pub const HURT_FOR: Duration = Duration::from_secs(20);

/// How long before a stretch an operator action may have caused it. An action bites when it is
/// made or within seconds: a removal or promotion changes the quorum at once; a member whose
/// pod the host changed or deleted goes down when the kubelet acts on it (1–3 s here, more
/// under load); a lost leader costs an election (etcd's 1 s election timeout); the client
/// sees it at its next probe (1 s timeout plus 0.5 s between probes). 10 s is these, doubled
/// for the machine's load. The three stalls of the first campaign began 14.4 s and more after
/// the last action, with the cluster answering in between.
pub const ACTION_WINDOW: Duration = Duration::from_secs(10);

/// The plugin's Event reasons that say it changed the members: their set, a voter's role, a
/// member's pod or process, its leadership, its storage.
pub const OPERATOR_ACTION_REASONS: [&str; 8] = [
    "MemberAdded",
    "MemberRemoved",
    "MemberPromoted",
    "LearnerRemoved",
    "MemberUpgrading",
    "LeaderMoved",
    "MemberCrashLooping",
    "MemberDefragmented",
];

/// How long after the campaign deletes a member pod the kubelet's `Killing` of it is still
/// that delete's (the kubelet acts on it within seconds, more under load).
pub const OWN_KILL_WINDOW: Duration = Duration::from_secs(10);

/// One quorum sample of the client (`tests/env/campaign-writer`): did any member answer a
/// linearizable read, and the member list one of them returned.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Sample {
    /// When the probe began, Unix milliseconds.
    pub t: i64,
    /// Whether any member answered.
    pub quorum: bool,
    /// etcd's member list, when a member answered it.
    pub members: Option<Vec<SampledMember>>,
}

/// A member in a sample's list.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct SampledMember {
    /// Whether it is a learner (no vote).
    pub learner: bool,
}

/// A stretch of samples in which no member answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoQuorum {
    /// The first unanswered probe, Unix milliseconds.
    pub from_ms: i64,
    /// The first answered probe after it, or half a second after the last unanswered one when
    /// none answered again.
    pub until_ms: i64,
    /// Voters in the last member list sampled before it.
    pub voters: usize,
}

impl NoQuorum {
    /// How long no member answered.
    pub fn lasted(&self) -> Duration {
        Duration::from_millis((self.until_ms - self.from_ms).max(0) as u64)
    }
}

/// A member the campaign took out (killed, deleted, cut off) at a moment.
#[derive(Clone, Debug)]
pub struct Hurt {
    /// When, Unix milliseconds.
    pub at_ms: i64,
    /// The member pod.
    pub member: String,
}

/// Something the operator did to the members, known to lie in `from_ms..=to_ms` (an Event's
/// time is exact, or a second wide when the kubelet wrote it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorAction {
    /// Earliest it may have been, Unix milliseconds.
    pub from_ms: i64,
    /// Latest it may have been.
    pub to_ms: i64,
    /// What it was, e.g. `MemberRemoved campaign-0`.
    pub what: String,
}

/// Whose doing a stretch without quorum was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuorumVerdict {
    /// Shorter than [`QUORUM_LOSS`]: an election, a restart.
    Brief,
    /// The campaign's faults in it and [`HURT_FOR`] before it took out more members than the
    /// voters tolerate.
    CampaignFaults {
        /// The members they hurt.
        hurt: BTreeSet<String>,
    },
    /// Not explained by the faults, and the operator acted in it or [`ACTION_WINDOW`] before:
    /// a failure of the campaign.
    Operator {
        /// The members the faults hurt (fewer than the voters tolerate).
        hurt: BTreeSet<String>,
        /// What the operator did then.
        actions: Vec<String>,
    },
    /// Not explained by the faults, and the operator did nothing then: the machine stalled.
    MachineStall {
        /// The members the faults hurt (fewer than the voters tolerate).
        hurt: BTreeSet<String>,
    },
}

/// Judges one stretch: [`QuorumVerdict`] says when each verdict applies.
pub fn judge_no_quorum(
    stretch: &NoQuorum,
    hurt: &[Hurt],
    actions: &[OperatorAction],
) -> QuorumVerdict {
    if stretch.lasted() < QUORUM_LOSS {
        return QuorumVerdict::Brief;
    }
    let hurt: BTreeSet<String> = hurt
        .iter()
        .filter(|h| {
            h.at_ms >= stretch.from_ms - HURT_FOR.as_millis() as i64 && h.at_ms < stretch.until_ms
        })
        .map(|h| h.member.clone())
        .collect();
    // A majority of the voters must answer: `voters - (voters / 2 + 1)` may be out.
    let tolerated = stretch.voters.saturating_sub(1) / 2;
    if hurt.len() > tolerated {
        return QuorumVerdict::CampaignFaults { hurt };
    }
    let window_from = stretch.from_ms - ACTION_WINDOW.as_millis() as i64;
    let actions: Vec<String> = actions
        .iter()
        .filter(|a| a.to_ms >= window_from && a.from_ms < stretch.until_ms)
        .map(|a| a.what.clone())
        .collect();
    if actions.is_empty() {
        QuorumVerdict::MachineStall { hurt }
    } else {
        QuorumVerdict::Operator { hurt, actions }
    }
}

/// The stretches of unanswered samples, each with the voters of the last list before it.
pub fn no_quorum_stretches(samples: &[Sample], initial_voters: usize) -> Vec<NoQuorum> {
    let mut stretches = Vec::new();
    let mut voters = initial_voters;
    let mut i = 0;
    while i < samples.len() {
        if samples[i].quorum {
            if let Some(members) = &samples[i].members {
                voters = members.iter().filter(|m| !m.learner).count();
            }
            i += 1;
            continue;
        }
        let from_ms = samples[i].t;
        let mut last = from_ms;
        while i < samples.len() && !samples[i].quorum {
            last = samples[i].t;
            i += 1;
        }
        let until_ms = samples.get(i).map_or(last + 500, |s| s.t);
        stretches.push(NoQuorum {
            from_ms,
            until_ms,
            voters,
        });
    }
    stretches
}

/// The operator's actions on the members among a namespace's Events: the plugin's
/// [`OPERATOR_ACTION_REASONS`] on the cluster, and the kubelet's `Killing` of a member pod
/// that is not the campaign's own delete of that pod (`own_deletes`: pod and when, Unix ms).
pub fn operator_actions(
    events: &[Event],
    member_prefix: &str,
    own_deletes: &[(String, i64)],
) -> Vec<OperatorAction> {
    let mut actions = Vec::new();
    for event in events {
        let reason = event.reason.as_deref().unwrap_or_default();
        let regarding = event
            .regarding
            .as_ref()
            .and_then(|r| r.name.clone())
            .unwrap_or_default();
        let Some((from_ms, to_ms)) = event_span(event) else {
            continue;
        };
        let what = if OPERATOR_ACTION_REASONS.contains(&reason) {
            let note = event.note.as_deref().unwrap_or_default();
            format!("{reason} at {} ({note})", clock(from_ms))
        } else if reason == "Killing" && regarding.starts_with(member_prefix) {
            let own = own_deletes.iter().any(|(pod, at)| {
                pod == &regarding
                    && to_ms >= *at
                    && from_ms <= at + OWN_KILL_WINDOW.as_millis() as i64
            });
            if own {
                continue;
            }
            let note = event.note.as_deref().unwrap_or_default();
            format!("kubelet Killing {regarding} at {} ({note})", clock(from_ms))
        } else {
            continue;
        };
        actions.push(OperatorAction {
            from_ms,
            to_ms,
            what,
        });
    }
    actions
}

/// When an Event happened, first to last: exact when it has an event time (its series' last
/// observation for a repeat), a second wide when only the kubelet's second-precision
/// timestamps are set.
fn event_span(event: &Event) -> Option<(i64, i64)> {
    if let Some(at) = &event.event_time {
        let from = at.0.as_millisecond();
        let to = event
            .series
            .as_ref()
            .map_or(from, |s| s.last_observed_time.0.as_millisecond());
        return Some((from, to.max(from)));
    }
    let first = event
        .deprecated_first_timestamp
        .as_ref()
        .or(event.metadata.creation_timestamp.as_ref())?
        .0
        .as_millisecond();
    let last = event
        .deprecated_last_timestamp
        .as_ref()
        .map_or(first, |t| t.0.as_millisecond());
    Some((first, last.max(first) + 999))
}

/// `HH:MM:SS.mmm` UTC, as the evidence's logs write times.
fn clock(ms: i64) -> String {
    let day = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1_000 % 60,
        day % 1_000
    )
}

/// A Redis write the primary answered `OK` and `WAIT 1 <ms>` then reported as acknowledged
/// by `replicas` replicas.
#[derive(Clone, Debug)]
pub struct ReplicatedWrite {
    /// The write's unique key.
    pub key: String,
    /// When `WAIT` answered, Unix milliseconds.
    pub at_ms: i64,
    /// How many replicas acknowledged it.
    pub replicas: i64,
    /// The IP of the server it was written to.
    pub to: String,
}

/// One look at one Redis server by the Redis mode's recorder, kept when it changed; the
/// campaign adds one, not running, for each server it kills, at the kill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSeen {
    /// When, Unix milliseconds.
    pub at_ms: i64,
    /// Which server: its Pod's name and UID (`campaign-1/3f2a...`). A Pod created again under
    /// the same name is another server, fresh and empty.
    pub server: String,
    /// Its Pod's IP.
    pub ip: Option<String>,
    /// It runs: its Pod is Running, not being deleted, and the campaign has not killed it.
    pub running: bool,
    /// For a replica whose link is up: the IP it follows.
    pub following: Option<String>,
}

/// The replicated writes the final primary does not have, split into those Redis promised to
/// keep (failures) and those every copy of which was gone before another server copied it.
///
/// Who holds a write: the server it was written to, and each replica whose link to it was up
/// then (`WAIT` counted them); after it, every server whose link comes up to a holder (a
/// replica with its link up has all its primary has: a full sync or the stream since). A
/// holder stops holding only when it stops running (killed, deleted, scaled away). A holder
/// that copied another server's data (say an empty one that took its primary's IP) still
/// counts: that is the operator losing the write, not Redis. A replica that synced and lost
/// its primary between two looks of the recorder (250 ms apart, more under load) is missed,
/// which can only excuse a write, never fail one.
///
/// Before the recorder (seeds 1–30) the rule was "as many replicas killed or scaled away
/// after the write as acknowledged it"; it took no account of a primary killed that had been
/// one of them, nor of the copies made since (seed 30).
pub fn lost_replicated_writes<'a>(
    writes: &'a [ReplicatedWrite],
    present: &BTreeSet<String>,
    seen: &[ServerSeen],
) -> (Vec<&'a ReplicatedWrite>, Vec<&'a ReplicatedWrite>) {
    let mut seen: Vec<&ServerSeen> = seen.iter().collect();
    // At the same millisecond, a server stopping before another's link coming up to it.
    seen.sort_by_key(|s| (s.at_ms, s.running));
    writes
        .iter()
        .filter(|w| !present.contains(&w.key))
        .partition(|w| a_copy_survived(w, &seen))
}

/// Whether some server that held `write` (see [`lost_replicated_writes`]) still ran at the
/// end of `seen` (sorted by time).
fn a_copy_survived(write: &ReplicatedWrite, seen: &[&ServerSeen]) -> bool {
    let split = seen.partition_point(|s| s.at_ms <= write.at_ms);
    let mut state: BTreeMap<&str, &ServerSeen> = BTreeMap::new();
    for s in &seen[..split] {
        state.insert(&s.server, s);
    }
    let to = Some(write.to.as_str());
    let mut holders: BTreeSet<&str> = state
        .values()
        .filter(|s| s.running && (s.ip.as_deref() == to || s.following.as_deref() == to))
        .map(|s| s.server.as_str())
        .collect();
    // The server written to, not looked at yet when the write was made: its first look.
    if !holders.iter().any(|h| state[h].ip.as_deref() == to)
        && let Some(first) = seen[split..].iter().find(|s| s.ip.as_deref() == to)
        && first.running
        && !state.contains_key(first.server.as_str())
    {
        holders.insert(&first.server);
    }
    if holders.is_empty() {
        return false;
    }
    for s in &seen[split..] {
        state.insert(&s.server, s);
        if !s.running {
            holders.remove(s.server.as_str());
            if holders.is_empty() {
                return false;
            }
        } else if let Some(ip) = s.following.as_deref() {
            let follows_a_holder = holders
                .iter()
                .any(|h| state[h].running && state[h].ip.as_deref() == Some(ip));
            if follows_a_holder {
                holders.insert(&s.server);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::EventSeries;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use k8s_openapi::jiff::Timestamp;

    /// Unix milliseconds of `HH:MM:SS.mmm` UTC on 2026-11-26, the day of the first campaign.
    fn at(clock: &str) -> i64 {
        format!("2026-11-26T{clock}Z")
            .parse::<Timestamp>()
            .expect("a clock time")
            .as_millisecond()
    }

    fn utc(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).expect("a time")
    }

    fn hurt(clock: &str, member: &str) -> Hurt {
        Hurt {
            at_ms: at(clock),
            member: member.to_owned(),
        }
    }

    /// An action the plugin's Event (exact time) records.
    fn action(clock: &str, what: &str) -> OperatorAction {
        OperatorAction {
            from_ms: at(clock),
            to_ms: at(clock),
            what: what.to_owned(),
        }
    }

    fn stretch(from: &str, until: &str, voters: usize) -> NoQuorum {
        NoQuorum {
            from_ms: at(from),
            until_ms: at(until),
            voters,
        }
    }

    struct Row {
        situation: &'static str,
        stretch: NoQuorum,
        hurt: Vec<Hurt>,
        actions: Vec<OperatorAction>,
        operators: bool,
        expected: fn(&QuorumVerdict) -> bool,
    }

    #[test]
    fn judge_no_quorum_names_whose_doing_a_stretch_was() {
        let rows = [
            Row {
                situation: "an election of a second is not a quorum loss",
                stretch: stretch("10:00:00.000", "10:00:03.000", 3),
                hurt: vec![],
                actions: vec![action("10:00:00.500", "MemberRemoved campaign-1")],
                operators: false,
                expected: |v| *v == QuorumVerdict::Brief,
            },
            Row {
                situation: "two of three members killed by the campaign explain the loss",
                stretch: stretch("10:00:10.000", "10:00:30.000", 3),
                hurt: vec![
                    hurt("10:00:02.000", "campaign-0"),
                    hurt("10:00:09.000", "campaign-1"),
                ],
                actions: vec![action("10:00:12.000", "MemberRemoved campaign-0")],
                operators: false,
                expected: |v| matches!(v, QuorumVerdict::CampaignFaults { hurt } if hurt.len() == 2),
            },
            Row {
                situation: "a fault more than 20 s before the stretch no longer counts against it",
                stretch: stretch("10:00:30.000", "10:00:40.000", 3),
                hurt: vec![
                    hurt("10:00:05.000", "campaign-0"),
                    hurt("10:00:29.000", "campaign-1"),
                ],
                actions: vec![],
                operators: false,
                expected: |v| matches!(v, QuorumVerdict::MachineStall { hurt } if hurt.len() == 1),
            },
            // Seed 14: the etcd leader campaign-0 deleted with grace 0 at 18:26:51.1 (+18.1 s);
            // no member answered from 18:26:53.787 to 18:27:08.887 while the new leader logged
            // "leader failed to send out heartbeat on time"; the host's last action before
            // was promoting campaign-2 at 18:26:32, its next removing campaign-0 at 18:27:09.
            Row {
                situation: "seed 14: one member deleted, a starved leader, the host idle",
                stretch: stretch("18:26:53.787", "18:27:08.887", 3),
                hurt: vec![hurt("18:26:51.100", "campaign-0")],
                actions: vec![
                    action("18:26:32.000", "MemberPromoted campaign-2"),
                    action("18:27:09.050", "MemberRemoved campaign-0"),
                    action("18:27:09.100", "MemberAdded campaign-0"),
                    action("18:27:13.000", "MemberUpgrading campaign-2"),
                ],
                operators: false,
                expected: |v| matches!(v, QuorumVerdict::MachineStall { hurt } if hurt.len() == 1),
            },
            // Seed 26: campaign-2 cut 18:37:59.8 and healed at 18:38:06.2, campaign-1
            // SIGKILLed at 18:38:18.3; four voters; no answer from 18:38:21.386 to
            // 18:38:36.428; the host added campaign-4 and promoted campaign-3 at 18:38:07,
            // promoted campaign-4 at 18:38:38.
            Row {
                situation: "seed 26: one of four voters killed, a starved leader, the host idle",
                stretch: stretch("18:38:21.386", "18:38:36.428", 4),
                hurt: vec![
                    hurt("18:37:59.800", "campaign-2"),
                    hurt("18:38:18.300", "campaign-1"),
                ],
                actions: vec![
                    action("18:38:03.000", "MemberAdded campaign-3"),
                    action("18:38:07.000", "MemberPromoted campaign-3"),
                    action("18:38:07.300", "MemberAdded campaign-4"),
                    action("18:38:38.000", "MemberPromoted campaign-4"),
                ],
                operators: false,
                expected: |v| matches!(v, QuorumVerdict::MachineStall { hurt } if hurt.len() == 1),
            },
            // Seed 35: no member hurt; reads unanswered from 18:52:35.300 to 18:52:41.3;
            // the host's last action promoting campaign-2 at 18:52:21, its next adding
            // campaign-3 at 18:52:42.
            Row {
                situation: "seed 35: every member up, a starved leader, the host idle",
                stretch: stretch("18:52:35.300", "18:52:41.300", 3),
                hurt: vec![],
                actions: vec![
                    action("18:52:21.000", "MemberPromoted campaign-2"),
                    action("18:52:42.000", "MemberAdded campaign-3"),
                ],
                operators: false,
                expected: |v| matches!(v, QuorumVerdict::MachineStall { hurt } if hurt.is_empty()),
            },
            Row {
                situation: "a member removed by the host in the stretch is the operator's loss",
                stretch: stretch("18:52:35.300", "18:52:41.300", 3),
                hurt: vec![],
                actions: vec![action("18:52:37.000", "MemberRemoved campaign-1")],
                operators: true,
                expected: |v| matches!(v, QuorumVerdict::Operator { actions, .. } if actions.len() == 1),
            },
            Row {
                situation: "a member restarted by the host 8 s before the stretch is the operator's loss",
                stretch: stretch("18:26:53.787", "18:27:08.887", 3),
                hurt: vec![hurt("18:26:51.100", "campaign-0")],
                actions: vec![action("18:26:45.900", "MemberUpgrading campaign-1")],
                operators: true,
                expected: |v| matches!(v, QuorumVerdict::Operator { hurt, .. } if hurt.len() == 1),
            },
            Row {
                situation: "an action after quorum is back is not the stretch's cause",
                stretch: stretch("18:26:53.787", "18:27:08.887", 3),
                hurt: vec![],
                actions: vec![action("18:27:08.887", "MemberRemoved campaign-0")],
                operators: false,
                expected: |v| matches!(v, QuorumVerdict::MachineStall { .. }),
            },
            Row {
                situation: "a kubelet kill a second wide that may lie in the window counts",
                stretch: stretch("10:00:20.000", "10:00:30.000", 3),
                hurt: vec![],
                actions: vec![OperatorAction {
                    from_ms: at("10:00:09.500"),
                    to_ms: at("10:00:10.499"),
                    what: "kubelet Killing campaign-2".to_owned(),
                }],
                operators: true,
                expected: |v| matches!(v, QuorumVerdict::Operator { .. }),
            },
        ];
        let wrong: Vec<String> = rows
            .iter()
            .filter_map(|row| {
                let verdict = judge_no_quorum(&row.stretch, &row.hurt, &row.actions);
                let right = (row.expected)(&verdict)
                    && matches!(verdict, QuorumVerdict::Operator { .. }) == row.operators;
                (!right).then(|| format!("{}: got {verdict:?}", row.situation))
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn no_quorum_stretches_end_at_the_first_answer_and_count_the_voters_before() {
        let member = |learner| SampledMember { learner };
        let samples = vec![
            Sample {
                t: 0,
                quorum: true,
                members: Some(vec![
                    member(false),
                    member(false),
                    member(false),
                    member(true),
                ]),
            },
            Sample {
                t: 1_500,
                quorum: false,
                members: None,
            },
            Sample {
                t: 3_000,
                quorum: false,
                members: None,
            },
            Sample {
                t: 4_000,
                quorum: true,
                members: None,
            },
            Sample {
                t: 5_500,
                quorum: false,
                members: None,
            },
        ];
        assert_eq!(
            no_quorum_stretches(&samples, 3),
            vec![
                NoQuorum {
                    from_ms: 1_500,
                    until_ms: 4_000,
                    voters: 3
                },
                NoQuorum {
                    from_ms: 5_500,
                    until_ms: 6_000,
                    voters: 3
                },
            ]
        );
    }

    fn event(reason: &str, regarding: &str) -> Event {
        Event {
            reason: Some(reason.to_owned()),
            regarding: Some(ObjectReference {
                name: Some(regarding.to_owned()),
                ..ObjectReference::default()
            }),
            ..Event::default()
        }
    }

    #[test]
    fn operator_actions_are_the_plugins_member_events_and_kills_the_campaign_did_not_make() {
        let removed = Event {
            event_time: Some(MicroTime(utc(at("18:27:09.050")))),
            note: Some("removed member campaign-0 (ID a6c9fd837d610a3d)".to_owned()),
            ..event("MemberRemoved", "campaign")
        };
        let repeated = Event {
            event_time: Some(MicroTime(utc(at("18:27:10.000")))),
            series: Some(EventSeries {
                count: 2,
                last_observed_time: MicroTime(utc(at("18:27:20.000"))),
            }),
            ..event("LeaderMoved", "campaign")
        };
        let kubelet = |clock: &str, pod: &str| Event {
            deprecated_first_timestamp: Some(Time(utc(at(clock)))),
            deprecated_last_timestamp: Some(Time(utc(at(clock)))),
            note: Some("Stopping container etcd".to_owned()),
            ..event("Killing", pod)
        };
        let events = vec![
            removed,
            repeated,
            // The campaign's own delete of campaign-0 at 18:26:51.1.
            kubelet("18:26:51.000", "campaign-0"),
            // The host's restart of campaign-2.
            kubelet("18:27:13.000", "campaign-2"),
            // Not about the members.
            Event {
                event_time: Some(MicroTime(utc(at("18:27:00.000")))),
                ..event("ClusterCreated", "campaign")
            },
            kubelet("18:27:00.000", "other-0"),
        ];
        let own = vec![("campaign-0".to_owned(), at("18:26:51.100"))];
        let actions = operator_actions(&events, "campaign-", &own);
        let spans: Vec<(i64, i64)> = actions.iter().map(|a| (a.from_ms, a.to_ms)).collect();
        assert_eq!(
            spans,
            vec![
                (at("18:27:09.050"), at("18:27:09.050")),
                (at("18:27:10.000"), at("18:27:20.000")),
                (at("18:27:13.000"), at("18:27:13.999")),
            ],
            "{actions:?}"
        );
        assert!(actions[0].what.starts_with("MemberRemoved at 18:27:09.050"));
        assert!(actions[2].what.contains("campaign-2"));
    }

    /// A server's look for [`lost_replicated_writes`]: `campaign-<n>/<uid>` at `10.0.0.<ip>`,
    /// following `10.0.0.<following>` with its link up.
    fn look(at_ms: i64, server: &str, ip: u8, following: Option<u8>) -> ServerSeen {
        ServerSeen {
            at_ms,
            server: server.to_owned(),
            ip: Some(format!("10.0.0.{ip}")),
            running: true,
            following: following.map(|f| format!("10.0.0.{f}")),
        }
    }

    /// A server killed (or gone) at `at_ms`.
    fn stopped(at_ms: i64, server: &str, ip: u8) -> ServerSeen {
        ServerSeen {
            running: false,
            ..look(at_ms, server, ip, None)
        }
    }

    #[test]
    fn lost_replicated_writes_are_failures_unless_every_copy_went() {
        // Three servers: campaign-2 the primary at .2, campaign-0 (.10) and campaign-1 (.11)
        // following it; the write to .2 at 1,000 ms, acknowledged by both.
        let start = || {
            vec![
                look(0, "campaign-2/a", 2, None),
                look(0, "campaign-0/a", 10, Some(2)),
                look(0, "campaign-1/a", 11, Some(2)),
            ]
        };
        let with = |more: Vec<ServerSeen>| {
            let mut seen = start();
            seen.extend(more);
            seen
        };
        struct Row {
            situation: &'static str,
            present: bool,
            seen: Vec<ServerSeen>,
            failure: bool,
            excused: bool,
        }
        let rows = [
            Row {
                situation: "a replicated write on the final primary is kept",
                present: true,
                seen: with(vec![stopped(5_000, "campaign-2/a", 2)]),
                failure: false,
                excused: false,
            },
            Row {
                situation: "missing while the replicas that had it still run: lost",
                present: false,
                seen: with(vec![]),
                failure: true,
                excused: false,
            },
            Row {
                situation: "missing after a failover to a replica that had it: lost",
                present: false,
                seen: with(vec![
                    stopped(5_000, "campaign-2/a", 2),
                    look(6_000, "campaign-1/a", 11, None),
                    look(7_000, "campaign-0/a", 10, Some(11)),
                ]),
                failure: true,
                excused: false,
            },
            // Seed 30: the primary killed, a replica, then the promoted replica before any
            // fresh server's link came up to it (their Pods were still starting).
            Row {
                situation: "the primary, one replica, then the promoted replica killed before any server copied it: gone with every copy",
                present: false,
                seen: with(vec![
                    stopped(9_900, "campaign-2/a", 2),
                    stopped(10_400, "campaign-0/a", 10),
                    look(12_000, "campaign-1/a", 11, None),
                    look(14_000, "campaign-0/b", 12, None),
                    look(15_000, "campaign-2/b", 13, None),
                    stopped(18_700, "campaign-1/a", 11),
                    look(20_000, "campaign-0/b", 12, None),
                ]),
                failure: false,
                excused: true,
            },
            Row {
                situation: "the same, but a fresh server's link came up to the promoted replica first: it has the write, so it is lost",
                present: false,
                seen: with(vec![
                    stopped(9_900, "campaign-2/a", 2),
                    stopped(10_400, "campaign-0/a", 10),
                    look(12_000, "campaign-1/a", 11, None),
                    look(17_000, "campaign-0/b", 12, Some(11)),
                    stopped(18_700, "campaign-1/a", 11),
                ]),
                failure: true,
                excused: false,
            },
            Row {
                situation: "a holder that copied an empty server at its dead primary's IP still counts: lost",
                present: false,
                seen: with(vec![
                    stopped(5_000, "campaign-2/a", 2),
                    look(6_000, "campaign-0/b", 2, None),
                    stopped(6_500, "campaign-0/a", 10),
                ]),
                failure: true,
                excused: false,
            },
            Row {
                situation: "a fresh server following a dead holder's reused IP does not hold the write",
                present: false,
                seen: with(vec![
                    stopped(5_000, "campaign-0/a", 10),
                    stopped(5_100, "campaign-1/a", 11),
                    stopped(5_200, "campaign-2/a", 2),
                    look(6_000, "campaign-0/b", 2, None),
                    look(7_000, "campaign-1/b", 11, Some(2)),
                ]),
                failure: false,
                excused: true,
            },
            Row {
                situation: "a replica killed before the write does not excuse its loss",
                present: false,
                seen: with(vec![stopped(900, "campaign-0/a", 10)])
                    .into_iter()
                    .chain([stopped(5_000, "campaign-2/a", 2)])
                    .collect(),
                failure: true,
                excused: false,
            },
            Row {
                situation: "the server written to, first looked at after the write, holds it",
                present: false,
                seen: vec![look(1_200, "campaign-2/a", 2, None)],
                failure: true,
                excused: false,
            },
        ];
        let wrong: Vec<String> = rows
            .iter()
            .filter_map(|row| {
                let write = ReplicatedWrite {
                    key: "w-1".to_owned(),
                    at_ms: 1_000,
                    replicas: 2,
                    to: "10.0.0.2".to_owned(),
                };
                let present: BTreeSet<String> = if row.present {
                    BTreeSet::from([write.key.clone()])
                } else {
                    BTreeSet::new()
                };
                let writes = [write];
                let (lost, excused) = lost_replicated_writes(&writes, &present, &row.seen);
                (lost.is_empty() == row.failure || excused.is_empty() == row.excused)
                    .then(|| format!("{}: lost {lost:?}, excused {excused:?}", row.situation))
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
