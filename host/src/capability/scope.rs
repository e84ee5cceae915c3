//! What a plugin may reach during one reconcile, and what the admin granted it: the scope
//! every capability checks a request against before anything leaves the host.
//!
//! The scope of a reconcile is fixed before the plugin runs, from the observation: the Pods
//! the parent controls (name → IP and named ports) and the ports the admin granted. A plugin
//! can therefore only reach what it could already see, which is the point.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::credentials::{CredentialSource, SecretGrant};
use super::replay::{AppCallRecorder, AppCallScript};
use super::tls::AppTls;
use crate::contract::Capability;
use crate::contract::app_call::{CallError, Request};

/// What the admin allows a plugin to do beyond deciding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// Ports (names or numbers) of its own pods the plugin may app-call (HTTP).
    pub app_call_ports: Vec<String>,
    /// Ports (names or numbers) of its own pods the plugin may hold TCP exchanges with.
    pub exchange_ports: Vec<String>,
    /// Parents may ask for chaos drills (`policy-host.io/chaos`) killing their own pods.
    pub chaos: bool,
    /// The child kinds (`plural.apiVersion`, as `describe()` shows them, e.g. `pods.v1`) the
    /// plugin may write; `None`: every kind it declares.
    pub kinds: Option<Vec<String>>,
    /// How much the pods it creates may reach of the node (checked by the act stage).
    pub pod_security: PodSecurity,
    /// The images its pods may run: repositories (every tag and digest) or prefixes ending in
    /// `/` ([`crate::pod_inputs`]); `None`: any image.
    pub images: Option<Vec<String>>,
    /// The Secrets of its parent's namespace it may read credentials from (and which of their
    /// keys the host generates), see [`super::credentials`].
    pub secrets: Vec<SecretGrant>,
}

/// How much a plugin's pods may reach of the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodSecurity {
    /// The Pod Security Standards' baseline (see the module docs).
    #[default]
    Baseline,
    /// Anything: only when the admin grants it.
    Privileged,
}

impl PodSecurity {
    /// Reads `baseline` or `privileged`.
    pub fn parse(text: &str) -> Result<PodSecurity, String> {
        match text.trim() {
            "" | "baseline" => Ok(PodSecurity::Baseline),
            "privileged" => Ok(PodSecurity::Privileged),
            other => Err(format!(
                "podSecurity `{other}` is not a level: write baseline (the default) or privileged"
            )),
        }
    }

    /// The name, as written in grants.
    pub fn name(self) -> &'static str {
        match self {
            PodSecurity::Baseline => "baseline",
            PodSecurity::Privileged => "privileged",
        }
    }
}

impl Grants {
    /// Everything a plugin asks for, from the capabilities it describes (for plugins the
    /// admin loads from a local file).
    pub fn as_requested(capabilities: &[Capability]) -> Self {
        let mut grants = Self::default();
        for capability in capabilities {
            grants.grant(capability);
        }
        grants
    }

    /// Adds one capability (once).
    pub fn grant(&mut self, capability: &Capability) {
        let (ports, port) = match capability {
            Capability::AppCall(port) => (&mut self.app_call_ports, port),
            Capability::Exchange(port) => (&mut self.exchange_ports, port),
        };
        if !ports.contains(port) {
            ports.push(port.clone());
        }
    }

    /// True when nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.app_call_ports.is_empty()
            && self.exchange_ports.is_empty()
            && !self.chaos
            && self.kinds.is_none()
            && self.pod_security == PodSecurity::Baseline
            && self.images.is_none()
            && self.secrets.is_empty()
    }

    /// The grants as capabilities, for logs and Events: `app-call(client)`, `exchange(redis)`.
    pub fn describe(&self) -> Vec<String> {
        let app_calls = self.app_call_ports.iter().map(|p| format!("app-call({p})"));
        let exchanges = self.exchange_ports.iter().map(|p| format!("exchange({p})"));
        let chaos = self.chaos.then(|| "chaos".to_owned());
        let kinds = self
            .kinds
            .as_ref()
            .map(|kinds| format!("kinds({})", kinds.join(", ")));
        let pods = (self.pod_security != PodSecurity::Baseline)
            .then(|| format!("pods({})", self.pod_security.name()));
        let images = self
            .images
            .as_ref()
            .map(|images| format!("images({})", images.join(", ")));
        let secrets = self.secrets.iter().map(SecretGrant::describe);
        app_calls
            .chain(exchanges)
            .chain(chaos)
            .chain(kinds)
            .chain(pods)
            .chain(images)
            .chain(secrets)
            .collect()
    }
}

/// How a capability reads in logs, Events and `policy-host validate`.
pub fn capability_text(capability: &Capability) -> String {
    match capability {
        Capability::AppCall(port) => format!("app-call({port})"),
        Capability::Exchange(port) => format!("exchange({port})"),
    }
}

/// Where one Pod can be reached.
#[derive(Clone, Debug, Default)]
pub struct PodEndpoint {
    /// `status.podIP`, if the Pod has one yet.
    pub ip: Option<String>,
    /// Container port name → number.
    pub named_ports: HashMap<String, u16>,
    /// Every declared container port number: a numeric port must be one of them.
    pub declared_ports: Vec<u16>,
    /// Why the Pod must not be called at all, whatever the grants (see [`unreachable_why`]).
    pub unreachable: Option<String>,
}

/// Why a Pod with this `spec.hostNetwork` and `status.phase` must not be called: its IP is the
/// node's (the plugin would pick the node and the port), or it ended and its IP may be another
/// pod's by now (review #14).
pub fn unreachable_why(host_network: bool, phase: &str) -> Option<String> {
    if host_network {
        Some("uses the node's network (hostNetwork): the host does not call such pods".to_owned())
    } else if phase == "Failed" || phase == "Succeeded" {
        Some(format!(
            "has ended (phase {phase}): its IP may belong to another pod now"
        ))
    } else {
        None
    }
}

impl PodEndpoint {
    /// Reads the IP, container ports and reachability of a Pod.
    pub fn from_pod(pod: &Pod) -> Self {
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty());
        let ports = || {
            pod.spec
                .iter()
                .flat_map(|spec| spec.containers.iter())
                .flat_map(|c| c.ports.iter().flatten())
        };
        let named_ports = ports()
            .filter_map(|p| {
                let name = p.name.clone()?;
                let number = u16::try_from(p.container_port).ok()?;
                Some((name, number))
            })
            .collect();
        let declared_ports = ports()
            .filter_map(|p| u16::try_from(p.container_port).ok())
            .collect();
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        Self {
            ip,
            named_ports,
            declared_ports,
            unreachable: unreachable_why(host_network, &phase),
        }
    }

    /// A port by name, or by number if the Pod declares it.
    fn resolve(&self, port: &str) -> Option<u16> {
        match port.parse::<u16>() {
            Ok(number) => self.declared_ports.contains(&number).then_some(number),
            Err(_) => self.named_ports.get(port).copied(),
        }
    }
}

/// What one reconcile's plugin may reach.
#[derive(Clone, Debug, Default)]
pub struct AppCallScope {
    pub(super) parent: String,
    pub(super) pods: HashMap<String, PodEndpoint>,
    pub(super) grants: Grants,
    pub(super) client: Option<reqwest::Client>,
    /// TLS for `call-tls`, with the parent's namespace (where its Secrets are read).
    pub(super) tls: Option<(AppTls, String)>,
    pub(super) script: Option<AppCallScript>,
    pub(super) recorder: Option<AppCallRecorder>,
    /// Where `credentials.read` finds values.
    pub(super) credentials: CredentialSource,
}

impl AppCallScope {
    /// A scope that refuses every call (used while a plugin describes itself).
    pub fn none() -> Self {
        Self::default()
    }

    /// A scope for one parent: its Pods and what the admin granted the plugin.
    pub fn new(
        parent: String,
        pods: HashMap<String, PodEndpoint>,
        grants: Grants,
        client: reqwest::Client,
    ) -> Self {
        Self {
            parent,
            pods,
            grants,
            client: Some(client),
            tls: None,
            script: None,
            recorder: None,
            credentials: CredentialSource::None,
        }
    }

    /// The same scope, able to speak HTTPS with certificates from Secrets of `namespace` (the
    /// parent's).
    pub fn with_tls(mut self, tls: AppTls, namespace: String) -> Self {
        self.tls = Some((tls, namespace));
        self
    }

    /// The same scope, with every call and its answer (refusals included) written to
    /// `recorder`.
    pub fn recorded_by(mut self, recorder: AppCallRecorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// A scope with no network: every call is answered from `script` (and recorded there).
    /// Pods and grants are not checked, since no real pod is reached; use [`Self::new`]
    /// when the plugin's reach must be enforced.
    pub fn scripted(parent: String, script: AppCallScript) -> Self {
        Self {
            parent,
            script: Some(script),
            ..Self::default()
        }
    }

    /// The same scope, reading credentials from `source` (checked against the grants).
    pub fn with_credentials(mut self, source: CredentialSource) -> Self {
        self.credentials = source;
        self
    }

    /// Where credentials come from in this scope.
    pub fn credentials(&self) -> &CredentialSource {
        &self.credentials
    }

    /// What the admin granted the plugin.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// The recorder of this scope's calls and exchanges, if it has one.
    pub fn recorder(&self) -> Option<&AppCallRecorder> {
        self.recorder.as_ref()
    }

    /// `namespace/name` of the parent, for logs.
    pub fn parent_label(&self) -> &str {
        &self.parent
    }

    /// Resolves the request to a host and port, or says why it is refused.
    pub(super) fn authorize(&self, request: &Request) -> Result<(String, u16), CallError> {
        let endpoint =
            self.authorize_endpoint(&request.pod, &request.port, &self.grants.app_call_ports)?;
        if !request.path.starts_with('/') {
            return Err(CallError::Refused(format!(
                "path `{}` must start with `/`",
                request.path
            )));
        }
        Ok(endpoint)
    }

    /// Resolves a port of a Pod the parent controls, granted in `granted` (the app-call or
    /// the exchange ports), to `host` (an IP, bracketed if v6) and port number, or says why it
    /// is refused: the one check shared by app-calls and exchanges ([`super::exchange`]).
    pub(crate) fn authorize_endpoint(
        &self,
        pod_name: &str,
        port_name: &str,
        granted: &[String],
    ) -> Result<(String, u16), CallError> {
        let pod = self.pods.get(pod_name).ok_or_else(|| {
            CallError::Refused(format!(
                "pod `{pod_name}` is not controlled by {}; a plugin may only call its own pods",
                self.parent
            ))
        })?;
        if let Some(why) = &pod.unreachable {
            return Err(CallError::Refused(format!("pod `{pod_name}` {why}")));
        }
        let port = pod.resolve(port_name).ok_or_else(|| {
            CallError::Refused(format!(
                "pod `{pod_name}` has no port `{port_name}` (a port is named, or numbered as one of its declared container ports)"
            ))
        })?;
        if !granted.iter().any(|g| pod.resolve(g) == Some(port)) {
            return Err(CallError::Refused(format!(
                "port `{port_name}` is not granted to this plugin (granted: {granted:?})"
            )));
        }
        let ip = pod
            .ip
            .as_ref()
            .ok_or_else(|| CallError::Unreachable(format!("pod `{pod_name}` has no IP yet")))?;
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.clone()
        };
        Ok((host, port))
    }

    /// Resolves a port granted for exchanges (see [`Self::authorize_endpoint`]).
    pub(crate) fn authorize_exchange(
        &self,
        pod_name: &str,
        port_name: &str,
    ) -> Result<(String, u16), CallError> {
        self.authorize_endpoint(pod_name, port_name, &self.grants.exchange_ports)
    }

    /// How exchanges of this scope are carried: from the script, over the network (recorded
    /// or not), or not at all (the scope of `describe`).
    pub(crate) fn exchange_route(&self) -> ExchangeRoute<'_> {
        if let Some(script) = &self.script {
            ExchangeRoute::Scripted(script)
        } else if self.client.is_some() {
            ExchangeRoute::Live(self.recorder.as_ref())
        } else {
            ExchangeRoute::Refused
        }
    }
}

/// Where a scope's exchanges go (see [`AppCallScope::exchange_route`]).
pub(crate) enum ExchangeRoute<'a> {
    /// Answered by the script, no network.
    Scripted(&'a AppCallScript),
    /// Over TCP, each round written to the recorder if there is one.
    Live(Option<&'a AppCallRecorder>),
    /// No exchanges in this scope.
    Refused,
}
