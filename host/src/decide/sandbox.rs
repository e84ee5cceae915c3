//! The sandbox: one wasmtime engine per process (pooling allocator, epoch interruption), its
//! epoch ticker, and the linker every plugin is instantiated with.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::instance::PluginState;
use super::plugin::{ContractPre, Plugin, PluginInner};
use super::{DecideError, EPOCH_TICK, Limits, MAX_PLUGIN_MEMORY};
use crate::capability::Doors;
use crate::contract::{self, PolicyInfo, PolicyPluginPre, v0_1 as contract_v0_1};

/// Address space reserved per linear memory: 4 GiB, all a 32-bit wasm memory can address.
const MEMORY_RESERVATION: u64 = 4 << 30;

/// Plugin instances that may be alive at once, all plugins together: each takes one component
/// instance and one linear memory (the pool's real cost: 4 GiB of address space each).
pub const INSTANCE_SLOTS: u32 = 128;

/// Core instances and tables the pool keeps per instance slot. A wasm32-wasip2 plugin is
/// several core modules (the program, the WASI adapter, shims) with two tables: with one
/// core-instance slot per instance slot, as before, about 40 instances fitted in 128 and the
/// 41st failed as if the plugin had crashed (review #7c). These slots are small.
const CORE_INSTANCES_PER_SLOT: u32 = 8;
const TABLES_PER_SLOT: u32 = 4;

/// Shadow runs of one policy in flight at once; more are dropped and counted
/// (`policy_host_shadow_decisions_total{outcome="dropped"}`). Counted in the pool's sizing.
pub const SHADOW_RUNS_IN_FLIGHT: usize = 4;

/// How long a decision waits for instance slots before it gives up as `SandboxBusy` (and is
/// requeued): a host that is full says so quickly rather than hold the reconcile.
pub const SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The wasmtime engine, its epoch ticker and the linker every plugin is instantiated with.
#[derive(Clone)]
pub struct Sandbox {
    engine: Engine,
    linker: Arc<Linker<PluginState>>,
    ticker: Arc<EpochTicker>,
    /// Instance slots free now: every instantiation takes its plugin's cost first, so the
    /// pool itself is never the one to run out.
    slots: Arc<tokio::sync::Semaphore>,
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
        pool.total_component_instances(INSTANCE_SLOTS)
            .total_core_instances(INSTANCE_SLOTS * CORE_INSTANCES_PER_SLOT)
            .total_memories(INSTANCE_SLOTS)
            .total_tables(INSTANCE_SLOTS * TABLES_PER_SLOT)
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
        // The instance's own imports (types, log) of the current contract and, under their own
        // versioned names, of the previous one (see `contract::v0_1`); then every capability's.
        contract::policy_host::policy::types::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .and_then(|()| {
                contract::policy_host::policy::log::add_to_linker::<_, HasSelf<_>>(
                    &mut linker,
                    |s| s,
                )
            })
            .and_then(|()| {
                contract_v0_1::policy_host::policy::types::add_to_linker::<_, HasSelf<_>>(
                    &mut linker,
                    |s| s,
                )
            })
            .and_then(|()| {
                contract_v0_1::policy_host::policy::log::add_to_linker::<_, HasSelf<_>>(
                    &mut linker,
                    |s| s,
                )
            })
            .map_err(|e| load_error("the policy imports", e))?;
        Doors::add_to_linker(&mut linker, PluginState::doors_mut)
            .map_err(|e| load_error("the capability imports", e))?;

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
            slots: Arc::new(tokio::sync::Semaphore::new(INSTANCE_SLOTS as usize)),
        })
    }

    /// The wasmtime engine (for precompiled-artifact compatibility checks).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Takes `cost` instance slots, waiting at most [`SLOT_WAIT`]; `None` when the host is
    /// full. The slots come back when the permit drops (the instance's store is gone).
    pub(super) async fn take_slots(&self, cost: u32) -> Option<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(SLOT_WAIT, self.slots.clone().acquire_many_owned(cost))
            .await
            .ok()?
            .ok()
    }

    /// Instance slots free now (for metrics and tests).
    pub fn free_slots(&self) -> usize {
        self.slots.available_permits()
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
        let slot_cost = slot_cost(component);
        if slot_cost > INSTANCE_SLOTS {
            return Err(DecideError::Load {
                source_name: source_name.to_string(),
                message: format!(
                    "one instance needs {slot_cost} instance slots (linear memories and tables) and the host has {INSTANCE_SLOTS}; a plugin is one program with one memory"
                ),
            });
        }
        let mut plugin = Plugin {
            inner: Arc::new(PluginInner {
                pre,
                info: placeholder_info(),
                declared: Arc::default(),
                label: source_name.to_string(),
                limits,
                content_sha256,
                contract_version,
                slot_cost,
                sandbox: self.clone(),
            }),
        };
        let (info, declared) = plugin.describe().await?;
        if let Some(inner) = Arc::get_mut(&mut plugin.inner) {
            inner.label = format!("{}@{}", info.name, info.version);
            inner.info = info;
            inner.declared = Arc::new(declared);
        }
        Ok(plugin)
    }
}

/// Instance slots one instance of `component` takes: one, or more for a component with several
/// memories or more tables than a slot keeps (the pool's other limits).
fn slot_cost(component: &Component) -> u32 {
    let Some(needs) = component.resources_required() else {
        return 1;
    };
    let by_tables = needs.num_tables.div_ceil(TABLES_PER_SLOT);
    needs.num_memories.max(by_tables).max(1)
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
