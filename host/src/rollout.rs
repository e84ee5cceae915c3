//! Staged rollout: what a rollout says, which parents it selects, and when it rolls back.
//!
//! A rollout is a candidate version of a plugin (a pack with `data.mode: rollout`) that decides
//! for *some* parents of its kind while the active version keeps deciding for the rest. The
//! admin widens it step by step and promotes it with `data.mode: active`; the host rolls it back
//! on its own when the candidate fails too often. This module is the pure logic of that, with
//! no I/O: [`RolloutSpec`] (the pack's `data.rollout`), [`RolloutSpec::selects`] (stable per
//! parent), [`Tally`] (both versions' recent outcomes) and [`judge`] (the rollback rule).
//! [`crate::policy_store`] holds a loaded rollout, [`crate::controller`] picks the version of
//! each parent and records its outcome, and [`crate::load::config_maps`] reads the pack and
//! marks a rolled-back one.
//!
//! **Which parents.** A parent runs the candidate when its labels match `selector`, or when its
//! uid falls in the first `percent` of 100 buckets ([`bucket`]: sha256 of the uid). The bucket
//! never changes for a parent, so raising `percent` only adds parents, and a host restart or
//! another replica picks the same ones.
//!
//! **What counts as a failure** of a version (each decision it makes for a parent is one
//! outcome; [`Blame`]): the plugin gave no decision (a trap, its deadline, memory or output cap,
//! a credential leak, a refusal of its own), the host refused what it decided (an action outside
//! its grants, an object the parent does not control, an object the API server finds invalid),
//! or its decision turned the parent's `Degraded` condition to `True` when the parent was not
//! degraded before ([`degraded_caused`]). Not counted: what is not the version's doing (no free
//! sandbox slot, a slow or failing API server, a stale view, a partial cache).
//!
//! **When it rolls back** ([`judge`]): once the candidate has made at least `minDecisions`
//! decisions, when more than `maxFailureRate` of its last [`WINDOW`] decisions failed *and* its
//! rate is above the active version's over the active's last [`WINDOW`]: a version is not
//! blamed for failures the old one has as much (an API server in trouble fails both).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Outcomes of each version the rollback judgement looks at: the most recent ones.
pub const WINDOW: usize = 50;

/// `maxFailureRate` when the pack does not say.
pub const DEFAULT_MAX_FAILURE_RATE: f64 = 0.2;

/// `minDecisions` when the pack does not say.
pub const DEFAULT_MIN_DECISIONS: u32 = 10;

/// The most parent names the status lists as running the candidate (the counts are whole).
pub const MAX_LISTED_PARENTS: usize = 20;

/// A rollout as the admin writes it in `data.rollout` (YAML), e.g.
/// `{selector: {matchLabels: {ring: canary}}, percent: 10, maxFailureRate: 0.2}`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutSpec {
    /// Parents whose labels match run the candidate (a Kubernetes label selector:
    /// `matchLabels`, `matchExpressions`). Absent: none by label; `{}`: every parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Share of the parents, 0 to 100, that run the candidate whatever their labels, chosen
    /// by their uid. Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u8>,
    /// The failure rate, 0 to 1, above which the candidate is rolled back. Absent:
    /// [`DEFAULT_MAX_FAILURE_RATE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failure_rate: Option<f64>,
    /// Decisions the candidate makes before it is judged at all, 1 to [`WINDOW`]. Absent:
    /// [`DEFAULT_MIN_DECISIONS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_decisions: Option<u32>,
}

/// Why a parent runs the candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selected {
    /// Its labels match the selector.
    ByLabels,
    /// Its uid's bucket is below the percentage.
    ByPercent,
}

impl std::fmt::Display for Selected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Selected::ByLabels => "its labels match the rollout's selector",
            Selected::ByPercent => "its uid falls in the rollout's percentage",
        })
    }
}

/// The bucket, 0 to 99, a parent with `uid` falls in: the first 8 bytes of the uid's sha256,
/// modulo 100. A uid is random, so the buckets are even; a hash, so they never change.
pub fn bucket(uid: &str) -> u8 {
    let digest = Sha256::digest(uid.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // Below 100: the cast cannot truncate.
    (u64::from_be_bytes(first) % 100) as u8
}

impl RolloutSpec {
    /// Parses and checks `data.rollout`; the error says what is wrong and what to write.
    pub fn parse(text: &str) -> Result<RolloutSpec, String> {
        let spec: RolloutSpec = serde_yaml::from_str(text).map_err(|e| {
            format!(
                "{e}; write e.g. `{{selector: {{matchLabels: {{ring: canary}}}}, percent: 10, maxFailureRate: 0.2}}`"
            )
        })?;
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), String> {
        if let Some(percent) = self.percent
            && percent > 100
        {
            return Err(format!("percent {percent} is out of range; use 0..=100"));
        }
        if let Some(rate) = self.max_failure_rate
            && !(0.0..=1.0).contains(&rate)
        {
            return Err(format!(
                "maxFailureRate {rate} is out of range; use 0..=1 (0.2 rolls back above 20% failed decisions)"
            ));
        }
        if let Some(min) = self.min_decisions
            && !(1..=WINDOW as u32).contains(&min)
        {
            return Err(format!(
                "minDecisions {min} is out of range; use 1..={WINDOW}"
            ));
        }
        self.label_selector()?;
        Ok(())
    }

    fn label_selector(&self) -> Result<Option<Selector>, String> {
        self.selector
            .clone()
            .map(|s| {
                Selector::try_from(s).map_err(|e| {
                    format!(
                        "selector is not a label selector ({}); write e.g. `{{matchLabels: {{ring: canary}}}}` or `{{matchExpressions: [{{key: ring, operator: In, values: [canary]}}]}}`",
                        e.0
                    )
                })
            })
            .transpose()
    }

    /// The percentage, 0 when absent.
    pub fn percent(&self) -> u8 {
        self.percent.unwrap_or(0)
    }

    /// The failure rate above which the candidate rolls back.
    pub fn max_failure_rate(&self) -> f64 {
        self.max_failure_rate.unwrap_or(DEFAULT_MAX_FAILURE_RATE)
    }

    /// Decisions the candidate makes before it is judged.
    pub fn min_decisions(&self) -> u32 {
        self.min_decisions.unwrap_or(DEFAULT_MIN_DECISIONS)
    }

    /// Whether the parent with `labels` and `uid` runs the candidate, and why. The same parent
    /// gets the same answer every time; raising the percentage never takes one out.
    pub fn selects(
        &self,
        labels: &BTreeMap<String, String>,
        uid: Option<&str>,
    ) -> Option<Selected> {
        // Checked when the pack was read: a selector that does not convert selects nothing.
        if let Ok(Some(selector)) = self.label_selector()
            && selector.matches(labels)
        {
            return Some(Selected::ByLabels);
        }
        let uid = uid.filter(|u| !u.is_empty())?;
        (bucket(uid) < self.percent()).then_some(Selected::ByPercent)
    }

    /// The rollout in a line, for Events: `parents matching ring=canary and 10% of the rest`.
    pub fn describe(&self) -> String {
        let by_labels = match self.label_selector() {
            Ok(Some(selector)) if selector.selects_all() => Some("every parent".to_string()),
            Ok(Some(selector)) => Some(format!("parents matching {selector}")),
            _ => None,
        };
        let by_percent = format!("{}% of the parents by uid", self.percent());
        let who = match by_labels {
            Some(labels) => format!("{labels} and {by_percent}"),
            None => by_percent,
        };
        format!(
            "{who}; rolled back when more than {:.0}% of its last {WINDOW} decisions fail (judged after {})",
            self.max_failure_rate() * 100.0,
            self.min_decisions()
        )
    }
}

/// One version's recent outcomes, and its totals since the rollout loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// The last [`WINDOW`] outcomes, `true` for a failure, oldest first.
    recent: VecDeque<bool>,
    /// Decisions since the rollout loaded.
    pub total: u64,
    /// Failed decisions since the rollout loaded.
    pub total_failed: u64,
}

impl Outcomes {
    fn record(&mut self, failed: bool) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(failed);
        self.total += 1;
        self.total_failed += u64::from(failed);
    }

    /// Decisions in the window.
    pub fn decisions(&self) -> u32 {
        // At most WINDOW.
        self.recent.len() as u32
    }

    /// Failed decisions in the window.
    pub fn failed(&self) -> u32 {
        self.recent.iter().filter(|f| **f).count() as u32
    }

    /// Failed over decided in the window, 0 without decisions.
    pub fn rate(&self) -> f64 {
        match self.decisions() {
            0 => 0.0,
            n => f64::from(self.failed()) / f64::from(n),
        }
    }

    /// `3 of its last 4 decisions failed (75%)`.
    pub fn describe(&self) -> String {
        format!(
            "{} of its last {} decisions failed ({:.0}%)",
            self.failed(),
            self.decisions(),
            self.rate() * 100.0
        )
    }

    /// The figures as the status shows them.
    pub fn summary(&self) -> Value {
        serde_json::json!({
            "recentDecisions": self.decisions(),
            "recentFailed": self.failed(),
            "failureRate": (self.rate() * 1000.0).round() / 1000.0,
            "totalDecisions": self.total,
            "totalFailed": self.total_failed,
        })
    }
}

/// Both versions' outcomes during one rollout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The candidate's.
    pub candidate: Outcomes,
    /// The active version's, for the parents the rollout does not select.
    pub active: Outcomes,
}

/// What the judgement says.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Keep going.
    Continue,
    /// Roll the candidate back; the text says why, with both versions' figures.
    RollBack(String),
}

/// The rollback rule (module docs): judged once the candidate has `minDecisions` in its window;
/// rolls back when its rate is above `maxFailureRate` and above the active version's rate.
pub fn judge(spec: &RolloutSpec, tally: &Tally) -> Verdict {
    let (candidate, active) = (&tally.candidate, &tally.active);
    if candidate.decisions() < spec.min_decisions() {
        return Verdict::Continue;
    }
    let rate = candidate.rate();
    if rate > spec.max_failure_rate() && rate > active.rate() {
        Verdict::RollBack(format!(
            "the candidate: {}, above maxFailureRate {:.0}%; the active version: {}",
            candidate.describe(),
            spec.max_failure_rate() * 100.0,
            active.describe()
        ))
    } else {
        Verdict::Continue
    }
}

/// Whether a decision's failure is the version's doing, as a failure counts in the judgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    /// The version decided and what it decided was carried out, without degrading the parent.
    Succeeded,
    /// The version failed (module docs: what counts).
    Failed,
    /// Not the version's doing, or nothing was decided: not counted.
    NotCounted,
}

/// Whether a status a decision writes turns the parent's `Degraded` condition to `True`,
/// the parent's current status (`before`, the `status` of the observed parent) not having it.
/// A condition the parent already had is not the decision's doing.
pub fn degraded_caused(before: Option<&Value>, written_status: &str) -> bool {
    let degraded = |status: &Value| {
        status["conditions"].as_array().is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Degraded" && c["status"] == "True")
        })
    };
    let Ok(after) = serde_json::from_str::<Value>(written_status) else {
        return false;
    };
    degraded(&after) && !before.is_some_and(degraded)
}

/// Which side of a rollout one parent is on, as the status counts them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Parents running the candidate.
    pub candidate: usize,
    /// Parents running the active version.
    pub active: usize,
    /// Up to [`MAX_LISTED_PARENTS`] of the parents running the candidate, `namespace/name`.
    pub on_candidate: Vec<String>,
}

/// What a loaded rollout learns while it runs: its tally, its census and whether it was rolled
/// back. Shared by the controller (writes) and the status (reads).
#[derive(Debug, Default)]
pub struct RolloutState {
    tally: Mutex<Tally>,
    census: Mutex<Census>,
    rolled_back: OnceLock<String>,
}

impl RolloutState {
    /// Records one decision of the candidate (`candidate`) or of the active version; returns
    /// the verdict after it.
    pub fn record(&self, spec: &RolloutSpec, candidate: bool, failed: bool) -> Verdict {
        let mut tally = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        if candidate {
            tally.candidate.record(failed);
        } else {
            tally.active.record(failed);
        }
        judge(spec, &tally)
    }

    /// Both versions' outcomes now.
    pub fn tally(&self) -> Tally {
        self.tally.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the census.
    pub fn set_census(&self, census: Census) {
        *self.census.lock().unwrap_or_else(|p| p.into_inner()) = census;
    }

    /// Which parents run which version.
    pub fn census(&self) -> Census {
        self.census
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Marks the rollout rolled back for `reason`; `true` for the first caller only.
    pub fn roll_back(&self, reason: String) -> bool {
        self.rolled_back.set(reason).is_ok()
    }

    /// Why it was rolled back, once it was.
    pub fn rolled_back(&self) -> Option<&str> {
        self.rolled_back.get().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn uids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("8c3e{i:04x}-5b1a-4f2e-9d7c-{i:012x}"))
            .collect()
    }

    #[test]
    fn a_parent_is_selected_the_same_way_every_time() {
        let spec = RolloutSpec::parse("{percent: 50}").expect("valid");
        for uid in uids(200) {
            let first = spec.selects(&BTreeMap::new(), Some(uid.as_str()));
            for _ in 0..3 {
                assert_eq!(
                    spec.selects(&BTreeMap::new(), Some(uid.as_str())),
                    first,
                    "{uid}"
                );
            }
            assert_eq!(bucket(&uid), bucket(&uid.clone()));
        }
    }

    #[test]
    fn the_percentage_selects_about_that_share_and_raising_it_only_adds_parents() {
        let all = uids(10_000);
        let mut before: Vec<&String> = Vec::new();
        for percent in [0u8, 1, 10, 25, 50, 90, 100] {
            let spec = RolloutSpec {
                percent: Some(percent),
                ..Default::default()
            };
            let selected: Vec<&String> = all
                .iter()
                .filter(|u| spec.selects(&BTreeMap::new(), Some(u.as_str())).is_some())
                .collect();
            let share = selected.len() as f64 / all.len() as f64 * 100.0;
            assert!(
                (share - f64::from(percent)).abs() < 2.0,
                "{percent}%: {share:.1}% selected"
            );
            for parent in &before {
                assert!(selected.contains(parent), "{percent}% dropped {parent}");
            }
            before = selected;
        }
        assert_eq!(before.len(), all.len(), "100% is every parent");
    }

    #[test]
    fn selection_by_labels_and_by_percent() {
        let uid = uids(1).remove(0);
        let canary = labels(&[("ring", "canary")]);
        let other = labels(&[("ring", "main")]);
        // (situation, data.rollout, labels, uid, selected)
        type Row<'a> = (
            &'a str,
            &'a str,
            &'a BTreeMap<String, String>,
            Option<&'a str>,
            Option<Selected>,
        );
        let rows: Vec<Row> = vec![
            (
                "matching labels",
                "{selector: {matchLabels: {ring: canary}}}",
                &canary,
                Some(uid.as_str()),
                Some(Selected::ByLabels),
            ),
            (
                "other labels, no percent",
                "{selector: {matchLabels: {ring: canary}}}",
                &other,
                Some(uid.as_str()),
                None,
            ),
            (
                "other labels, 100%",
                "{selector: {matchLabels: {ring: canary}}, percent: 100}",
                &other,
                Some(uid.as_str()),
                Some(Selected::ByPercent),
            ),
            (
                "an expression",
                "{selector: {matchExpressions: [{key: ring, operator: In, values: [canary, beta]}]}}",
                &canary,
                Some(uid.as_str()),
                Some(Selected::ByLabels),
            ),
            (
                "an empty selector selects every parent",
                "{selector: {}}",
                &other,
                Some(uid.as_str()),
                Some(Selected::ByLabels),
            ),
            ("no selector, 0%", "{}", &canary, Some(uid.as_str()), None),
            (
                "no uid is never chosen by percent",
                "{percent: 100}",
                &other,
                None,
                None,
            ),
        ];
        for (situation, text, labels, uid, expected) in rows {
            let spec = RolloutSpec::parse(text).expect(situation);
            assert_eq!(spec.selects(labels, uid), expected, "{situation}");
        }
    }

    #[test]
    fn a_rollout_out_of_range_or_misspelt_is_refused_saying_what_to_write() {
        for (text, fragment) in [
            ("{percent: 101}", "use 0..=100"),
            ("{maxFailureRate: 1.5}", "use 0..=1"),
            ("{minDecisions: 0}", "use 1..=50"),
            ("{percentage: 10}", "write e.g."),
            (
                "{selector: {matchExpressions: [{key: ring, operator: Near}]}}",
                "not a label selector",
            ),
        ] {
            let error = RolloutSpec::parse(text).expect_err(text);
            assert!(error.contains(fragment), "{text}: {error}");
        }
    }

    fn tally(candidate: &[bool], active: &[bool]) -> Tally {
        let mut tally = Tally::default();
        for failed in candidate {
            tally.candidate.record(*failed);
        }
        for failed in active {
            tally.active.record(*failed);
        }
        tally
    }

    #[test]
    fn the_rollback_judgement() {
        let spec = RolloutSpec::parse("{maxFailureRate: 0.2, minDecisions: 4}").expect("valid");
        let (ok, bad) = (false, true);
        // (situation, candidate outcomes, active outcomes, rolls back)
        let rows: Vec<(&str, Vec<bool>, Vec<bool>, bool)> = vec![
            (
                "every candidate decision failed",
                vec![bad; 4],
                vec![ok; 10],
                true,
            ),
            (
                "too few decisions to judge",
                vec![bad; 3],
                vec![ok; 10],
                false,
            ),
            (
                "at the threshold is not above it",
                vec![bad, ok, ok, ok, ok],
                vec![ok; 10],
                false,
            ),
            (
                "just above the threshold",
                vec![bad, ok, ok, bad, ok],
                vec![ok; 10],
                true,
            ),
            (
                "the active version fails as much",
                vec![bad; 4],
                vec![bad; 4],
                false,
            ),
            (
                "the active version fails less",
                vec![bad, bad, ok, ok],
                vec![bad, ok, ok, ok],
                true,
            ),
            ("no active decisions yet", vec![bad; 4], vec![], true),
            ("a healthy candidate", vec![ok; 50], vec![ok; 5], false),
            (
                "old failures leave the window",
                [vec![bad; 20], vec![ok; 50]].concat(),
                vec![ok; 5],
                false,
            ),
        ];
        for (situation, candidate, active, rolls_back) in rows {
            let verdict = judge(&spec, &tally(&candidate, &active));
            assert_eq!(
                matches!(verdict, Verdict::RollBack(_)),
                rolls_back,
                "{situation}: {verdict:?}"
            );
        }
    }

    #[test]
    fn the_rollback_reason_gives_both_versions_figures() {
        let spec = RolloutSpec::parse("{minDecisions: 2}").expect("valid");
        let Verdict::RollBack(reason) =
            judge(&spec, &tally(&[true, true], &[false, true, false, false]))
        else {
            panic!("expected a rollback");
        };
        assert!(
            reason.contains("2 of its last 2 decisions failed (100%)"),
            "{reason}"
        );
        assert!(
            reason.contains("1 of its last 4 decisions failed (25%)"),
            "{reason}"
        );
        assert!(reason.contains("maxFailureRate 20%"), "{reason}");
    }

    #[test]
    fn a_state_rolls_back_once() {
        let state = RolloutState::default();
        assert!(state.roll_back("first".into()));
        assert!(!state.roll_back("second".into()));
        assert_eq!(state.rolled_back(), Some("first"));
    }

    #[test]
    fn degraded_counts_only_when_the_decision_turns_it_on() {
        let degraded = r#"{"conditions":[{"type":"Degraded","status":"True"}]}"#;
        let healthy = r#"{"conditions":[{"type":"Degraded","status":"False"}]}"#;
        let was_degraded: Value = serde_json::from_str(degraded).expect("json");
        let was_healthy: Value = serde_json::from_str(healthy).expect("json");
        // (situation, status before, status written, caused)
        let rows = [
            ("healthy to degraded", Some(&was_healthy), degraded, true),
            ("no status to degraded", None, degraded, true),
            ("already degraded", Some(&was_degraded), degraded, false),
            ("stays healthy", Some(&was_healthy), healthy, false),
            ("recovers", Some(&was_degraded), healthy, false),
            ("not JSON", None, "nonsense", false),
        ];
        for (situation, before, written, caused) in rows {
            assert_eq!(degraded_caused(before, written), caused, "{situation}");
        }
    }
}
