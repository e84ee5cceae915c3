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
    /// How often a standby looks at the Lease.
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
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Holding) => {
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

    /// Renews the Lease until leadership is lost, and says why. Each renewal must succeed
    /// within what is left of the renew deadline since the last one.
    pub async fn hold(&mut self) -> LostLease {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.settings.renew_every).await;
            let deadline = renewed + self.settings.renew_deadline;
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Holding)) => renewed = Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    return self.lost(LostLease::TakenBy(holder));
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "leader: renewing the Lease failed; retrying");
                    if Instant::now() >= deadline {
                        return self.lost(LostLease::NotRenewed(self.settings.renew_deadline));
                    }
                }
                Err(_) => return self.lost(LostLease::NotRenewed(self.settings.renew_deadline)),
            }
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
