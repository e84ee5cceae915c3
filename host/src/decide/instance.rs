//! The state of one plugin instance: a locked-down WASI context with a frozen clock, the memory
//! limiter, the bounded stderr capture, the log import, and the capabilities' [`Doors`].

use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::Limits;
use crate::capability::Doors;
use crate::capability::credentials::redact;
use crate::capability::metrics::MetricsDoor;
use crate::capability::scope::AppCallScope;
use crate::contract::{self, v0_1 as contract_v0_1};

/// Bytes of a plugin's stderr kept per instance, to explain a crash (Rust panics print there).
const STDERR_CAPTURE: usize = 64 << 10;

/// Per-instance state: a locked-down WASI context, the memory limiter and the plugin's doors.
pub struct PluginState {
    wasi: WasiCtx,
    table: ResourceTable,
    memory_limit: usize,
    /// Set when the memory limiter refused a growth.
    memory_refused: bool,
    /// What the plugin wrote to stderr (a panic message, typically), bounded; shown when it traps.
    stderr: wasmtime_wasi::p2::pipe::MemoryOutputPipe,
    /// The plugin's ways out (app-calls, exchanges) and what they may reach.
    doors: Doors,
    /// Log lines this instance (one decision) has printed.
    log_lines: usize,
}

impl PluginState {
    pub(super) fn new(
        label: String,
        limits: &Limits,
        app_calls: AppCallScope,
        metrics: MetricsDoor,
        now: Option<contract::Timestamp>,
    ) -> Self {
        let stderr = wasmtime_wasi::p2::pipe::MemoryOutputPipe::new(STDERR_CAPTURE);
        let mut wasi = WasiCtx::builder();
        wasi.stderr(stderr.clone());
        // No preopened directories, no env, no args, no inherited stdio, no network: a plugin's
        // only way out is the app-call import. Its wall clock is frozen at the observation's
        // time, so decisions depend only on what the host observed.
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .wall_clock(FrozenClock(now));
        Self {
            wasi: wasi.build(),
            stderr,
            table: ResourceTable::new(),
            memory_limit: limits.memory_bytes,
            memory_refused: false,
            doors: Doors::new(label, app_calls, limits.output_bytes).with_metrics(metrics),
            log_lines: 0,
        }
    }

    /// True when the memory limiter refused a growth.
    pub(super) fn memory_refused(&self) -> bool {
        self.memory_refused
    }

    /// The plugin's ways out.
    pub(crate) fn doors(&self) -> &Doors {
        &self.doors
    }

    /// The plugin's ways out, to link their imports and take what they hold at the end.
    pub(crate) fn doors_mut(&mut self) -> &mut Doors {
        &mut self.doors
    }
}

impl PluginState {
    /// The last non-empty lines of what the plugin wrote to stderr, at most ~300 characters.
    pub(super) fn stderr_tail(&self) -> String {
        let contents = self.stderr.contents();
        let text = String::from_utf8_lossy(&contents);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            // Rust's panic hook adds a hint about RUST_BACKTRACE, meaningless inside the sandbox.
            .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
            .collect();
        let mut tail = lines[lines.len().saturating_sub(3)..].join(" ");
        if tail.len() > 300 {
            let mut cut = 300;
            while !tail.is_char_boundary(cut) {
                cut -= 1;
            }
            tail.truncate(cut);
            tail.push('…');
        }
        tail
    }
}

impl wasmtime::ResourceLimiter for PluginState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_refused = true;
            return Err(wasmtime::Error::msg(format!(
                "memory growth to {desired} bytes refused: limit is {} bytes",
                self.memory_limit
            )));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a million entries is far past any honest plugin.
        Ok(desired <= 1_000_000)
    }

    fn instances(&self) -> usize {
        16
    }

    fn memories(&self) -> usize {
        16
    }

    fn tables(&self) -> usize {
        16
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A wall clock that always reads the observation's time (or the Unix epoch outside a reconcile).
struct FrozenClock(Option<contract::Timestamp>);

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn now(&self) -> Duration {
        self.0
            .map(|t| Duration::new(t.seconds.max(0) as u64, t.nanoseconds))
            .unwrap_or_default()
    }
}

impl contract::policy_host::policy::types::Host for PluginState {}

impl contract::policy_host::policy::log::Host for PluginState {
    async fn log(
        &mut self,
        level: contract::LogLevel,
        message: String,
        fields: Vec<(String, String)>,
    ) {
        self.write_log(level, message, fields);
    }
}

/// Bytes of message, and of fields, one plugin log line may print.
const LOG_LINE_BYTES: usize = 4096;

/// Log lines one decision may print; the rest are dropped, with one line saying so (review
/// #16: a plugin looping on `log` inside its deadline would flood the host's log).
pub const MAX_LOG_LINES: usize = 256;

/// Cuts `text` to at most `max` bytes at a character boundary, marking the cut.
fn clip(text: &mut String, max: usize) {
    if text.len() > max {
        text.truncate(text.floor_char_boundary(max));
        text.push_str("… (truncated)");
    }
}

impl PluginState {
    fn write_log(
        &mut self,
        level: contract::LogLevel,
        message: String,
        fields: Vec<(String, String)>,
    ) {
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES {
            if self.log_lines == MAX_LOG_LINES + 1 {
                tracing::warn!(
                    plugin = self.doors.label(),
                    parent = self.doors.scope().parent_label(),
                    "the plugin logged more than {MAX_LOG_LINES} lines in one decision; the rest are dropped"
                );
            }
            return;
        }
        // A log line is at most LOG_LINE_BYTES (and the output limit) of message and as much
        // of fields, cut in bytes at a character boundary: a cut inside a character panics.
        let cap = self.doors.output_limit().min(LOG_LINE_BYTES);
        let handed = self.doors.handed_out();
        let mut message = redact(message, handed);
        clip(&mut message, cap);
        let mut text = String::new();
        for (key, value) in &fields {
            if text.len() > cap {
                break;
            }
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(key);
            text.push('=');
            text.push_str(value);
        }
        let mut text = redact(text, handed);
        clip(&mut text, cap);
        let fields = text;
        let plugin = self.doors.label();
        let parent = self.doors.scope().parent_label();
        match level {
            contract::LogLevel::Trace => {
                tracing::trace!(plugin, parent, fields, "{message}")
            }
            contract::LogLevel::Debug => {
                tracing::debug!(plugin, parent, fields, "{message}")
            }
            contract::LogLevel::Info => tracing::info!(plugin, parent, fields, "{message}"),
            contract::LogLevel::Warn => tracing::warn!(plugin, parent, fields, "{message}"),
            contract::LogLevel::Error => {
                tracing::error!(plugin, parent, fields, "{message}")
            }
        }
    }
}

impl contract_v0_1::policy_host::policy::types::Host for PluginState {}

impl contract_v0_1::policy_host::policy::log::Host for PluginState {
    async fn log(
        &mut self,
        level: contract_v0_1::policy_host::policy::log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) {
        self.write_log(contract_v0_1::level_from_old(level), message, fields);
    }
}
