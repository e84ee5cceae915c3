//! Spawning local processes that cannot outlive the test process, and stopping their process
//! groups.
//!
//! Children are started through `setpriv --pdeathsig KILL`, which sets `PR_SET_PDEATHSIG` and
//! then execs the real program: the kernel kills it when the thread that spawned it dies, also
//! when the test process is killed. That needs no `unsafe` `pre_exec` (the workspace forbids
//! `unsafe_code`). Every child leads a process group of its own, so that a stop also reaches
//! what a `sh -c` started.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::{Error, Result};

/// A command that dies with the spawning thread and leads its own process group.
pub(crate) fn guarded_command(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    signalled_command(program, "KILL")
}

/// A command that gets `signal` (`TERM`, `KILL`) when the spawning thread dies, and leads its
/// own process group. A TERM lets a watchdog clean up after the test process.
pub(crate) fn signalled_command(
    program: impl AsRef<std::ffi::OsStr>,
    signal: &str,
) -> std::process::Command {
    let mut command = std::process::Command::new("setpriv");
    command
        .arg("--pdeathsig")
        .arg(signal)
        .arg("--")
        .arg(program)
        .process_group(0)
        .stdin(Stdio::null());
    command
}

use std::os::unix::process::CommandExt as _;

/// Opens `path` for appending a process's stdout and stderr to it.
pub(crate) fn log_stdio(path: &Path) -> Result<(Stdio, Stdio)> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(Error::io(format!("creating {}", parent.display())))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(Error::io(format!("opening log {}", path.display())))?;
    let err = file
        .try_clone()
        .map_err(Error::io(format!("opening log {}", path.display())))?;
    Ok((Stdio::from(file), Stdio::from(err)))
}

/// Sends `signal` to the process group led by `pid`; a group already gone is not an error.
pub(crate) fn signal_group(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        // ESRCH (already exited) is the only expected failure and means the job is done.
        let _ = killpg(Pid::from_raw(pid), signal);
    }
}

/// A control-plane process, stopped (SIGTERM, then SIGKILL after a grace period) on drop.
#[derive(Debug)]
pub(crate) struct OwnedProcess {
    pub(crate) name: String,
    pub(crate) log: std::path::PathBuf,
    child: std::process::Child,
}

impl OwnedProcess {
    /// Spawns `command` (from [`guarded_command`]) with its output appended to `log`.
    pub(crate) fn spawn(
        name: &str,
        mut command: std::process::Command,
        log: std::path::PathBuf,
    ) -> Result<OwnedProcess> {
        let (out, err) = log_stdio(&log)?;
        let child = command
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(Error::io(format!(
                "starting {name} (is util-linux's setpriv installed?)"
            )))?;
        Ok(OwnedProcess {
            name: name.to_owned(),
            log,
            child,
        })
    }

    /// The exit status if the process has exited.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// An error naming this process and its log.
    pub(crate) fn failure(&self, problem: impl Into<String>) -> Error {
        Error::ComponentFailed {
            component: self.name.clone(),
            problem: problem.into(),
            log: self.log.clone(),
        }
    }

    /// Kills the process group at once (SIGKILL) and reaps the process.
    pub(crate) fn kill(&mut self) {
        if self.exited().is_none() {
            signal_group(self.child.id(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }

    /// Stops the process group: SIGTERM, then SIGKILL after `grace`.
    pub(crate) fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        signal_group(self.child.id(), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        signal_group(self.child.id(), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for OwnedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}
