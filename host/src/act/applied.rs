//! What the host last applied to each child, so that an apply that would write nothing new is
//! not sent: a steady parent then costs the API server no write at all (issue 28).
//!
//! A plugin re-applies its children on every decision (guest-etcd: two Services and a budget
//! every 30 s); server-side apply of an unchanged object changes nothing but still costs a
//! round trip and the API server's work, which at 10,000 parents was most of what a reconcile
//! cost. An apply is skipped when the child observed is still the object the host's own last
//! apply left — same uid, same resourceVersion — and the body is the one applied then. Any
//! write to the child by anyone (a hand edit, another field manager, a controller's status)
//! moves its resourceVersion, and the next decision applies again: drift is repaired by the
//! reconcile the child's own watch event triggers. Besides, every child is applied again at
//! least every [`REAPPLY_AFTER`] and after every host start (the book lives in memory), in case
//! the watch cache missed a change.
//!
//! Memory: one entry per child applied, dropped when the decision deletes the child, when the
//! parent is finalized or gone, and at the latest [`REAPPLY_AFTER`] after its last apply.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::observe::OwnedChild;

/// The longest a child goes without an apply while its applies are skipped. Watch events are
/// not normally missed (kube-runtime's own default requeue for that case is an hour); this is
/// the backstop for a cache that missed one.
pub const REAPPLY_AFTER: Duration = Duration::from_secs(3600);

/// How often entries past [`REAPPLY_AFTER`] are swept out (on the next apply recorded).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A digest of an applied body: 128 bits of SHA-256, so that two bodies never pass for one.
pub type BodyDigest = [u8; 16];

/// The digest of `object` as the host sends it: serde_json writes a `Value`'s maps with sorted
/// keys, so one body always gives one digest.
pub fn digest(object: &Value) -> BodyDigest {
    use sha2::{Digest, Sha256};
    let bytes = serde_json::to_vec(object).unwrap_or_default();
    let mut out = [0; 16];
    out.copy_from_slice(&Sha256::digest(&bytes)[..16]);
    out
}

/// The host's last apply of one child.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LastApply {
    /// The uid and resourceVersion the API server answered that apply with.
    written: OwnedChild,
    /// What was applied.
    body: BodyDigest,
    /// When.
    at: Instant,
}

impl LastApply {
    /// Whether applying `body` to the child `observed` would write nothing new at `now`.
    fn covers(&self, observed: &OwnedChild, body: &BodyDigest, now: Instant) -> bool {
        self.written == *observed
            && self.body == *body
            && now.saturating_duration_since(self.at) < REAPPLY_AFTER
    }
}

/// A child, as the book knows it: its kind (`plural.apiVersion`) and name.
type ChildKey = (String, String);

#[derive(Default)]
struct Book {
    /// By parent (`namespace/name`), then child.
    parents: HashMap<String, HashMap<ChildKey, LastApply>>,
    swept_at: Option<Instant>,
}

/// The host's last apply of every child, shared by every reconcile of one policy.
#[derive(Clone, Default)]
pub struct AppliedChildren(Arc<Mutex<Book>>);

impl AppliedChildren {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether applying `body` to the child `kind`/`name` of `parent`, observed as `observed`,
    /// would write nothing the host's own last apply did not: then it is not sent.
    pub fn unchanged(
        &self,
        parent: &str,
        (kind, name): (&str, &str),
        observed: &OwnedChild,
        body: &BodyDigest,
        now: Instant,
    ) -> bool {
        self.book()
            .parents
            .get(parent)
            .and_then(|children| children.get(&(kind.to_owned(), name.to_owned())))
            .is_some_and(|last| last.covers(observed, body, now))
    }

    /// The host applied `body` to the child and the API server answered with `written`.
    pub fn applied(
        &self,
        parent: &str,
        (kind, name): (&str, &str),
        written: OwnedChild,
        body: BodyDigest,
        now: Instant,
    ) {
        let mut book = self.book();
        if book
            .swept_at
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY)
        {
            book.swept_at = Some(now);
            book.parents.retain(|_, children| {
                children.retain(|_, last| now.saturating_duration_since(last.at) < REAPPLY_AFTER);
                !children.is_empty()
            });
        }
        book.parents.entry(parent.to_owned()).or_default().insert(
            (kind.to_owned(), name.to_owned()),
            LastApply {
                written,
                body,
                at: now,
            },
        );
    }

    /// The child is deleted: its entry goes.
    pub fn forget_child(&self, parent: &str, (kind, name): (&str, &str)) {
        let mut book = self.book();
        if let Some(children) = book.parents.get_mut(parent) {
            children.remove(&(kind.to_owned(), name.to_owned()));
            if children.is_empty() {
                book.parents.remove(parent);
            }
        }
    }

    /// The parent (`namespace/name`) is finalized or gone: its children's entries go.
    pub fn forget_parent(&self, parent: &str) {
        self.book().parents.remove(parent);
    }

    /// How many children have an entry.
    pub fn len(&self) -> usize {
        self.book().parents.values().map(HashMap::len).sum()
    }

    /// Whether no child has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(uid: &str, version: &str) -> OwnedChild {
        OwnedChild {
            uid: uid.into(),
            resource_version: version.into(),
        }
    }

    const CM: (&str, &str) = ("configmaps.v1", "p-steady-0");

    /// Pure logic: when an apply is skipped, one row per situation.
    #[test]
    fn an_apply_is_skipped_only_onto_the_object_the_last_apply_left_with_the_same_body() {
        let start = Instant::now();
        let body = digest(&serde_json::json!({"data": {"a": "1"}}));
        let other_body = digest(&serde_json::json!({"data": {"a": "2"}}));
        // (situation, observed, body, at, skipped)
        let rows = [
            (
                "the object as the last apply left it, the same body",
                child("u1", "10"),
                body,
                start + Duration::from_secs(30),
                true,
            ),
            (
                "the child was written since (a hand edit moved its resourceVersion)",
                child("u1", "11"),
                body,
                start + Duration::from_secs(30),
                false,
            ),
            (
                "the child was replaced by another of the same name",
                child("u2", "10"),
                body,
                start + Duration::from_secs(30),
                false,
            ),
            (
                "the plugin applies another body",
                child("u1", "10"),
                other_body,
                start + Duration::from_secs(30),
                false,
            ),
            (
                "the last apply is older than the backstop",
                child("u1", "10"),
                body,
                start + REAPPLY_AFTER,
                false,
            ),
        ];
        for (situation, observed, applying, at, skipped) in rows {
            let book = AppliedChildren::default();
            book.applied("ns/p", CM, child("u1", "10"), body, start);
            assert_eq!(
                book.unchanged("ns/p", CM, &observed, &applying, at),
                skipped,
                "{situation}"
            );
        }
        let book = AppliedChildren::default();
        assert!(
            !book.unchanged("ns/p", CM, &child("u1", "10"), &body, start),
            "a child the host never applied (since it started)"
        );
        book.applied("ns/p", CM, child("u1", "10"), body, start);
        assert!(
            !book.unchanged(
                "ns/p",
                ("configmaps.v1", "p-steady-1"),
                &child("u1", "10"),
                &body,
                start
            ),
            "another child of the same parent"
        );
        assert!(
            !book.unchanged("ns/q", CM, &child("u1", "10"), &body, start),
            "the same name under another parent"
        );
    }

    #[test]
    fn entries_go_with_their_child_their_parent_and_their_age() {
        let start = Instant::now();
        let body = digest(&serde_json::json!({}));
        let book = AppliedChildren::default();
        for parent in ["ns/a", "ns/b"] {
            for n in 0..3 {
                let name = format!("c{n}");
                book.applied(
                    parent,
                    ("configmaps.v1", &name),
                    child("u", "1"),
                    body,
                    start,
                );
            }
        }
        assert_eq!(book.len(), 6);
        book.forget_child("ns/a", ("configmaps.v1", "c0"));
        assert_eq!(book.len(), 5, "a deleted child");
        book.forget_parent("ns/a");
        assert_eq!(book.len(), 3, "a parent gone");
        // The next apply recorded past the backstop sweeps out what is older than it.
        book.applied(
            "ns/c",
            ("configmaps.v1", "c0"),
            child("u", "1"),
            body,
            start + REAPPLY_AFTER,
        );
        assert_eq!(book.len(), 1, "entries past the backstop are swept");
    }

    #[test]
    fn one_body_gives_one_digest_whatever_the_order_of_its_keys() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":3}}"#).expect("json");
        let b: Value = serde_json::from_str(r#"{"a":{"x":3,"y":2},"b":1}"#).expect("json");
        assert_eq!(digest(&a), digest(&b));
        assert_ne!(digest(&a), digest(&serde_json::json!({"a": 1})));
    }
}
