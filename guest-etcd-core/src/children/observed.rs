//! Reading the children back from an observation: the member pods, the backup pods and the
//! names of the data claims.

use policy_host_sdk::pods::ObservedPod;
use policy_host_sdk::{Observation, PolicyError};
use serde::Deserialize;

use super::{LABEL_ROLE, pvc_kind};

/// The children of one EtcdCluster, as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedChildren {
    /// Member pods, sorted by name.
    pub pods: Vec<ObservedPod>,
    /// Backup pods (label `etcd.database.coreos.com/role: backup`).
    pub backup_pods: Vec<ObservedPod>,
    /// Names of data claims, sorted.
    pub claims: Vec<String>,
    /// Names of the claims among them that are being deleted (kept until no pod mounts them).
    pub terminating_claims: Vec<String>,
}

impl ObservedChildren {
    /// Reads the pods and the names of the claims; other kinds are ignored. A child that is
    /// not an object of its kind is an error naming it (the host sends objects it got from
    /// the API server, so this means a host bug).
    pub fn read(observation: &Observation) -> Result<Self, PolicyError> {
        let (backup_pods, pods) = observation
            .pods()?
            .into_iter()
            .partition(|p| p.label(LABEL_ROLE) == Some("backup"));
        let mut claims = Vec::new();
        let mut terminating_claims = Vec::new();
        for child in observation.children_of_kind(&pvc_kind()) {
            let claim: ClaimFields = child.parse()?;
            if claim.metadata.deletion_timestamp.is_some() {
                terminating_claims.push(claim.metadata.name.clone());
            }
            claims.push(claim.metadata.name);
        }
        claims.sort();
        terminating_claims.sort();
        Ok(ObservedChildren {
            pods,
            backup_pods,
            claims,
            terminating_claims,
        })
    }

    /// The observed pod with this name.
    pub fn pod(&self, name: &str) -> Option<&ObservedPod> {
        self.pods.iter().find(|p| p.name == name)
    }

    /// Whether a data claim with this name exists.
    pub fn has_claim(&self, name: &str) -> bool {
        self.claims.iter().any(|c| c == name)
    }

    /// Whether the data claim with this name is being deleted: no new pod can mount it.
    pub fn claim_terminating(&self, name: &str) -> bool {
        self.terminating_claims.iter().any(|c| c == name)
    }
}

/// The fields of a claim the decisions read.
#[derive(Deserialize, Default)]
#[serde(default)]
struct ClaimFields {
    metadata: ClaimMeta,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ClaimMeta {
    name: String,
    deletion_timestamp: Option<String>,
}
