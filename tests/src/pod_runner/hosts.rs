//! The one hosts file that gives Pods their cluster DNS names.
//!
//! Every Pod sees it as `/etc/hosts` (a bind mount in its private mount namespace). It is
//! rewritten in place (truncate + write), never replaced by a rename: a bind mount pins the inode,
//! so a renamed-over file would go unseen by running Pods.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// A Pod as far as names are concerned.
#[derive(Debug, Clone)]
pub(crate) struct PodNames {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) hostname: String,
    pub(crate) subdomain: Option<String>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) ip: Ipv4Addr,
}

/// A Service with a selector, whose name resolves to the IPs of the Pods it selects.
#[derive(Debug, Clone)]
pub(crate) struct ServiceNames {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) selector: BTreeMap<String, String>,
}

/// The hosts file and what it is made from.
#[derive(Debug)]
pub(crate) struct HostsFile {
    path: PathBuf,
    pods: BTreeMap<String, PodNames>,
    services: BTreeMap<(String, String), ServiceNames>,
}

impl HostsFile {
    /// Creates the file with only `localhost` in it.
    pub(crate) fn create(path: PathBuf) -> std::io::Result<HostsFile> {
        let hosts = HostsFile {
            path,
            pods: BTreeMap::new(),
            services: BTreeMap::new(),
        };
        hosts.write()?;
        Ok(hosts)
    }

    /// Adds or replaces the names of the Pod with this uid.
    pub(crate) fn set_pod(&mut self, uid: &str, names: PodNames) -> std::io::Result<()> {
        self.pods.insert(uid.to_owned(), names);
        self.write()
    }

    /// Removes the names of the Pod with this uid.
    pub(crate) fn remove_pod(&mut self, uid: &str) -> std::io::Result<()> {
        if self.pods.remove(uid).is_some() {
            self.write()?;
        }
        Ok(())
    }

    /// Adds, replaces or (with `None`) removes a Service.
    pub(crate) fn set_service(
        &mut self,
        namespace: &str,
        name: &str,
        service: Option<ServiceNames>,
    ) -> std::io::Result<()> {
        let key = (namespace.to_owned(), name.to_owned());
        let changed = match service {
            Some(service) => self
                .services
                .insert(key, service.clone())
                .is_none_or(|old| old.selector != service.selector),
            None => self.services.remove(&key).is_some(),
        };
        if changed { self.write() } else { Ok(()) }
    }

    fn render(&self) -> String {
        let mut out =
            String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
        for pod in self.pods.values() {
            let mut names = Vec::new();
            if let Some(subdomain) = &pod.subdomain {
                let base = format!("{}.{subdomain}.{}", pod.hostname, pod.namespace);
                names.push(format!("{base}.svc.cluster.local"));
                names.push(format!("{base}.svc"));
                names.push(base);
            }
            names.push(format!("{}.{}.pod", pod.name, pod.namespace));
            out.push_str(&format!("{}\t{}\n", pod.ip, names.join(" ")));
        }
        // A Service name resolves to every selected Pod, like a headless Service's A records.
        for service in self.services.values() {
            for pod in self.pods.values() {
                let selected = pod.namespace == service.namespace
                    && service
                        .selector
                        .iter()
                        .all(|(k, v)| pod.labels.get(k) == Some(v));
                if selected {
                    let base = format!("{}.{}", service.name, service.namespace);
                    out.push_str(&format!(
                        "{}\t{base}.svc.cluster.local {base}.svc {base}\n",
                        pod.ip
                    ));
                }
            }
        }
        out
    }

    fn write(&self) -> std::io::Result<()> {
        // Truncate + write keeps the inode that Pods have bind-mounted.
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        file.write_all(self.render().as_bytes())
    }
}
