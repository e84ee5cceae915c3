//! Readiness and liveness probes: httpGet and tcpSocket against the Pod IP, exec inside the
//! container's mount namespace (`nsenter`), gRPC approximated by a TCP connect.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::spec::{Image, path_var, pod_local, resolve_program};

/// What a probe needs to know about the running container.
#[derive(Debug, Clone)]
pub(crate) struct ProbeTarget {
    pub(crate) ip: Ipv4Addr,
    pub(crate) pid: u32,
    pub(crate) container: Container,
    pub(crate) image: Image,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) http: reqwest::Client,
}

/// Probe timing, with the Kubernetes defaults.
pub(crate) struct Timing {
    pub(crate) initial_delay: Duration,
    pub(crate) period: Duration,
    pub(crate) timeout: Duration,
    pub(crate) success_threshold: u32,
    pub(crate) failure_threshold: u32,
}

impl Timing {
    pub(crate) fn of(probe: &Probe) -> Timing {
        let secs = |v: Option<i32>, default: u64| {
            Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default))
        };
        let count = |v: Option<i32>, default: u32| {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        Timing {
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).max(Duration::from_millis(500)),
            // Processes here start slower than in a container on a quiet node: one second is
            // tight for a client program on a loaded 2-core machine.
            timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(2)),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
        }
    }
}

fn port_number(port: &IntOrString, container: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .or_else(|| name.parse().ok()),
    }
}

/// Runs the probe once: `true` on success.
pub(crate) async fn check(probe: &Probe, target: &ProbeTarget, timeout: Duration) -> bool {
    if let Some(http) = &probe.http_get {
        let Some(port) = port_number(&http.port, &target.container) else {
            return false;
        };
        let scheme = match http.scheme.as_deref() {
            Some("HTTPS") => "https",
            _ => "http",
        };
        let host = pod_host(http.host.as_deref(), target.ip);
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let mut request = target
            .http
            .get(format!("{scheme}://{host}:{port}{path}"))
            .timeout(timeout);
        for header in http.http_headers.iter().flatten() {
            request = request.header(&header.name, &header.value);
        }
        return match request.send().await {
            Ok(response) => {
                let code = response.status().as_u16();
                (200..400).contains(&code)
            }
            Err(_) => false,
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let Some(port) = port_number(&tcp.port, &target.container) else {
            return false;
        };
        let host = pod_host(tcp.host.as_deref(), target.ip);
        return tcp_connect(&host, port, timeout).await;
    }
    if let Some(grpc) = &probe.grpc {
        let Ok(port) = u16::try_from(grpc.port) else {
            return false;
        };
        return tcp_connect(&target.ip.to_string(), port, timeout).await;
    }
    if let Some(exec) = &probe.exec {
        let mut argv = exec.command.clone().unwrap_or_default();
        if argv.is_empty() {
            return false;
        }
        for arg in &mut argv {
            *arg = pod_local(arg, target.ip);
        }
        resolve_program(&mut argv, &target.image);
        // The probe sees the container's mounts (its /etc/hosts, its volumes) and environment.
        let mut command = tokio::process::Command::new("nsenter");
        command
            .arg("--target")
            .arg(target.pid.to_string())
            .args(["--mount", "--uts", "--"])
            .args(&argv)
            .env_clear()
            .envs(&target.env)
            .env("PATH", path_var(&target.image))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let Ok(mut child) = command.spawn() else {
            return false;
        };
        return matches!(
            tokio::time::timeout(timeout, child.wait()).await,
            Ok(Ok(status)) if status.success()
        );
    }
    // A probe with no handler: nothing to check.
    true
}

/// The host a probe connects to: the Pod IP unless another host is named (a loopback host
/// means the Pod itself, see [`pod_local`]).
fn pod_host(host: Option<&str>, ip: Ipv4Addr) -> String {
    match host {
        None | Some("" | "localhost" | "127.0.0.1" | "0.0.0.0") => ip.to_string(),
        Some(host) => host.to_owned(),
    }
}

async fn tcp_connect(host: &str, port: u16, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await,
        Ok(Ok(_))
    )
}
