//! The requeue: when each parent is reconciled again, kept in the host's own queue.
//!
//! Every parent is reconciled in turn when more are due than the controller can take, and a
//! change never waits behind a backlog of requeues (issue 28).
//!
//! kube-runtime 5's scheduler puts every due request it cannot start at once into a `pending`
//! hash set and always starts the first one in the set's iteration order
//! (`scheduler.rs`, `poll_pop_queue_message`). While requeues fall due faster than the
//! controller reconciles, the parents early in that order come round again before the others
//! are reached: the same parents are reconciled every interval and the rest never, and a
//! change to one of the rest is dropped as already pending (BENCHMARKS.md, "From a change to
//! its reconcile": 4,494 of 10,000 parents not reconciled for over a minute).
//!
//! So requeues never enter kube-runtime's scheduler. A reconcile returns this module's
//! [`Action`]; the controller gives kube-runtime `await_change` and keeps the requeue here,
//! ordered by when it falls due (first in, first out among those due). [`Requeues::due_parents`]
//! hands due parents to kube-runtime (`Controller::reconcile_on`) only while fewer than the
//! controller's concurrency are running or handed over: a requeue is started as soon as it is
//! handed, so kube-runtime's pending set holds watch events (changes) and at most `concurrency`
//! requeues, and a change is taken before every requeue not yet handed. Under overload
//! requeues run late, oldest first, each parent once per round; changes run first.
//!
//! A reconcile that starts for any reason (a change, a child) replaces the parent's requeue
//! due, as kube-runtime's own scheduler merges them; the reconcile's own action schedules the
//! next. The fix in kube-runtime itself (an insertion-ordered pending set) is written up in
//! ARCHITECTURE.md ("Requeues in turn").

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::Stream;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Reconcile again after this long when a plugin asks for nothing sooner.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// The shortest requeue a plugin can ask for: `requeue-after: 0` would otherwise loop
/// decisions and writes as fast as the API server answers (review #18).
pub const MIN_REQUEUE: Duration = Duration::from_secs(1);

/// When to reconcile again: what the plugin asked for, never sooner than [`MIN_REQUEUE`],
/// or `otherwise` when it asked for nothing.
pub fn requeue_delay(asked_ms: Option<u64>, otherwise: Duration) -> Duration {
    asked_ms.map_or(otherwise, |ms| Duration::from_millis(ms).max(MIN_REQUEUE))
}

/// What a carried-out decision asks for next: the plugin's requeue (or [`DEFAULT_RESYNC`]),
/// sooner when the parent's chaos drill next needs a look.
pub fn after_decision(asked_ms: Option<u64>, drill_due: Option<Duration>) -> Action {
    let requeue = requeue_delay(asked_ms, DEFAULT_RESYNC);
    Action::requeue(drill_due.map_or(requeue, |due| requeue.min(due)))
}

/// What a reconcile asks for next, in kube-runtime's words: the host keeps the requeue itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile again after `after` if no change comes sooner.
    pub const fn requeue(after: Duration) -> Self {
        Self {
            requeue_after: Some(after),
        }
    }

    /// Reconcile again only on a change.
    pub const fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// When to reconcile again without a change, if at all.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// A parent, as kube-runtime addresses it.
pub type ParentRef = ObjectRef<DynamicObject>;

/// How long a parent handed to kube-runtime counts against the concurrency before its
/// reconcile starts. It normally starts at once; one that never does (deleted between the
/// hand-over and the start) must not hold a slot for ever.
const HANDED_PATIENCE: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Queue {
    /// Requeues by when they fall due, then by the order they were asked for.
    due: BTreeMap<(Instant, u64), ParentRef>,
    /// Each parent's place in `due`.
    place: HashMap<ParentRef, (Instant, u64)>,
    asked: u64,
    /// Reconciles running (whatever started them).
    running: usize,
    /// Parents handed to kube-runtime whose reconcile has not started yet, and since when.
    handed: HashMap<ParentRef, Instant>,
}

impl Queue {
    fn unschedule(&mut self, parent: &ParentRef) {
        if let Some(place) = self.place.remove(parent) {
            self.due.remove(&place);
        }
    }
}

/// The requeues of one policy's parents.
pub struct Requeues {
    queue: Mutex<Queue>,
    /// Wakes [`Requeues::due_parents`]: a requeue asked for, or a reconcile ended.
    wake: Notify,
    /// How many reconciles kube-runtime runs at once (0: no limit).
    concurrency: usize,
}

/// A reconcile running: counted until dropped.
pub struct Running {
    requeues: Arc<Requeues>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut queue = self.requeues.queue();
        queue.running = queue.running.saturating_sub(1);
        drop(queue);
        self.requeues.wake.notify_one();
    }
}

impl Requeues {
    /// The queue of a controller running `concurrency` reconciles at once (0: no limit).
    pub fn new(concurrency: u16) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::default(),
            wake: Notify::new(),
            concurrency: usize::from(concurrency),
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reconcile of `parent` starts: its requeue due is replaced by this reconcile, and it
    /// counts as running until the guard is dropped.
    pub fn started(self: &Arc<Self>, parent: &ParentRef) -> Running {
        let mut queue = self.queue();
        queue.unschedule(parent);
        queue.handed.remove(parent);
        queue.running += 1;
        Running {
            requeues: self.clone(),
        }
    }

    /// `parent`'s reconcile (or its error policy) asks for `next`, from `now`. A requeue
    /// already due sooner is kept.
    pub fn schedule(&self, parent: ParentRef, next: Action, now: Instant) {
        let Some(after) = next.requeue_after() else {
            return;
        };
        let at = now + after;
        let mut queue = self.queue();
        if queue.place.get(&parent).is_some_and(|(due, _)| *due <= at) {
            return;
        }
        queue.unschedule(&parent);
        queue.asked += 1;
        let place = (at, queue.asked);
        queue.due.insert(place, parent.clone());
        queue.place.insert(parent, place);
        drop(queue);
        self.wake.notify_one();
    }

    /// `parent` is no longer in the cache: nothing is kept for it.
    pub fn gone(&self, parent: &ParentRef) {
        let mut queue = self.queue();
        queue.unschedule(parent);
        queue.handed.remove(parent);
        drop(queue);
        self.wake.notify_one();
    }

    /// The parents due at `now` that fit beside the reconciles running and handed over, oldest
    /// first, now counted as handed over; `exists` drops those no longer cached. When none
    /// is handed: `Err` with when the next falls due, if a slot is free for it.
    fn take_due(
        &self,
        now: Instant,
        exists: impl Fn(&ParentRef) -> bool,
    ) -> Result<Vec<ParentRef>, Option<Instant>> {
        let mut queue = self.queue();
        queue
            .handed
            .retain(|_, at| now.saturating_duration_since(*at) < HANDED_PATIENCE);
        let busy = queue.running + queue.handed.len();
        let mut free = if self.concurrency == 0 {
            usize::MAX
        } else {
            self.concurrency.saturating_sub(busy)
        };
        let mut taken = Vec::new();
        while free > 0 {
            let Some(entry) = queue.due.first_entry() else {
                break;
            };
            if entry.key().0 > now {
                break;
            }
            let parent = entry.remove();
            queue.place.remove(&parent);
            if exists(&parent) {
                queue.handed.insert(parent.clone(), now);
                taken.push(parent);
                free -= 1;
            }
        }
        if !taken.is_empty() {
            return Ok(taken);
        }
        let next = queue.due.first_key_value().map(|((at, _), _)| *at);
        // A handed parent past its patience frees its slot then.
        let patience = queue.handed.values().min().map(|at| *at + HANDED_PATIENCE);
        Err(if free > 0 { next } else { patience })
    }

    /// The parents whose requeue is due, each when it may start at once: give this stream to
    /// `Controller::reconcile_on`. `exists` says whether a parent is still cached (one that is
    /// not is dropped, not handed over).
    pub fn due_parents(
        self: Arc<Self>,
        exists: impl Fn(&ParentRef) -> bool + Send + Sync + 'static,
    ) -> impl Stream<Item = ParentRef> + Send + 'static {
        let exists = Arc::new(exists);
        futures::StreamExt::flatten(futures::stream::unfold(self, move |requeues| {
            let exists = exists.clone();
            async move {
                loop {
                    match requeues.take_due(Instant::now(), |p| exists(p)) {
                        Ok(due) => return Some((futures::stream::iter(due), requeues)),
                        Err(Some(at)) => {
                            tokio::select! {
                                () = requeues.wake.notified() => {}
                                () = tokio::time::sleep_until(at) => {}
                            }
                        }
                        Err(None) => requeues.wake.notified().await,
                    }
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ApiResource;

    fn parent(name: &str) -> ParentRef {
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        ObjectRef::new_with(name, resource).within("ns")
    }

    fn names(parents: &[ParentRef]) -> Vec<&str> {
        parents.iter().map(|p| p.name.as_str()).collect()
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn due_parents_are_handed_over_oldest_first_and_only_into_free_slots() {
        let requeues = Requeues::new(2);
        let t0 = Instant::now();
        requeues.schedule(parent("c"), Action::requeue(3 * SECOND), t0);
        requeues.schedule(parent("a"), Action::requeue(SECOND), t0);
        requeues.schedule(parent("b"), Action::requeue(2 * SECOND), t0);
        requeues.schedule(parent("late"), Action::requeue(60 * SECOND), t0);
        requeues.schedule(parent("never"), Action::await_change(), t0);
        assert_eq!(
            requeues.take_due(t0, |_| true),
            Err(Some(t0 + SECOND)),
            "nothing due yet: wait for the first"
        );
        let at = t0 + 5 * SECOND;
        let handed = requeues.take_due(at, |_| true).expect("two slots free");
        assert_eq!(names(&handed), ["a", "b"], "the oldest due, as many as fit");
        assert_eq!(
            requeues.take_due(at, |_| true),
            Err(Some(at + HANDED_PATIENCE)),
            "both slots taken by parents handed over: wait for a slot"
        );
        let running_a = requeues.started(&parent("a"));
        assert_eq!(
            requeues.take_due(at, |_| true),
            Err(Some(at + HANDED_PATIENCE)),
            "a runs, b is handed over"
        );
        drop(running_a);
        let handed = requeues.take_due(at, |_| true).expect("a slot freed");
        assert_eq!(names(&handed), ["c"]);
    }

    #[test]
    fn a_reconcile_started_by_a_change_replaces_the_requeue_due() {
        let requeues = Requeues::new(8);
        let t0 = Instant::now();
        requeues.schedule(parent("a"), Action::requeue(SECOND), t0);
        let running = requeues.started(&parent("a"));
        requeues.schedule(parent("a"), Action::requeue(30 * SECOND), t0 + SECOND);
        drop(running);
        assert_eq!(
            requeues.take_due(t0 + 2 * SECOND, |_| true),
            Err(Some(t0 + 31 * SECOND)),
            "only the requeue the last reconcile asked for"
        );
        requeues.schedule(parent("a"), Action::requeue(60 * SECOND), t0 + SECOND);
        assert_eq!(
            requeues.take_due(t0 + 2 * SECOND, |_| true),
            Err(Some(t0 + 31 * SECOND)),
            "a later requeue does not postpone one due sooner"
        );
    }

    #[test]
    fn a_parent_gone_or_never_started_gives_its_slot_back() {
        let requeues = Requeues::new(1);
        let t0 = Instant::now();
        requeues.schedule(parent("deleted"), Action::requeue(SECOND), t0);
        requeues.schedule(parent("a"), Action::requeue(SECOND), t0);
        requeues.schedule(parent("b"), Action::requeue(SECOND), t0);
        let at = t0 + SECOND;
        let handed = requeues
            .take_due(at, |p| p.name != "deleted")
            .expect("one slot");
        assert_eq!(
            names(&handed),
            ["a"],
            "a parent no longer cached is dropped"
        );
        requeues.gone(&parent("a"));
        let handed = requeues
            .take_due(at, |_| true)
            .expect("a's slot given back");
        assert_eq!(names(&handed), ["b"]);
        assert_eq!(
            requeues.take_due(at, |_| true),
            Err(Some(at + HANDED_PATIENCE)),
            "b holds the slot until its patience runs out"
        );
        assert_eq!(requeues.take_due(at + HANDED_PATIENCE, |_| true), Err(None));
    }

    /// Pure logic, simulated time: 24 parents asking to be reconciled every 1.5 s, a reconcile
    /// taking 250 ms, 2 at once: twice the demand the controller meets. Every parent is
    /// reconciled in turn, each about as often as the others.
    #[test]
    fn under_twice_the_demand_every_parent_is_reconciled_in_turn() {
        let requeues = Requeues::new(2);
        let parents: Vec<ParentRef> = (0..24).map(|i| parent(&format!("p{i:02}"))).collect();
        let t0 = Instant::now();
        for p in &parents {
            requeues.schedule(p.clone(), Action::requeue(Duration::ZERO), t0);
        }
        let step = Duration::from_millis(50);
        let mut running: Vec<(ParentRef, Instant, Running)> = Vec::new();
        let mut reconciled: HashMap<String, u32> = HashMap::new();
        let mut now = t0;
        while now < t0 + Duration::from_secs(60) {
            now += step;
            let (ended, still): (Vec<_>, Vec<_>) =
                running.into_iter().partition(|(_, ends, _)| *ends <= now);
            running = still;
            for (p, _, guard) in ended {
                requeues.schedule(p, Action::requeue(Duration::from_millis(1500)), now);
                drop(guard);
            }
            for p in requeues.take_due(now, |_| true).unwrap_or_default() {
                let guard = requeues.started(&p);
                *reconciled.entry(p.name.clone()).or_default() += 1;
                running.push((p, now + Duration::from_millis(250), guard));
            }
        }
        let counts: Vec<u32> = parents
            .iter()
            .map(|p| reconciled.get(&p.name).copied().unwrap_or(0))
            .collect();
        let (least, most) = (
            counts.iter().min().copied().unwrap_or(0),
            counts.iter().max().copied().unwrap_or(0),
        );
        // 8 reconciles a second for 60 s over 24 parents: 20 each.
        assert!(least >= 18, "a parent was left behind: {counts:?}");
        assert!(most - least <= 1, "parents reconciled unevenly: {counts:?}");
    }

    #[test]
    fn a_requeue_of_zero_waits_the_floor() {
        assert_eq!(requeue_delay(Some(0), DEFAULT_RESYNC), MIN_REQUEUE);
        assert_eq!(requeue_delay(Some(999), DEFAULT_RESYNC), MIN_REQUEUE);
    }

    #[test]
    fn a_requeue_above_the_floor_is_kept_and_none_means_the_default() {
        assert_eq!(
            requeue_delay(Some(2_500), DEFAULT_RESYNC),
            Duration::from_millis(2_500)
        );
        assert_eq!(requeue_delay(None, DEFAULT_RESYNC), DEFAULT_RESYNC);
        assert_eq!(
            requeue_delay(None, Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }
}
