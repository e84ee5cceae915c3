//! Leader election: of the host's replicas, only the one holding a `coordination.k8s.io`
//! Lease reconciles and writes; the others wait, ready to take over.
//!
//! The protocol is client-go's (`tools/leaderelection`): the holder renews the Lease every
//! [`LeaseSettings::renew_every`]; a replica that cannot renew for
//! [`LeaseSettings::renew_deadline`] stops leading at once. A standby takes the Lease when it
//! has no holder (a graceful handover: the leader cleared it on its way out) or when the
//! Lease's record has not changed, *as seen by the standby's own clock*, for
//! [`LeaseSettings::lease_duration`] (the leader died). Comparing the standby's observation
//! times rather than the renew time written in the Lease keeps clock skew between nodes out of
//! it. Every write is a replace carrying the `resourceVersion` that was read, so two replicas
//! racing for the Lease cannot both win: the API server refuses the second with a conflict.
//!
//! Why the renew deadline is shorter than the lease duration: a leader that loses the API
//! server stops itself after `renew_deadline`, before any standby may take over after
//! `lease_duration`, so two hosts never decide at the same time while clocks tick at the same
//! rate.
//!
//! Why not a crate: `kube-leader-election` 0.44 is built on kube 4 (a second kube in the
//! tree); `kube-lease-manager` 0.13 (kube 5) sleeps a standby until the recorded expiry even
//! after the holder released the Lease, which makes a graceful handover take the full lease
//! duration instead of under 2 s, and unwraps a time computed from the Lease's own
//! `leaseDurationSeconds` (a negative value written by anybody with Lease access panics it).
//! The protocol is small enough to own.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

/// How a replica takes part in leader election.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// Namespace of the Lease (the host's own namespace).
    pub namespace: String,
    /// Name of the Lease (every replica of one host deployment uses the same).
    pub name: String,
    /// This replica's identity, unique among replicas (the Pod name in a cluster).
    pub identity: String,
    /// How long a Lease whose record does not change stays held by its holder.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops leading (shorter than
    /// `lease_duration`).
    pub renew_deadline: Duration,
    /// How often the leader renews.
    pub renew_every: Duration,
    /// How often a standby looks at the Lease, and a leader retries a renewal that failed.
    pub retry_every: Duration,
}

impl LeaseSettings {
    /// The defaults: a 10 s lease renewed every 2 s, given up after 7 s without a renewal,
    /// looked at every second by standbys. A dead leader is replaced within about 12 s (lease
    /// duration plus at most two looks), a leader that hands over within about a second.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(7),
            renew_every: Duration::from_secs(2),
            retry_every: Duration::from_secs(1),
        }
    }
}

/// Why leader election failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The API server refused or failed a Lease request.
    #[error(
        "cannot read or write Lease {namespace}/{name}: {source}; check that the host's ServiceAccount may get, create and update leases.coordination.k8s.io in {namespace} (deploy/rbac.yaml)"
    )]
    Api {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
}

/// Whether this replica leads, readable by anyone (the admin endpoint, tests).
#[derive(Clone, Debug)]
pub struct Leadership(watch::Receiver<bool>);

impl Leadership {
    /// True while this replica holds the Lease.
    pub fn is_leader(&self) -> bool {
        *self.0.borrow()
    }

    /// A leadership that always leads: leader election is off.
    pub fn always() -> Self {
        let (_, receiver) = watch::channel(true);
        Self(receiver)
    }
}

/// Why a leader stopped leading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostLease {
    /// Another replica holds the Lease now.
    TakenBy(String),
    /// No renewal succeeded within the renew deadline.
    NotRenewed(Duration),
}

impl std::fmt::Display for LostLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TakenBy(holder) => write!(f, "the Lease is held by `{holder}` now"),
            Self::NotRenewed(deadline) => {
                write!(f, "the Lease could not be renewed within {deadline:?}")
            }
        }
    }
}

/// One replica's side of the election.
pub struct LeaseElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// The Lease's last seen resourceVersion and when this replica first saw it.
    observed: Option<(String, Instant)>,
    /// When the last write that kept the Lease this replica's was *sent*: the renew deadline
    /// counts from here. Any standby's clock starts later (it sees the write once applied), so
    /// a leader that gives up at this plus the renew deadline has stopped before a standby may
    /// take over. Kept here, not in one call of [`LeaseElector::hold`], so that the deadline
    /// survives `hold` being called anew.
    renewed: Instant,
    leading: watch::Sender<bool>,
}

impl LeaseElector {
    /// An elector for `settings`, and the handle that tells whether it leads.
    pub fn new(client: Client, settings: LeaseSettings) -> (Self, Leadership) {
        let (leading, receiver) = watch::channel(false);
        let elector = Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
            renewed: Instant::now(),
            leading,
        };
        (elector, Leadership(receiver))
    }

    /// The settings this elector runs with.
    pub fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    /// Waits until this replica holds the Lease. API errors are logged and retried: a standby
    /// that cannot reach the API server simply does not lead.
    pub async fn acquire(&mut self) {
        let mut last_error: Option<String> = None;
        loop {
            let sent = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Holding) => {
                    self.renewed = sent;
                    tracing::info!(
                        identity = %self.settings.identity,
                        lease = %format!("{}/{}", self.settings.namespace, self.settings.name),
                        "leading: this replica holds the Lease"
                    );
                    self.leading.send_replace(true);
                    return;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    tracing::debug!(%holder, "standby: the Lease is held by another replica");
                }
                Err(error) => {
                    let text = error.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        tracing::warn!(error = %text, "standby: leader election failed; retrying");
                    }
                    last_error = Some(text);
                }
            }
            tokio::time::sleep(self.settings.retry_every).await;
        }
    }

    /// Renews the Lease until leadership is lost, and says why. Leadership is lost once no
    /// renewal succeeded within the renew deadline of the last one (counted from when that one
    /// was sent), even if this is called anew meanwhile.
    pub async fn hold(&mut self) -> LostLease {
        let mut next = self.renewed + self.settings.renew_every;
        loop {
            let deadline = self.renewed + self.settings.renew_deadline;
            tokio::time::sleep_until(next.min(deadline)).await;
            if Instant::now() >= deadline {
                return self.lost(LostLease::NotRenewed(self.settings.renew_deadline));
            }
            let sent = Instant::now();
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Holding)) => {
                    self.renewed = sent;
                    next = sent + self.settings.renew_every;
                }
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    return self.lost(LostLease::TakenBy(holder));
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "leader: renewing the Lease failed; retrying");
                    next = Instant::now() + self.settings.retry_every;
                }
                Err(_) => return self.lost(LostLease::NotRenewed(self.settings.renew_deadline)),
            }
        }
    }

    /// Runs `work` while renewing the Lease, and returns what it returns. If the Lease is lost
    /// first, `work` is dropped where it stands, so that nothing it would still do is done
    /// beside the next leader, and the loss is returned. The Lease stays held after `work`:
    /// releasing it is the caller's next step.
    pub async fn while_holding<F: std::future::Future>(
        &mut self,
        work: F,
    ) -> Result<F::Output, LostLease> {
        tokio::select! {
            output = work => Ok(output),
            lost = self.hold() => Err(lost),
        }
    }

    fn lost(&mut self, why: LostLease) -> LostLease {
        self.leading.send_replace(false);
        tracing::error!(reason = %why, "leader: lost the Lease; stopping at once");
        why
    }

    /// Gives the Lease up, so that a standby takes over within its next look instead of
    /// waiting for the lease to expire. Does nothing if another replica holds it.
    pub async fn release(&mut self) -> Result<(), LeaderError> {
        self.leading.send_replace(false);
        let Some(mut lease) = self
            .api
            .get_opt(&self.settings.name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                tracing::info!(identity = %self.settings.identity, "released the Lease");
                Ok(())
            }
            // Somebody wrote it meanwhile (a standby took it over): nothing left to release.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => Err(self.api_error(error)),
        }
    }

    fn api_error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            namespace: self.settings.namespace.clone(),
            name: self.settings.name.clone(),
            source: Box::new(source),
        }
    }

    /// One step of client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, LeaderError> {
        let now = MicroTime(Timestamp::now());
        let duration_seconds =
            i32::try_from(self.settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(mut lease) = self
            .api
            .get_opt(&self.settings.name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.settings.identity.clone()),
                    lease_duration_seconds: Some(duration_seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(Attempt::Holding)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::HeldBy(
                    "another replica (it created the Lease first)".into(),
                )),
                Err(error) => Err(self.api_error(error)),
            };
        };
        let first_seen = self.observe(&lease);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.settings.identity.as_str());
        if let Some(holder) = holder.as_ref().filter(|_| !mine) {
            // A duration written by anybody is only trusted within sane bounds.
            let held_for = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(|s| Duration::from_secs(s.clamp(1, 3600)))
                .unwrap_or(self.settings.lease_duration);
            if first_seen.elapsed() < held_for {
                return Ok(Attempt::HeldBy(holder.clone()));
            }
            tracing::info!(%holder, "the Lease expired without renewal; taking it over");
        }
        if !mine {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.holder_identity = Some(self.settings.identity.clone());
        spec.lease_duration_seconds = Some(duration_seconds);
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.observe(&written);
                Ok(Attempt::Holding)
            }
            // Another replica wrote the Lease since it was read: it renewed, or won the race.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::HeldBy(
                holder.unwrap_or_else(|| "another replica".into()),
            )),
            Err(error) => Err(self.api_error(error)),
        }
    }

    /// Records when this replica first saw the Lease's current version, and returns it.
    fn observe(&mut self, lease: &Lease) -> Instant {
        let version = lease.resource_version().unwrap_or_default();
        match &self.observed {
            Some((seen, at)) if *seen == version => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((version, at));
                at
            }
        }
    }
}

enum Attempt {
    Holding,
    HeldBy(String),
}

/// This replica's identity in a cluster: the Pod name (downward API `POD_NAME`), else the
/// host name, with the process id so that two processes on one machine differ.
pub fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|n| !n.is_empty()))
        .unwrap_or_else(|| "policy-host".into());
    format!("{base}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    //! The elector against an in-memory Lease API server whose answers a test can slow down or
    //! stop, under a real kube `Client`. The lease is scaled down (a 2 s lease renewed every
    //! 200 ms, given up after 1.4 s) so that each test runs in seconds of real time; the
    //! margins between what the tests tell apart are hundreds of milliseconds.

    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use kube::client::Body;

    use super::*;

    /// How the fake API server answers.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Answers {
        /// At once.
        AtOnce,
        /// Reads at once; the next write is applied when it arrives but answered only after
        /// this long, and from then on nothing is answered (the API server went away).
        OneSlowWriteThenSilence(Duration),
        /// Never: requests hang.
        Silence,
    }

    struct Server {
        lease: Option<Lease>,
        version: u64,
        answers: Answers,
        /// When each write was applied (what a standby's clock starts from).
        applied: Vec<Instant>,
    }

    /// An API server holding one Lease: `GET`, `POST` (create) and `PUT` (replace, refused
    /// with 409 on a stale `resourceVersion`), as the real one answers them.
    #[derive(Clone)]
    struct FakeLeases(Arc<Mutex<Server>>);

    impl FakeLeases {
        fn new() -> Self {
            Self(Arc::new(Mutex::new(Server {
                lease: None,
                version: 0,
                answers: Answers::AtOnce,
                applied: Vec::new(),
            })))
        }

        fn server(&self) -> std::sync::MutexGuard<'_, Server> {
            self.0.lock().unwrap_or_else(|p| p.into_inner())
        }

        fn answer(&self, answers: Answers) {
            self.server().answers = answers;
        }

        fn last_applied(&self) -> Instant {
            *self.server().applied.last().expect("a write was applied")
        }

        fn holder(&self) -> Option<String> {
            self.server()
                .lease
                .as_ref()
                .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
        }

        /// Another replica writes the Lease as its own (it took it over).
        fn taken_over_by(&self, holder: &str) {
            let mut server = self.server();
            server.version += 1;
            let version = server.version.to_string();
            let lease = server.lease.as_mut().expect("a Lease to take over");
            lease.metadata.resource_version = Some(version);
            lease
                .spec
                .get_or_insert_with(LeaseSpec::default)
                .holder_identity = Some(holder.to_owned());
        }

        fn elector(&self, identity: &str) -> LeaseElector {
            let settings = LeaseSettings {
                lease_duration: Duration::from_secs(2),
                renew_deadline: Duration::from_millis(1400),
                renew_every: Duration::from_millis(200),
                retry_every: Duration::from_millis(100),
                ..LeaseSettings::new("ns", "lease", identity)
            };
            LeaseElector::new(Client::new(self.clone(), "ns"), settings).0
        }

        /// Applies one request; the status and body to answer, and how long to wait first
        /// (`None`: never).
        fn apply(&self, method: &http::Method, body: &[u8]) -> (u16, String, Option<Duration>) {
            let mut server = self.server();
            let delay = match (server.answers, method == http::Method::GET) {
                (Answers::AtOnce, _) | (Answers::OneSlowWriteThenSilence(_), true) => {
                    Some(Duration::ZERO)
                }
                (Answers::OneSlowWriteThenSilence(slow), false) => {
                    server.answers = Answers::Silence;
                    Some(slow)
                }
                (Answers::Silence, _) => return (504, String::new(), None),
            };
            let status = |code: u16, reason: &str| {
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "reason": reason, "code": code, "message": reason})
                .to_string()
            };
            let (code, text) = match (method.as_str(), server.lease.clone()) {
                ("GET", Some(lease)) => (200, serde_json::to_string(&lease).expect("a Lease")),
                ("GET", None) => (404, status(404, "NotFound")),
                ("POST", Some(_)) => (409, status(409, "AlreadyExists")),
                ("POST" | "PUT", current) => {
                    let mut written: Lease = serde_json::from_slice(body).expect("a Lease");
                    let stale = current.as_ref().is_some_and(|c| {
                        c.metadata.resource_version != written.metadata.resource_version
                    });
                    if stale || (current.is_none() && method == http::Method::PUT) {
                        (409, status(409, "Conflict"))
                    } else {
                        server.version += 1;
                        written.metadata.resource_version = Some(server.version.to_string());
                        server.applied.push(Instant::now());
                        let text = serde_json::to_string(&written).expect("a Lease");
                        server.lease = Some(written);
                        (if current.is_some() { 200 } else { 201 }, text)
                    }
                }
                _ => (405, status(405, "MethodNotAllowed")),
            };
            (code, text, delay)
        }
    }

    impl tower::Service<http::Request<Body>> for FakeLeases {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future =
            Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            let server = self.clone();
            Box::pin(async move {
                let (parts, body) = request.into_parts();
                let body = body.collect_bytes().await.unwrap_or_default();
                let (code, text, delay) = server.apply(&parts.method, &body);
                match delay {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
                Ok(http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(text.into_bytes()))
                    .expect("a response"))
            })
        }
    }

    /// A standby takes the Lease once its record is unchanged for the lease duration, counted
    /// from when the last write was applied at the earliest. A leader whose renewal was applied
    /// but answered late must still give up before that, so its deadline counts from when the
    /// renewal was sent (review H1).
    #[tokio::test]
    async fn a_renewal_answered_late_counts_from_when_it_was_sent() {
        let server = FakeLeases::new();
        let mut elector = server.elector("host-a");
        elector.acquire().await;
        server.answer(Answers::OneSlowWriteThenSilence(Duration::from_millis(900)));
        let lost = tokio::time::timeout(Duration::from_secs(10), elector.hold())
            .await
            .expect("the leader gives up once it cannot renew");
        let lost_at = Instant::now();
        assert_eq!(lost, LostLease::NotRenewed(Duration::from_millis(1400)));
        let standby_may_take_over = server.last_applied() + elector.settings().lease_duration;
        assert!(
            lost_at < standby_may_take_over,
            "the leader gave up {:?} after a standby could take the Lease",
            lost_at - standby_may_take_over
        );
    }

    /// The host's loop built `hold()` anew on every turn (a host task ending is a turn), and
    /// each new `hold()` counted its deadline from its own start: a leader that could no longer
    /// renew went on leading past the lease (review H1). The deadline is the last renewal's.
    #[tokio::test]
    async fn hold_called_anew_keeps_the_deadline_of_the_last_renewal() {
        let server = FakeLeases::new();
        let mut elector = server.elector("host-a");
        let acquired = Instant::now();
        elector.acquire().await;
        server.answer(Answers::Silence);
        let lost = loop {
            if let Ok(lost) = tokio::time::timeout(Duration::from_millis(300), elector.hold()).await
            {
                break Some(lost);
            }
            if acquired.elapsed() > Duration::from_secs(5) {
                break None;
            }
        };
        let lost_at = Instant::now();
        assert!(lost.is_some(), "the leader never gave up the Lease");
        let standby_may_take_over = acquired + elector.settings().lease_duration;
        assert!(
            lost_at < standby_may_take_over,
            "the leader gave up {:?} after a standby could take the Lease",
            lost_at - standby_may_take_over
        );
    }

    /// A leader that is stopped drains while it goes on renewing: the Lease stays its own past
    /// the moment a standby would otherwise have taken it (review H1).
    #[tokio::test]
    async fn the_lease_is_renewed_while_the_drain_runs() {
        let server = FakeLeases::new();
        let mut elector = server.elector("host-a");
        elector.acquire().await;
        let lease_duration = elector.settings().lease_duration;
        let started = Instant::now();
        let drained = elector
            .while_holding(tokio::time::sleep(lease_duration * 3 / 2))
            .await;
        assert_eq!(drained, Ok(()));
        assert!(
            server.last_applied() > started + lease_duration,
            "no renewal after the lease duration: a standby would have taken over mid-drain"
        );
        assert_eq!(server.holder().as_deref(), Some("host-a"));
    }

    /// A drain that would still write after another replica took the Lease is dropped where
    /// it stands (review H1).
    #[tokio::test]
    async fn the_drain_is_dropped_when_the_lease_is_taken() {
        let server = FakeLeases::new();
        let mut elector = server.elector("host-a");
        elector.acquire().await;
        server.taken_over_by("host-b");
        let (dropped_tx, dropped) = tokio::sync::oneshot::channel::<()>();
        let drain = async move {
            let _still_draining = dropped_tx;
            std::future::pending::<()>().await
        };
        let outcome = tokio::time::timeout(Duration::from_secs(10), elector.while_holding(drain))
            .await
            .expect("the loss is noticed");
        assert_eq!(outcome, Err(LostLease::TakenBy("host-b".into())));
        assert!(dropped.await.is_err(), "the drain was dropped");
    }
}
