//! Version changes: which ones etcd can make (one minor at a time, never down), and the
//! rolling upgrade that restarts one member at a time in place, the leader last.

use policy_host_sdk::pods::ObservedPod;

use super::{MemberInPod, Step};
use crate::children::{self, ANNOTATION_REPLACES_STARTED, ETCD_CONTAINER};
use crate::etcd_api::{EtcdApi, Member};
use crate::protocol::{Action, EventType};
use crate::schedule::parse_rfc3339;
use crate::spec::Version;

impl Step<'_> {
    /// etcd upgrades one minor version at a time and never downgrades
    /// (<https://etcd.io/docs/v3.6/upgrades/>): refuse anything else.
    pub(super) fn check_version_change(&mut self, running: &Version) {
        let wanted = &self.spec.version;
        let (from, to) = ((running.major, running.minor), (wanted.major, wanted.minor));
        let problem = if to < from {
            Some((
                "DowngradeNotSupported",
                format!(
                    "the cluster runs etcd {running} and spec.version asks for {wanted}: etcd cannot be downgraded to an older minor; set spec.version back to {}.{}.x",
                    running.major, running.minor
                ),
            ))
        } else if to.0 != from.0 || to.1 > from.1 + 1 {
            Some((
                "UnsupportedUpgrade",
                format!(
                    "the cluster runs etcd {running} and spec.version asks for {wanted}: etcd upgrades one minor version at a time; set spec.version to {}.{}.x first",
                    running.major,
                    running.minor + 1
                ),
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            self.degraded = Some(problem);
            self.version_blocked = true;
        }
    }

    /// Member pods whose etcd container cannot start because its image cannot be pulled,
    /// while the spec names another image (it was fixed after a bad change): re-applied with
    /// the spec's image. They run nothing, so this takes no member down; without it a rolling
    /// change onto a bad image stays stuck, since its next step waits for every member to be
    /// Ready, and with the quorum lost etcd does not answer at all. `running` is the version
    /// the cluster last ran: never an image etcd could not start on that data.
    pub(super) fn reapply_unpullable_images(&mut self, running: Option<&Version>) {
        let wanted = &self.spec.version;
        let allowed = running.is_some_and(|running| {
            let (from, to) = ((running.major, running.minor), (wanted.major, wanted.minor));
            from.0 == to.0 && to.1 >= from.1 && to.1 <= from.1 + 1
        });
        if !allowed {
            return;
        }
        let image = self.spec.image.clone();
        for pod in self.pods_by_index() {
            let stuck = pod
                .waiting_reason(ETCD_CONTAINER)
                .is_some_and(|reason| PULL_FAILURES.contains(&reason));
            if pod.is_gone() || !stuck || pod.image(ETCD_CONTAINER) == Some(image.as_str()) {
                continue;
            }
            let Some(object) = children::with_image(
                pod.object(),
                &image,
                &self.spec.classic.labels,
                &self.spec.classic.annotations,
            ) else {
                continue;
            };
            self.actions.push(Action::Apply(object));
            self.event(
                EventType::Normal,
                "MemberUpgrading",
                format!(
                    "member {} cannot pull image {}; restarting it with image {image}",
                    pod.name,
                    pod.image(ETCD_CONTAINER).unwrap_or_default()
                ),
            );
            self.progressing(
                "Upgrading",
                format!(
                    "restarting {} with image {image}: its image cannot be pulled",
                    pod.name
                ),
            );
        }
    }

    /// Rolling upgrade (or image change): one member at a time, followers first and the
    /// leader last, each restarted in place with the new image only after every member
    /// already restarted runs the new version and is Ready.
    pub(super) fn upgrade(
        &mut self,
        etcd: &mut impl EtcdApi,
        members: &[MemberInPod],
        leader: u64,
    ) {
        let image = self.spec.image.as_str();
        let pods: Vec<(&Member, &ObservedPod)> = members
            .iter()
            .filter_map(|m| Some((m.member, self.children.pod(m.pod.as_deref()?)?)))
            .collect();
        let mut outdated: Vec<(&Member, &ObservedPod)> = pods
            .iter()
            .filter(|(_, p)| p.image(ETCD_CONTAINER) != Some(image))
            .copied()
            .collect();
        if outdated.is_empty() {
            return;
        }
        for (_, pod) in pods
            .iter()
            .filter(|(_, p)| p.image(ETCD_CONTAINER) == Some(image))
        {
            // The spec names the new image at once, but the kubelet restarts the container a
            // moment later, and meanwhile the old container is Ready and (for an image-only
            // change) reports the same version.
            if let Err(seen) = restarted_on(pod, image) {
                self.progressing(
                    "Upgrading",
                    format!(
                        "waiting for {} to restart with image {image} ({seen})",
                        pod.name
                    ),
                );
                return;
            }
            let version = etcd.status(&pod.name).map(|s| s.version);
            if !pod.ready || version.as_deref().ok() != Some(self.spec.version.text.as_str()) {
                let seen = match version {
                    Ok(v) => format!("it runs {v}"),
                    Err(e) => e.to_string(),
                };
                self.progressing(
                    "Upgrading",
                    format!(
                        "waiting for {} to run etcd {} and be Ready ({seen})",
                        pod.name, self.spec.version
                    ),
                );
                return;
            }
        }
        outdated.sort_by_key(|(m, p)| (m.id == leader, self.cluster.member_index(&p.name)));
        let Some((member, pod)) = outdated.first() else {
            return;
        };
        // The leader goes last, and hands leadership to an upgraded member first, so the
        // cluster does not sit through an election timeout with no leader while it restarts
        // (etcd's upgrade guide: <https://etcd.io/docs/v3.6/upgrades/upgrade_3_6/>).
        let transferee = pods
            .iter()
            .filter(|(m, p)| p.image(ETCD_CONTAINER) == Some(image) && m.id != member.id)
            .min_by_key(|(_, p)| self.cluster.member_index(&p.name));
        if member.id == leader
            && let Some((target, target_pod)) = transferee
        {
            match etcd.move_leader(&pod.name, target.id) {
                Ok(()) => self.event(
                    EventType::Normal,
                    "LeaderMoved",
                    format!(
                        "moved leadership from {} to {} before restarting it",
                        pod.name, target_pod.name
                    ),
                ),
                Err(e) => {
                    self.progressing(
                        "Upgrading",
                        format!(
                            "moving leadership from {} to {} before restarting it failed, retrying: {e}",
                            pod.name, target_pod.name
                        ),
                    );
                    return;
                }
            }
        }
        match children::with_image(
            pod.object(),
            image,
            &self.spec.classic.labels,
            &self.spec.classic.annotations,
        ) {
            Some(mut object) => {
                if let Some(started) = pod.started_at(ETCD_CONTAINER) {
                    object["metadata"]["annotations"][ANNOTATION_REPLACES_STARTED] = started.into();
                }
                self.actions.push(Action::Apply(object));
                self.event(
                    EventType::Normal,
                    "MemberUpgrading",
                    format!("restarting member {} with image {image}", pod.name),
                );
                self.progressing(
                    "Upgrading",
                    format!(
                        "restarting {} with image {image}; {} members left",
                        pod.name,
                        outdated.len() - 1
                    ),
                );
            }
            None => self.progressing(
                "Upgrading",
                format!("pod {} has no etcd container to upgrade", pod.name),
            ),
        }
    }
}

/// Why a container waits when its image cannot be had (the kubelet's reasons).
const PULL_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Whether the etcd container of a pod whose spec names `image` has restarted on it. When
/// the pod records the start of the container the change replaced, a container running and
/// started after it (both the kubelet's clock) is one the kubelet started from the current
/// spec. A pod without that record (re-applied by an earlier version of this plugin) must
/// report running `image` (or, pinned by digest, that digest); runtimes may name an image
/// with several tags by another, so the record is preferred. Otherwise what it runs, for the
/// status.
fn restarted_on(pod: &ObservedPod, image: &str) -> Result<(), String> {
    let Some(started) = pod.started_at(ETCD_CONTAINER).and_then(parse_rfc3339) else {
        return Err("its container is not running".to_owned());
    };
    let running = pod
        .running_image(ETCD_CONTAINER)
        .unwrap_or("no reported image");
    match pod
        .annotation(ANNOTATION_REPLACES_STARTED)
        .and_then(parse_rfc3339)
    {
        Some(replaced) if started <= replaced => Err(format!(
            "it still runs {running}, started at {}",
            started_text(started)
        )),
        Some(_) => Ok(()),
        None => {
            let digest_matches = image.split_once('@').is_some_and(|(_, digest)| {
                pod.running_image_id(ETCD_CONTAINER)
                    .is_some_and(|id| id.ends_with(digest))
            });
            if same_image(running, image) || digest_matches {
                Ok(())
            } else {
                Err(format!("it still runs {running}"))
            }
        }
    }
}

/// Two image references for the same image, as runtimes report them: `docker.io/` and
/// `library/` are what a short name means (`etcd:v3` is `docker.io/library/etcd:v3`).
pub(super) fn same_image(a: &str, b: &str) -> bool {
    fn full(image: &str) -> String {
        let first = image.split('/').next().unwrap_or_default();
        let has_registry = image.contains('/')
            && (first.contains('.') || first.contains(':') || first == "localhost");
        match (has_registry, image.contains('/')) {
            (true, _) => image.to_owned(),
            (false, true) => format!("docker.io/{image}"),
            (false, false) => format!("docker.io/library/{image}"),
        }
    }
    full(a) == full(b)
}

fn started_text(seconds: i64) -> String {
    policy_host_sdk::conditions::rfc3339(crate::protocol::Timestamp {
        seconds,
        nanoseconds: 0,
    })
}
