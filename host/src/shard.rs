//! Sharding: which of several host deployments (shards) reconciles a parent, so that when one
//! host is not enough the parents are split among hosts, each shard led through its own Lease.
//!
//! **Assignment.** A parent labelled `policy-host.io/shard=<i>` (set by the admin) belongs to
//! shard `i`: the label wins, so an admin can move a busy parent, or pin a namespace's parents
//! with a label selector, without knowing the hash. Every other parent belongs to shard
//! `fnv1a64("<namespace>/<name>") % shards`. A label that names no shard of this count (not a
//! number, or `>= shards`) is ignored, and the parent goes by the hash: a parent is never left
//! without a shard because of a typo (the owning shard logs a warning).
//!
//! **Why that hash, of that key.** FNV-1a is fixed by its definition, so every replica, on any
//! version of the host or of Rust, computes the same shard (std's `RandomState` hashes differ
//! per process). The key is the namespace and name rather than the namespace alone, which would
//! put one namespace's thousand parents on one shard, or the uid, which changes when a parent is
//! deleted and created again, so its replacement could land on another shard while the old
//! one still finalizes.
//!
//! **Where the filter sits.** Each shard watches every parent but keeps only its own in the
//! controller's parent store (`observe::cache::watch_parents`): another shard's parent costs a
//! watch event and a hash, never a queue slot, an observation or a decision. Triggers from a
//! child, requeues and the hot-swap "reconcile all" find nothing in the store for it, and
//! kube-runtime skips them.
//!
//! **A parent that changes shard** (its label is set, changed or removed) leaves the old shard's
//! store on the watch event of that change (the event is turned into a delete there), so the
//! old shard stops touching it: no new reconcile starts, and its pending requeues find nothing.
//! The new shard sees the same event as an applied parent and reconciles it. A reconcile the
//! old shard had in flight at that moment looks at its store again before its act stage, and a
//! parent gone from it gets nothing written (`policy_host_reconciles_abandoned_total`). The
//! limit: what that decision did before, its app-calls (an etcd `member add`, a Redis
//! `REPLICAOF`), is not undone, and may overlap the new shard's first decision; and a write
//! already under way when the event arrives finishes (its status write carries the
//! resourceVersion observed, which the label change moved on, so it is refused as
//! `StaleView`). Both decide from the same observed state, and the shipped plugins choose
//! deterministically, so they converge; a tenant flipping its own parent's label repeats
//! that overlap at will, for its own parent only.
//!
//! **Changing the number of shards** changes the hash's modulus, so most parents move at once,
//! and replicas started with different counts disagree about who owns what. Stop the old
//! deployments before starting the new ones (the Leases are named per shard index, so an old
//! and a new shard `i` would otherwise share one).
//!
//! **The children follow their parent.** With more than one shard, the host labels every
//! child it applies with its parent's shard (`policy-host.io/owner-shard=<i>-of-<n>`), and each
//! shard's child watches select on that label, so a shard caches only its own parents'
//! children and two shards each hold about half of one host's children (BENCHMARKS.md, "Two
//! shards on one machine"). A child's owner is known, its owner's shard is not, so the label
//! is what the API server can filter on. A parent new to a shard (created, moved by its label,
//! or left by a host that ran with another count) is not decided until its children are the
//! shard's: the shard lists the children of the parent's namespace that the parent controls,
//! labels those not yet labelled for it, records on the parent that its children are labelled
//! for this shard (`policy-host.io/children-shard`), and decides once its cache holds them
//! (`controller::adopt`). A decision on a view without them would recreate or write off
//! children that exist. The old shard is not needed for this (it may be down), and a write it
//! still had under way may label a child back to itself: the next apply by the new shard
//! labels it again, and until then the new shard's view lacks that child, the same window as
//! any in-flight write of the old shard's (above). An object made by anyone but the host that
//! is to count as a child (labelled for the policy, controlled by the parent) must carry the
//! label too when it is created after its parent came to its shard: a shard cannot see what
//! its watches do not select.
//!
//! Nor is plugin loading: every shard's leader
//! loads the plugin ConfigMaps, records their load Events and publishes `policy-host-status`
//! (the shards load the same ConfigMaps, so they publish the same plugins; the last writer's
//! load times stand).

use kube::ResourceExt;
use kube::api::DynamicObject;

/// The label an admin sets on a parent to choose its shard (a decimal shard index).
pub const SHARD_LABEL: &str = "policy-host.io/shard";

/// The label the host sets on every child it applies when there is more than one shard: the
/// shard of the child's parent ([`Shard::child_label`]), which that shard's child watches select.
pub const CHILD_SHARD_LABEL: &str = "policy-host.io/owner-shard";

/// The annotation the host sets on a parent once its children carry its shard's
/// [`CHILD_SHARD_LABEL`] (the same value): the parent's children need no relabelling.
pub const CHILDREN_SHARD_ANNOTATION: &str = "policy-host.io/children-shard";

/// The shard this host serves: `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    index: u32,
    count: u32,
}

/// A shard command line that names no shard.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// `--shards 0`.
    #[error(
        "--shards 0 leaves no shard to reconcile anything; write --shards 1 (or leave it out) for one host, or --shards N to split the parents among N host deployments"
    )]
    NoShards,
    /// `--shard` at or past `--shards`.
    #[error(
        "--shard {index} is not a shard of --shards {count}: shards are numbered 0 to {last}; give each host deployment one of --shard 0 to --shard {last}, or raise --shards to {needed} on every deployment"
    )]
    OutOfRange {
        /// The index given.
        index: u32,
        /// The count given.
        count: u32,
        /// The largest valid index.
        last: u32,
        /// The count that would make `index` valid.
        needed: u64,
    },
}

/// Why a parent belongs to its shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AssignedBy {
    /// There is one shard: it owns everything, labels are not read.
    OnlyShard,
    /// The admin's `policy-host.io/shard` label.
    Label,
    /// The stable hash of the parent's namespace and name.
    Hash,
    /// The stable hash, because the label (the text kept here) names no shard of this count.
    HashOverUnusableLabel(String),
}

/// Which shard a parent belongs to, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The shard index.
    pub shard: u32,
    /// Why.
    pub by: AssignedBy,
}

impl Shard {
    /// Shard `index` of `count`, or why that names no shard.
    pub fn new(index: u32, count: u32) -> Result<Self, ShardError> {
        if count == 0 {
            return Err(ShardError::NoShards);
        }
        if index >= count {
            return Err(ShardError::OutOfRange {
                index,
                count,
                last: count - 1,
                needed: u64::from(index) + 1,
            });
        }
        Ok(Self { index, count })
    }

    /// The only shard: one host (its replicas electing one leader) reconciles every parent.
    pub fn whole() -> Self {
        Self { index: 0, count: 1 }
    }

    /// This shard's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// How many shards there are.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The Lease this shard's replicas elect their leader through: `base` itself for the only
    /// shard (a host that was never sharded keeps its Lease), `<base>-shard-<index>` otherwise.
    pub fn lease_name(&self, base: &str) -> String {
        if self.count == 1 {
            base.to_string()
        } else {
            format!("{base}-shard-{}", self.index)
        }
    }

    /// The value of [`CHILD_SHARD_LABEL`] on this shard's parents' children, `<index>-of-<count>`
    /// (the count too: shard 1 of 2 and shard 1 of 3 own different parents); `None` for the only
    /// shard, whose children carry no shard label and whose caches select on the policy alone.
    pub fn child_label(&self) -> Option<String> {
        (self.count > 1).then(|| format!("{}-of-{}", self.index, self.count))
    }

    /// Which shard the parent `namespace`/`name`, with the shard label `label` if it has one,
    /// belongs to.
    pub fn assign(&self, namespace: &str, name: &str, label: Option<&str>) -> Assignment {
        if self.count == 1 {
            return Assignment {
                shard: 0,
                by: AssignedBy::OnlyShard,
            };
        }
        let hashed = (stable_hash(&format!("{namespace}/{name}")) % u64::from(self.count)) as u32;
        match label {
            None => Assignment {
                shard: hashed,
                by: AssignedBy::Hash,
            },
            Some(text) => match text.parse::<u32>() {
                Ok(shard) if shard < self.count => Assignment {
                    shard,
                    by: AssignedBy::Label,
                },
                _ => Assignment {
                    shard: hashed,
                    by: AssignedBy::HashOverUnusableLabel(text.to_string()),
                },
            },
        }
    }

    /// Which shard `parent` belongs to (see [`Shard::assign`]).
    pub fn assign_parent(&self, parent: &DynamicObject) -> Assignment {
        self.assign(
            parent.namespace().as_deref().unwrap_or_default(),
            &parent.name_any(),
            parent.labels().get(SHARD_LABEL).map(String::as_str),
        )
    }

    /// Whether this shard reconciles `parent`.
    pub fn owns(&self, parent: &DynamicObject) -> bool {
        self.assign_parent(parent).shard == self.index
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shard {} of {}", self.index, self.count)
    }
}

/// 64-bit FNV-1a of `text`'s bytes: the same value in every process and version.
pub fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(index: u32, count: u32) -> Shard {
        Shard::new(index, count).expect("a valid shard")
    }

    #[test]
    fn the_hash_is_fnv1a_and_never_changes() {
        // Published FNV-1a 64 test vectors: a change here moves parents between shards on
        // upgrade, so it must never happen by accident.
        for (text, hash) in [
            ("", 0xcbf2_9ce4_8422_2325_u64),
            ("a", 0xaf63_dc4c_8601_ec8c),
            ("foobar", 0x8594_4171_f739_67e8),
        ] {
            assert_eq!(stable_hash(text), hash, "fnv1a64({text:?})");
        }
    }

    #[test]
    fn children_are_labelled_with_their_parents_shard_only_when_there_are_shards() {
        assert_eq!(Shard::whole().child_label(), None);
        assert_eq!(shard(0, 2).child_label().as_deref(), Some("0-of-2"));
        // A label value (alphanumerics, `-`, `_`, `.`), and another count is another label.
        assert_eq!(shard(1, 3).child_label().as_deref(), Some("1-of-3"));
        assert_ne!(shard(1, 2).child_label(), shard(1, 3).child_label());
    }

    /// One situation: a parent `prod/db` with `label`, among `count` shards.
    struct Row {
        situation: &'static str,
        label: Option<&'static str>,
        count: u32,
        shard: Option<u32>,
        by: AssignedBy,
    }

    #[test]
    fn each_situation_goes_to_its_shard() {
        let hashed = (stable_hash("prod/db") % 2) as u32;
        let rows = [
            Row {
                situation: "one shard owns everything, labelled or not",
                label: Some("1"),
                count: 1,
                shard: Some(0),
                by: AssignedBy::OnlyShard,
            },
            Row {
                situation: "no label: the hash of namespace/name",
                label: None,
                count: 2,
                shard: None,
                by: AssignedBy::Hash,
            },
            Row {
                situation: "the admin's label wins over the hash (0)",
                label: Some("0"),
                count: 2,
                shard: Some(0),
                by: AssignedBy::Label,
            },
            Row {
                situation: "the admin's label wins over the hash (1)",
                label: Some("1"),
                count: 2,
                shard: Some(1),
                by: AssignedBy::Label,
            },
            Row {
                situation: "a label past the last shard is ignored: the hash",
                label: Some("2"),
                count: 2,
                shard: None,
                by: AssignedBy::HashOverUnusableLabel("2".into()),
            },
            Row {
                situation: "a label that is not a number is ignored: the hash",
                label: Some("one"),
                count: 2,
                shard: None,
                by: AssignedBy::HashOverUnusableLabel("one".into()),
            },
            Row {
                situation: "a negative label is ignored: the hash",
                label: Some("-1"),
                count: 2,
                shard: None,
                by: AssignedBy::HashOverUnusableLabel("-1".into()),
            },
        ];
        for row in rows {
            let assignment = shard(0, row.count).assign("prod", "db", row.label);
            assert_eq!(
                assignment,
                Assignment {
                    // `None`: whatever the hash says.
                    shard: row.shard.unwrap_or(hashed),
                    by: row.by
                },
                "{}",
                row.situation
            );
        }
    }

    #[test]
    fn namespace_and_name_both_choose_the_shard() {
        // Same name in two namespaces, and the same namespace with two names: the key is the
        // pair, so neither a namespace nor a common name lands every parent on one shard.
        let four = shard(0, 4);
        let by_namespace: std::collections::BTreeSet<u32> = (0..32)
            .map(|n| four.assign(&format!("team-{n}"), "db", None).shard)
            .collect();
        let by_name: std::collections::BTreeSet<u32> = (0..32)
            .map(|n| four.assign("prod", &format!("db-{n}"), None).shard)
            .collect();
        assert_eq!(by_namespace.len(), 4, "{by_namespace:?}");
        assert_eq!(by_name.len(), 4, "{by_name:?}");
    }

    #[test]
    fn the_hash_splits_many_parents_evenly() {
        for count in [2u32, 3, 8] {
            let any = shard(0, count);
            let mut per_shard = vec![0usize; count as usize];
            for n in 0..10_000 {
                per_shard[any.assign("default", &format!("c{n:05}"), None).shard as usize] += 1;
            }
            let fair = 10_000 / count as usize;
            for (index, parents) in per_shard.iter().enumerate() {
                assert!(
                    parents.abs_diff(fair) * 10 < fair,
                    "{count} shards: shard {index} got {parents} of 10,000 (fair: {fair})"
                );
            }
        }
    }

    #[test]
    fn exactly_one_shard_owns_each_parent() {
        let shards: Vec<Shard> = (0..3).map(|i| shard(i, 3)).collect();
        for (name, label) in [("a", None), ("b", Some("2")), ("c", Some("7")), ("d", None)] {
            let mut parent = DynamicObject::new(
                name,
                &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            )
            .within("prod");
            if let Some(label) = label {
                parent
                    .labels_mut()
                    .insert(SHARD_LABEL.to_string(), label.to_string());
            }
            let owners = shards.iter().filter(|s| s.owns(&parent)).count();
            assert_eq!(owners, 1, "{name} (label {label:?}) has {owners} owners");
        }
    }

    #[test]
    fn a_bad_shard_command_line_says_what_to_write() {
        let cases = [
            (0, 0, "--shards 0 leaves no shard", "write --shards 1"),
            (
                2,
                2,
                "--shard 2 is not a shard of --shards 2",
                "one of --shard 0 to --shard 1, or raise --shards to 3",
            ),
            (
                1,
                1,
                "--shard 1 is not a shard of --shards 1",
                "raise --shards to 2",
            ),
        ];
        for (index, count, what, advice) in cases {
            let error = Shard::new(index, count).expect_err("an invalid shard");
            let text = error.to_string();
            assert!(
                text.contains(what) && text.contains(advice),
                "--shard {index} --shards {count}: {text}"
            );
        }
        assert_eq!(Shard::new(1, 2), Ok(shard(1, 2)));
    }

    #[test]
    fn only_several_shards_rename_the_lease() {
        assert_eq!(Shard::whole().lease_name("policy-host"), "policy-host");
        assert_eq!(shard(0, 2).lease_name("policy-host"), "policy-host-shard-0");
        assert_eq!(shard(1, 2).lease_name("policy-host"), "policy-host-shard-1");
    }
}
