//! Decide: runs a policy plugin in its wasmtime sandbox and turns an observation into a
//! decision, within hard limits.
//!
//! One [`Sandbox`] per process owns the wasmtime engine. A plugin is compiled once into a
//! [`Plugin`] (component + pre-instantiated imports); every reconcile gets a fresh instance in
//! a fresh store, so no state survives between decisions and a poisoned instance (after a
//! trap or an interrupt) is simply dropped.
//!
//! Why these mechanisms:
//! - **Epoch interruption, not fuel**, for the deadline: it costs a load and compare at loop
//!   back-edges instead of fuel's counter updates everywhere, and its unit is wall-clock time,
//!   which is what an operator cares about. A background thread ticks the epoch every
//!   [`EPOCH_TICK`]. Time spent awaiting an app-call is not wasm execution, so the whole call is
//!   also wrapped in a tokio timeout of the same deadline.
//! - **Pooling allocator with pre-instantiation**: instantiation becomes a few µs of slot reuse
//!   instead of mmap/munmap per reconcile; its slot count bounds concurrent reconciles. Each
//!   slot reserves 4 GiB of *virtual* space so guest memory accesses need no bounds checks.
//! - **A resource limiter** for the memory cap, per plugin, that refuses growth with a trap
//!   (rather than letting the guest see a failed grow and abort on its own), so the error can
//!   say which limit was hit.

pub mod contract;
pub mod contract_v0_1;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::app_call::AppCallScope;
use crate::app_exchange::{Connection, MAX_OPEN_CONNECTIONS};
use contract::{
    Decision, FinalizeDecision, Observation, PolicyInfo, PolicyPlugin, PolicyPluginPre,
};

/// Bytes of a plugin's stderr kept per instance, to explain a crash (Rust panics print there).
const STDERR_CAPTURE: usize = 64 << 10;

/// How often the epoch advances; the resolution of the deadline.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Largest linear memory any plugin may have; per-plugin caps are at most this.
pub const MAX_PLUGIN_MEMORY: usize = 512 << 20;

/// Address space reserved per linear memory: 4 GiB, all a 32-bit wasm memory can address.
const MEMORY_RESERVATION: u64 = 4 << 30;

/// Concurrent plugin instances the pooling allocator has slots for.
const POOL_SLOTS: u32 = 128;

/// Hard limits for one plugin's reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time one reconcile (or finalize) may take, app-calls included.
    pub deadline: Duration,
    /// Linear memory the plugin may grow to.
    pub memory_bytes: usize,
    /// Total size of the text a decision may carry (objects, status, events) and of each
    /// log line or app-call body crossing the boundary.
    pub output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(10),
            memory_bytes: 64 << 20,
            output_bytes: 4 << 20,
        }
    }
}

/// Why a plugin produced no decision.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The bytes are not a component this host can run.
    #[error(
        "plugin {source_name} is not a loadable component of world `policy-plugin@{version}`: {message}; build it for wasm32-wasip2 against wit/policy.wit",
        version = contract::CONTRACT_VERSION
    )]
    Load {
        /// Where the bytes came from.
        source_name: String,
        /// What wasmtime said.
        message: String,
    },
    /// The plugin ran past its deadline.
    #[error(
        "plugin `{plugin}` ran past its {deadline:?} deadline while {doing}; raise its deadline limit or fix the plugin"
    )]
    Deadline {
        /// Plugin name@version.
        plugin: String,
        /// The limit.
        deadline: Duration,
        /// What it was doing.
        doing: String,
    },
    /// The plugin tried to grow its memory past the cap.
    #[error(
        "plugin `{plugin}` exceeded its {limit_mib} MiB memory limit while {doing}; raise its memory limit or fix the plugin"
    )]
    Memory {
        /// Plugin name@version.
        plugin: String,
        /// The limit in MiB.
        limit_mib: usize,
        /// What it was doing.
        doing: String,
    },
    /// The decision was larger than the output cap.
    #[error(
        "plugin `{plugin}` returned {size} bytes while {doing}, over its {limit} byte output limit; raise its output limit or make the decision smaller"
    )]
    Output {
        /// Plugin name@version.
        plugin: String,
        /// Size of the output.
        size: usize,
        /// The limit.
        limit: usize,
        /// What it was doing.
        doing: String,
    },
    /// The plugin trapped (panic, unreachable, bad memory access, ...).
    #[error("plugin `{plugin}` crashed while {doing}: {message}; this is a bug in the plugin")]
    Trap {
        /// Plugin name@version.
        plugin: String,
        /// What it was doing.
        doing: String,
        /// The trap and its wasm backtrace.
        message: String,
    },
    /// The plugin refused to decide and said why.
    #[error("plugin `{plugin}` refused to decide while {doing}: {reason}: {message}")]
    Refused {
        /// Plugin name@version.
        plugin: String,
        /// What it was doing.
        doing: String,
        /// The plugin's reason.
        reason: String,
        /// The plugin's message.
        message: String,
    },
}

impl DecideError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &str {
        match self {
            DecideError::Load { .. } => "PluginLoadFailed",
            DecideError::Deadline { .. } => "PluginDeadlineExceeded",
            DecideError::Memory { .. } => "PluginMemoryExceeded",
            DecideError::Output { .. } => "PluginOutputTooLarge",
            DecideError::Trap { .. } => "PluginCrashed",
            DecideError::Refused { reason, .. } => reason,
        }
    }
}

/// The wasmtime engine, its epoch ticker and the linker every plugin is instantiated with.
#[derive(Clone)]
pub struct Sandbox {
    engine: Engine,
    linker: Arc<Linker<PluginState>>,
    ticker: Arc<EpochTicker>,
}

struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Sandbox {
    /// Builds the engine (pooling allocator, epoch interruption) and starts its epoch ticker.
    pub fn new() -> Result<Self, DecideError> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(POOL_SLOTS)
            .total_core_instances(POOL_SLOTS)
            .total_memories(POOL_SLOTS)
            .total_tables(POOL_SLOTS)
            .max_memory_size(MAX_PLUGIN_MEMORY)
            // A fresh instance's heap would otherwise be fresh pages, faulted in on first touch
            // (about 40 faults, 75 µs, for a 5-member etcd decision). Instead a dropped slot
            // keeps up to 1 MiB resident and only the pages the instance touched are reset:
            // PAGEMAP_SCAN finds them (Linux ≥ 6.7); older kernels memset the whole 1 MiB
            // (about 15 µs per drop), still no dearer than the faults it saves.
            .linear_memory_keep_resident(1 << 20)
            .pagemap_scan(wasmtime::Enabled::Auto);
        let mut config = Config::new();
        config
            .epoch_interruption(true)
            .wasm_component_model(true)
            // 4 GiB of address space per memory lets Cranelift drop the explicit bounds check
            // on every guest load and store (the guard pages trap instead): the etcd plugin's
            // decisions run about 25% faster than with a 512 MiB reservation (BENCHMARKS.md).
            // Virtual only: 128 slots reserve about 516 GiB, none of it resident; deployments
            // that cap virtual memory (`ulimit -v`) must allow that. A 32 MiB guard covers the
            // static offsets compilers emit.
            .memory_reservation(MEMORY_RESERVATION)
            .memory_guard_size(32 << 20)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| load_error("the host engine", e))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| load_error("the WASI imports", e))?;
        PolicyPlugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
            .map_err(|e| load_error("the policy imports", e))?;
        // The previous contract's imports, under their own versioned names, for plugins built
        // against it (see `contract_v0_1`).
        contract_v0_1::PolicyPlugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
            .map_err(|e| load_error("the policy 0.1 imports", e))?;

        let stop = Arc::new(AtomicBool::new(false));
        let ticking = engine.weak();
        let stop_ticking = stop.clone();
        std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                while !stop_ticking.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match ticking.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| DecideError::Load {
                source_name: "the host engine".into(),
                message: format!("cannot start the epoch ticker thread: {e}"),
            })?;
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            ticker: Arc::new(EpochTicker { stop }),
        })
    }

    /// The wasmtime engine (for precompiled-artifact compatibility checks).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles a plugin, checks it exports the contract, and reads its self-description.
    pub async fn load(
        &self,
        source_name: &str,
        bytes: &[u8],
        limits: Limits,
    ) -> Result<Plugin, DecideError> {
        let component =
            Component::from_binary(&self.engine, bytes).map_err(|e| load_error(source_name, e))?;
        let content_sha256 = hex(&Sha256::digest(bytes));
        self.load_component(source_name, &component, content_sha256, limits)
            .await
    }

    /// Checks an already compiled component exports the contract, and reads its
    /// self-description (for loaders that compile through a precompiled-artifact cache).
    pub async fn load_component(
        &self,
        source_name: &str,
        component: &Component,
        content_sha256: String,
        limits: Limits,
    ) -> Result<Plugin, DecideError> {
        let _keep_ticking = &self.ticker;
        let pre = self
            .linker
            .instantiate_pre(component)
            .map_err(|e| load_error(source_name, e))?;
        let pre = if contract_v0_1::exports_v0_1(&self.engine, component) {
            ContractPre::V0_1(
                contract_v0_1::PolicyPluginPre::new(pre).map_err(|e| load_error(source_name, e))?,
            )
        } else {
            ContractPre::Current(PolicyPluginPre::new(pre).map_err(|e| load_error(source_name, e))?)
        };
        let contract_version = contract::exported_version(&self.engine, component)
            .unwrap_or_else(|| pre.version().to_owned());
        let mut plugin = Plugin {
            inner: Arc::new(PluginInner {
                pre,
                info: placeholder_info(),
                label: source_name.to_string(),
                limits,
                content_sha256,
                contract_version,
                sandbox: self.clone(),
            }),
        };
        let info = plugin.describe().await?;
        if let Some(inner) = Arc::get_mut(&mut plugin.inner) {
            inner.label = format!("{}@{}", info.name, info.version);
            inner.info = info;
        }
        Ok(plugin)
    }
}

fn load_error(source_name: &str, error: wasmtime::Error) -> DecideError {
    DecideError::Load {
        source_name: source_name.to_string(),
        message: format!("{error:#}"),
    }
}

fn placeholder_info() -> PolicyInfo {
    PolicyInfo {
        name: String::new(),
        version: String::new(),
        target: contract::KindRef {
            group: String::new(),
            version: String::new(),
            kind: String::new(),
            plural: String::new(),
            namespaced: true,
        },
        children: Vec::new(),
        capabilities: Vec::new(),
        wants_finalizer: false,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A compiled, described plugin, ready to decide. Cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

/// A pre-instantiated plugin, bound by the contract version it was built against.
enum ContractPre {
    Current(PolicyPluginPre<PluginState>),
    V0_1(contract_v0_1::PolicyPluginPre<PluginState>),
}

impl ContractPre {
    async fn instantiate(
        &self,
        store: &mut Store<PluginState>,
    ) -> wasmtime::Result<ContractInstance> {
        Ok(match self {
            ContractPre::Current(pre) => {
                ContractInstance::Current(pre.instantiate_async(store).await?)
            }
            ContractPre::V0_1(pre) => ContractInstance::V0_1(pre.instantiate_async(store).await?),
        })
    }

    /// The version a plugin on these bindings was built against, when its exports don't say.
    fn version(&self) -> &'static str {
        match self {
            ContractPre::Current(_) => contract::CONTRACT_VERSION,
            ContractPre::V0_1(_) => contract_v0_1::VERSION,
        }
    }
}

/// A plugin instance; calls take and return current types whatever contract it was built on.
enum ContractInstance {
    Current(PolicyPlugin),
    V0_1(contract_v0_1::PolicyPlugin),
}

impl ContractInstance {
    async fn describe(&self, store: &mut Store<PluginState>) -> wasmtime::Result<PolicyInfo> {
        match self {
            ContractInstance::Current(p) => {
                p.policy_host_policy_policy().call_describe(store).await
            }
            ContractInstance::V0_1(p) => Ok(contract_v0_1::policy_info_from_old(
                p.policy_host_policy_policy().call_describe(store).await?,
            )),
        }
    }

    async fn reconcile(
        &self,
        store: &mut Store<PluginState>,
        observation: &Observation,
    ) -> wasmtime::Result<Result<Decision, contract::PolicyError>> {
        match self {
            ContractInstance::Current(p) => {
                p.policy_host_policy_policy()
                    .call_reconcile(store, observation)
                    .await
            }
            ContractInstance::V0_1(p) => {
                let observation = contract_v0_1::observation_to_old(observation);
                Ok(contract_v0_1::decision_from_old(
                    p.policy_host_policy_policy()
                        .call_reconcile(store, &observation)
                        .await?,
                ))
            }
        }
    }

    async fn finalize(
        &self,
        store: &mut Store<PluginState>,
        observation: &Observation,
    ) -> wasmtime::Result<Result<FinalizeDecision, contract::PolicyError>> {
        match self {
            ContractInstance::Current(p) => {
                p.policy_host_policy_policy()
                    .call_finalize(store, observation)
                    .await
            }
            ContractInstance::V0_1(p) => {
                let observation = contract_v0_1::observation_to_old(observation);
                Ok(contract_v0_1::finalize_decision_from_old(
                    p.policy_host_policy_policy()
                        .call_finalize(store, &observation)
                        .await?,
                ))
            }
        }
    }
}

struct PluginInner {
    pre: ContractPre,
    info: PolicyInfo,
    label: String,
    limits: Limits,
    content_sha256: String,
    /// The contract version the component exports (see [`Plugin::contract_version`]).
    contract_version: String,
    sandbox: Sandbox,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("label", &self.inner.label)
            .field("sha256", &self.inner.content_sha256)
            .finish()
    }
}

impl Plugin {
    /// What the plugin said about itself when loaded.
    pub fn info(&self) -> &PolicyInfo {
        &self.inner.info
    }

    /// `name@version`, for logs and errors.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// sha256 of the component bytes, hex.
    pub fn content_sha256(&self) -> &str {
        &self.inner.content_sha256
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The contract version the plugin was built against, as its component exports it
    /// (`0.2.1`, `0.2.0`, or `0.1.0` for a plugin served through the previous minor's bindings).
    pub fn contract_version(&self) -> &str {
        &self.inner.contract_version
    }

    /// Asks the plugin to describe itself.
    async fn describe(&self) -> Result<PolicyInfo, DecideError> {
        let doing = "describing itself".to_string();
        self.run(
            AppCallScope::none(),
            None,
            &doing,
            &(),
            |plugin, store, ()| Box::pin(async move { plugin.describe(store).await }),
        )
        .await
    }

    /// Decides what to do for one observation.
    pub async fn reconcile(
        &self,
        observation: &Observation,
        app_calls: AppCallScope,
        doing: &str,
    ) -> Result<Decision, DecideError> {
        let now = observation.now;
        let outcome = self
            .run(
                app_calls,
                Some(now),
                doing,
                observation,
                |plugin, store, observation| {
                    Box::pin(async move { plugin.reconcile(store, observation).await })
                },
            )
            .await?;
        self.accept(outcome, doing, |d: &Decision| &d.actions)
    }

    /// Decides cleanup for a parent being deleted.
    pub async fn finalize(
        &self,
        observation: &Observation,
        app_calls: AppCallScope,
        doing: &str,
    ) -> Result<FinalizeDecision, DecideError> {
        let now = observation.now;
        let outcome = self
            .run(
                app_calls,
                Some(now),
                doing,
                observation,
                |plugin, store, observation| {
                    Box::pin(async move { plugin.finalize(store, observation).await })
                },
            )
            .await?;
        self.accept(outcome, doing, |d: &FinalizeDecision| &d.actions)
    }

    /// Instantiates the plugin once, to call [`ReusedInstance::reconcile`] on it repeatedly.
    /// For benchmarks only: the host never reuses an instance, because decisions are
    /// stateless (see the module docs).
    #[doc(hidden)]
    pub async fn instantiate_for_reuse(
        &self,
        app_calls: AppCallScope,
        now: Option<contract::Timestamp>,
    ) -> Result<ReusedInstance, DecideError> {
        let mut store = self.new_store(app_calls, now);
        let doing = "instantiating";
        let instance = self
            .inner
            .pre
            .instantiate(&mut store)
            .await
            .map_err(|error| self.classify(error, &store, doing))?;
        Ok(ReusedInstance {
            plugin: self.clone(),
            store,
            instance,
        })
    }

    /// A plugin's answer becomes a decision only if it is not a refusal and its actions fit
    /// the output limit.
    fn accept<T>(
        &self,
        outcome: Result<T, contract::PolicyError>,
        doing: &str,
        actions: impl Fn(&T) -> &[contract::Action],
    ) -> Result<T, DecideError> {
        let decision = self.refused(outcome, doing)?;
        self.check_output(
            actions(&decision).iter().map(|a| a.output_len()).sum(),
            doing,
        )?;
        Ok(decision)
    }

    fn refused<T>(
        &self,
        outcome: Result<T, contract::PolicyError>,
        doing: &str,
    ) -> Result<T, DecideError> {
        outcome.map_err(|e| DecideError::Refused {
            plugin: self.inner.label.clone(),
            doing: doing.to_string(),
            reason: e.reason,
            message: e.message,
        })
    }

    fn check_output(&self, size: usize, doing: &str) -> Result<(), DecideError> {
        if size > self.inner.limits.output_bytes {
            return Err(DecideError::Output {
                plugin: self.inner.label.clone(),
                size,
                limit: self.inner.limits.output_bytes,
                doing: doing.to_string(),
            });
        }
        Ok(())
    }

    /// Instantiates the plugin in a fresh store and runs `call` under every limit.
    ///
    /// `input` is handed to `call` by reference rather than captured, so the observation is
    /// not cloned per decision (a closure capturing a borrow could not satisfy `for<'a>`).
    async fn run<I: Sync + ?Sized, T: Send + 'static>(
        &self,
        app_calls: AppCallScope,
        now: Option<contract::Timestamp>,
        doing: &str,
        input: &I,
        call: impl for<'a> FnOnce(
            &'a ContractInstance,
            &'a mut Store<PluginState>,
            &'a I,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = wasmtime::Result<T>> + Send + 'a>,
        > + Send,
    ) -> Result<T, DecideError> {
        let inner = &self.inner;
        let limits = &inner.limits;
        let mut store = self.new_store(app_calls, now);
        let work = async {
            let plugin = inner.pre.instantiate(&mut store).await?;
            call(&plugin, &mut store, input).await
        };
        let result = match tokio::time::timeout(limits.deadline, work).await {
            Ok(result) => result,
            Err(_) => return Err(self.deadline_error(doing)),
        };
        result.map_err(|error| self.classify(error, &store, doing))
    }

    /// A fresh store for one instance, under the plugin's memory limit and deadline.
    fn new_store(
        &self,
        app_calls: AppCallScope,
        now: Option<contract::Timestamp>,
    ) -> Store<PluginState> {
        let inner = &self.inner;
        let state = PluginState::new(inner.label.clone(), &inner.limits, app_calls, now);
        let mut store = Store::new(&inner.sandbox.engine, state);
        store.limiter(|state| state);
        store.set_epoch_deadline(self.deadline_ticks());
        store.epoch_deadline_trap();
        store
    }

    fn deadline_ticks(&self) -> u64 {
        (self.inner.limits.deadline.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
    }

    fn deadline_error(&self, doing: &str) -> DecideError {
        DecideError::Deadline {
            plugin: self.inner.label.clone(),
            deadline: self.inner.limits.deadline,
            doing: doing.to_string(),
        }
    }

    fn classify(
        &self,
        error: wasmtime::Error,
        store: &Store<PluginState>,
        doing: &str,
    ) -> DecideError {
        if error.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
            return self.deadline_error(doing);
        }
        if store.data().memory_refused {
            return DecideError::Memory {
                plugin: self.inner.label.clone(),
                limit_mib: self.inner.limits.memory_bytes >> 20,
                doing: doing.to_string(),
            };
        }
        if let Some(size) = store.data().oversized_output {
            return DecideError::Output {
                plugin: self.inner.label.clone(),
                size,
                limit: self.inner.limits.output_bytes,
                doing: doing.to_string(),
            };
        }
        // The full error carries the wasm backtrace: good for the log, too long for an Event.
        tracing::debug!(plugin = %self.inner.label, "plugin trap: {error:?}");
        let trap = error
            .downcast_ref::<wasmtime::Trap>()
            .map_or_else(|| error.root_cause().to_string(), |t| t.to_string());
        let said = store.data().stderr_tail();
        DecideError::Trap {
            plugin: self.inner.label.clone(),
            doing: doing.to_string(),
            message: if said.is_empty() {
                trap
            } else {
                format!("{said} ({trap})")
            },
        }
    }
}

/// One plugin instance called repeatedly, for benchmarks that separate the cost of a call
/// from the cost of instantiation. Not used by the host (see [`Plugin::instantiate_for_reuse`]);
/// after an error the instance may be poisoned: drop it.
#[doc(hidden)]
pub struct ReusedInstance {
    plugin: Plugin,
    store: Store<PluginState>,
    instance: ContractInstance,
}

impl ReusedInstance {
    /// Decides for one observation on this instance, under the deadline (re-armed per call)
    /// and the output limit; the frozen clock keeps the time it was instantiated with.
    pub async fn reconcile(
        &mut self,
        observation: &Observation,
        doing: &str,
    ) -> Result<Decision, DecideError> {
        let plugin = &self.plugin;
        self.store.set_epoch_deadline(plugin.deadline_ticks());
        let call = self.instance.reconcile(&mut self.store, observation);
        let outcome = match tokio::time::timeout(plugin.inner.limits.deadline, call).await {
            Ok(result) => result.map_err(|error| plugin.classify(error, &self.store, doing))?,
            Err(_) => return Err(plugin.deadline_error(doing)),
        };
        let decision = plugin.refused(outcome, doing)?;
        plugin.check_output(decision.actions.iter().map(|a| a.output_len()).sum(), doing)?;
        Ok(decision)
    }
}

/// Per-instance state: a locked-down WASI context, the memory limiter and the app-call scope.
pub struct PluginState {
    wasi: WasiCtx,
    table: ResourceTable,
    memory_limit: usize,
    /// Set when the memory limiter refused a growth.
    memory_refused: bool,
    /// What the plugin wrote to stderr (a panic message, typically), bounded; shown when it traps.
    stderr: wasmtime_wasi::p2::pipe::MemoryOutputPipe,
    /// Set when an import saw more plugin output than the output limit allows.
    oversized_output: Option<usize>,
    pub(crate) label: String,
    pub(crate) output_limit: usize,
    pub(crate) app_calls: AppCallScope,
    /// Exchange connections open now (they live in `table`).
    open_connections: usize,
}

impl PluginState {
    fn new(
        label: String,
        limits: &Limits,
        app_calls: AppCallScope,
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
            oversized_output: None,
            label,
            output_limit: limits.output_bytes,
            app_calls,
            open_connections: 0,
        }
    }

    /// Records that an import refused oversized plugin output.
    pub(crate) fn note_oversized_output(&mut self, size: usize) {
        self.oversized_output = Some(size);
    }
}

impl PluginState {
    /// The last non-empty lines of what the plugin wrote to stderr, at most ~300 characters.
    fn stderr_tail(&self) -> String {
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

impl PluginState {
    fn write_log(
        &mut self,
        level: contract::LogLevel,
        message: String,
        fields: Vec<(String, String)>,
    ) {
        let mut message = message;
        if message.len() > self.output_limit {
            message.truncate(self.output_limit.min(4096));
            message.push_str("… (truncated)");
        }
        let fields: String = fields
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let plugin = self.label.as_str();
        let parent = self.app_calls.parent_label();
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

impl contract::app_call::Host for PluginState {
    async fn call(
        &mut self,
        request: contract::app_call::Request,
    ) -> Result<contract::app_call::Response, contract::app_call::CallError> {
        let size = request.body.as_ref().map_or(0, |b| b.len()) + request.path.len();
        if size > self.output_limit {
            self.note_oversized_output(size);
            return Err(contract::app_call::CallError::Refused(format!(
                "request of {size} bytes is over the plugin's {} byte output limit",
                self.output_limit
            )));
        }
        let limit = self.output_limit;
        self.app_calls.call(&self.label, request, None, limit).await
    }

    async fn call_tls(
        &mut self,
        request: contract::app_call::Request,
        tls: contract::app_call::TlsClient,
    ) -> Result<contract::app_call::Response, contract::app_call::CallError> {
        let size = request.body.as_ref().map_or(0, |b| b.len()) + request.path.len();
        if size > self.output_limit {
            self.note_oversized_output(size);
            return Err(contract::app_call::CallError::Refused(format!(
                "request of {size} bytes is over the plugin's {} byte output limit",
                self.output_limit
            )));
        }
        let limit = self.output_limit;
        self.app_calls
            .call(&self.label, request, Some(&tls), limit)
            .await
    }
}

impl contract::exchange::Host for PluginState {}

impl contract::exchange::HostConnection for PluginState {
    async fn open(
        &mut self,
        pod: String,
        port: String,
    ) -> Result<Resource<Connection>, contract::exchange::ExchangeError> {
        if self.open_connections >= MAX_OPEN_CONNECTIONS {
            return Err(contract::exchange::ExchangeError::Refused(format!(
                "{MAX_OPEN_CONNECTIONS} connections are open already; drop one first"
            )));
        }
        let connection = Connection::open(&self.app_calls, pod, port, self.output_limit)
            .await
            .inspect_err(|error| {
                if let contract::exchange::ExchangeError::Refused(why) = error {
                    tracing::warn!(plugin = %self.label, parent = %self.app_calls.parent_label(), %why, "exchange refused");
                }
            })?;
        let resource = self.table.push(connection).map_err(|e| {
            contract::exchange::ExchangeError::Refused(format!("cannot keep the connection: {e}"))
        })?;
        self.open_connections += 1;
        Ok(resource)
    }

    async fn send(
        &mut self,
        connection: Resource<Connection>,
        bytes: Vec<u8>,
    ) -> Result<(), contract::exchange::ExchangeError> {
        if bytes.len() > self.output_limit {
            self.note_oversized_output(bytes.len());
        }
        self.connection(&connection)?.send(bytes).await
    }

    async fn receive(
        &mut self,
        connection: Resource<Connection>,
        max_bytes: u32,
        timeout_ms: u32,
    ) -> Result<Vec<u8>, contract::exchange::ExchangeError> {
        self.connection(&connection)?
            .receive(max_bytes, Duration::from_millis(u64::from(timeout_ms)))
            .await
    }

    async fn drop(&mut self, connection: Resource<Connection>) -> wasmtime::Result<()> {
        self.table.delete(connection)?;
        self.open_connections = self.open_connections.saturating_sub(1);
        Ok(())
    }
}

impl PluginState {
    fn connection(
        &mut self,
        connection: &Resource<Connection>,
    ) -> Result<&mut Connection, contract::exchange::ExchangeError> {
        self.table.get_mut(connection).map_err(|e| {
            contract::exchange::ExchangeError::Refused(format!("no such connection: {e}"))
        })
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

impl contract_v0_1::policy_host::policy::app_call::Host for PluginState {
    async fn call(
        &mut self,
        request: contract_v0_1::policy_host::policy::app_call::Request,
    ) -> Result<
        contract_v0_1::policy_host::policy::app_call::Response,
        contract_v0_1::policy_host::policy::app_call::CallError,
    > {
        let request = contract_v0_1::request_from_old(request);
        let answer = contract::app_call::Host::call(self, request).await;
        contract_v0_1::answer_to_old(answer)
    }
}
