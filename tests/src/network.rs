//! Cutting and healing one pod's network on the real node, inside the pod's own network
//! namespace (the one containerd made for it under `/var/run/netns/cni-…`): its `eth0` goes
//! down, so nothing reaches the pod and the pod reaches nothing, while its processes keep
//! running — a network partition, not a crash.

use std::path::PathBuf;
use std::process::Command;

use crate::{Error, Result};

/// A pod whose network is cut; [`PodNetworkCut::heal`] (or dropping it) brings it back.
#[derive(Debug)]
pub struct PodNetworkCut {
    netns: String,
    pod_ip: String,
    healed: bool,
}

/// The `ip netns` name of the pod network namespace holding `pod_ip`.
fn namespace_of(pod_ip: &str) -> Result<String> {
    let entries = std::fs::read_dir("/var/run/netns").map_err(Error::io(
        "listing /var/run/netns (is the real node running?)".to_owned(),
    ))?;
    let names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cni-"))
        .collect();
    for name in &names {
        let output = Command::new("ip")
            .args(["-n", name, "-o", "-4", "addr", "show"])
            .output()
            .map_err(Error::io(format!("running ip -n {name} addr show")))?;
        let text = String::from_utf8_lossy(&output.stdout);
        if text.contains(&format!(" {pod_ip}/")) {
            return Ok(name.clone());
        }
    }
    Err(Error::Command {
        what: format!("finding the network namespace of pod IP {pod_ip}"),
        output: format!("none of {names:?} holds it"),
    })
}

fn ip(netns: &str, args: &[&str]) -> Result<()> {
    let output = Command::new("ip")
        .args(["-n", netns])
        .args(args)
        .output()
        .map_err(Error::io(format!(
            "running ip -n {netns} {}",
            args.join(" ")
        )))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            what: format!("ip -n {netns} {}", args.join(" ")),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// Cuts the network of the pod at `pod_ip`: its `eth0` down.
pub fn cut_pod_network(pod_ip: &str) -> Result<PodNetworkCut> {
    let netns = namespace_of(pod_ip)?;
    ip(&netns, &["link", "set", "eth0", "down"])?;
    Ok(PodNetworkCut {
        netns,
        pod_ip: pod_ip.to_owned(),
        healed: false,
    })
}

impl PodNetworkCut {
    /// Brings `eth0` back up, with the default route through the bridge the CNI plugin gave
    /// it (a link that went down loses it).
    pub fn heal(mut self) -> Result<()> {
        self.heal_now()
    }

    fn heal_now(&mut self) -> Result<()> {
        if self.healed {
            return Ok(());
        }
        ip(&self.netns, &["link", "set", "eth0", "up"])?;
        // Put the default route back if the link's going down took it.
        let gateway = crate::node::NODE_IP.to_string();
        let _ = ip(
            &self.netns,
            &[
                "route", "replace", "default", "via", &gateway, "dev", "eth0",
            ],
        );
        self.healed = true;
        Ok(())
    }

    /// `command` run inside the cut pod's network namespace, where its loopback still works: a
    /// client beside the server (in the Pod, or on its host), which the cut does not stop.
    pub fn inside(&self, command: &Command) -> Command {
        let mut inside = Command::new("ip");
        inside
            .args(["netns", "exec", &self.netns])
            .arg(command.get_program())
            .args(command.get_args());
        for (name, value) in command.get_envs() {
            match value {
                Some(value) => inside.env(name, value),
                None => inside.env_remove(name),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            inside.current_dir(dir);
        }
        inside
    }

    /// The network namespace, for logs.
    pub fn namespace(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.netns)
    }

    /// The pod's IP.
    pub fn pod_ip(&self) -> &str {
        &self.pod_ip
    }
}

impl Drop for PodNetworkCut {
    fn drop(&mut self) {
        let _ = self.heal_now();
    }
}
