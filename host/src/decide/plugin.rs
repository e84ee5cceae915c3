//! A plugin's lifecycle: compiled once, described once, then every reconcile or finalize in a
//! fresh instance in a fresh store, under the deadline, memory and output limits, with errors
//! classified into what the admin can act on.

use std::sync::Arc;

use wasmtime::Store;

use super::instance::PluginState;
use super::sandbox::Sandbox;
use super::{DecideError, EPOCH_TICK, Limits};
use crate::capability::credentials::{HandedOut, find_leak, redact};
use crate::capability::metrics::{Declarations, MetricReport, MetricsDoor};
use crate::capability::scope::AppCallScope;
use crate::contract::{
    self, Decision, FinalizeDecision, Observation, PolicyInfo, PolicyPlugin, PolicyPluginPre,
    v0_1 as contract_v0_1,
};

/// A compiled, described plugin, ready to decide. Cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    pub(super) inner: Arc<PluginInner>,
}

/// A pre-instantiated plugin, bound by the contract version it was built against.
pub(super) enum ContractPre {
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
    pub(super) fn version(&self) -> &'static str {
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

pub(super) struct PluginInner {
    pub(super) pre: ContractPre,
    pub(super) info: PolicyInfo,
    /// The metrics the plugin declared while describing itself (contract 0.2.3).
    pub(super) declared: Arc<Declarations>,
    pub(super) label: String,
    pub(super) limits: Limits,
    pub(super) content_sha256: String,
    /// The contract version the component exports (see [`Plugin::contract_version`]).
    pub(super) contract_version: String,
    /// Instance slots one instance takes (see [`Sandbox::take_slots`]).
    pub(super) slot_cost: u32,
    pub(super) sandbox: Sandbox,
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

    /// The metrics the plugin declared when it loaded (none for a plugin built before 0.2.3).
    pub fn declared_metrics(&self) -> &Arc<Declarations> {
        &self.inner.declared
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

    /// Instance slots one instance of this plugin takes (see [`super::sandbox::INSTANCE_SLOTS`]).
    pub fn slot_cost(&self) -> u32 {
        self.inner.slot_cost
    }

    /// The contract version the plugin was built against, as its component exports it
    /// (`0.2.1`, `0.2.0`, or `0.1.0` for a plugin served through the previous minor's bindings).
    pub fn contract_version(&self) -> &str {
        &self.inner.contract_version
    }

    /// Asks the plugin to describe itself, and reads the metrics it declared meanwhile; a
    /// declaration the host refuses fails the load.
    pub(super) async fn describe(&self) -> Result<(PolicyInfo, Declarations), DecideError> {
        let doing = "describing itself".to_string();
        let (info, ended) = self
            .run(
                AppCallScope::none(),
                MetricsDoor::declaring(),
                None,
                &doing,
                &(),
                |plugin, store, ()| Box::pin(async move { plugin.describe(store).await }),
            )
            .await?;
        match ended.metrics {
            MetricsDoor::Declaring { refused, .. } if !refused.is_empty() => {
                Err(DecideError::Load {
                    source_name: self.inner.label.clone(),
                    message: format!(
                        "the host refuses metrics it declared: {}; fix the declarations its describe makes",
                        refused.join("; ")
                    ),
                })
            }
            MetricsDoor::Declaring { declared, .. } => Ok((info, declared)),
            _ => Ok((info, Declarations::default())),
        }
    }

    /// Decides what to do for one observation. What the plugin reported of its metrics is
    /// dropped: this is the call for runs whose metrics are never exported (a shadow
    /// candidate, `simulate`); the controller calls [`Self::reconcile_reporting`].
    pub async fn reconcile(
        &self,
        observation: &Observation,
        app_calls: AppCallScope,
        doing: &str,
    ) -> Result<Decision, DecideError> {
        self.reconcile_reporting(observation, app_calls, doing)
            .await
            .map(|(decision, _)| decision)
    }

    /// Decides what to do for one observation, with the metrics the plugin reported while it
    /// decided (checked against its declarations; see [`crate::capability::metrics`]).
    pub async fn reconcile_reporting(
        &self,
        observation: &Observation,
        app_calls: AppCallScope,
        doing: &str,
    ) -> Result<(Decision, MetricReport), DecideError> {
        let now = observation.now;
        let (outcome, ended) = self
            .run(
                app_calls,
                MetricsDoor::reporting(self.inner.declared.clone()),
                Some(now),
                doing,
                observation,
                |plugin, store, observation| {
                    Box::pin(async move { plugin.reconcile(store, observation).await })
                },
            )
            .await?;
        let decision = self.accept((outcome, ended.handed_out), doing, |d: &Decision| {
            &d.actions
        })?;
        let report = match ended.metrics {
            MetricsDoor::Reporting { report, .. } => report,
            _ => MetricReport::default(),
        };
        Ok((decision, report))
    }

    /// Decides cleanup for a parent being deleted.
    pub async fn finalize(
        &self,
        observation: &Observation,
        app_calls: AppCallScope,
        doing: &str,
    ) -> Result<FinalizeDecision, DecideError> {
        let now = observation.now;
        // Closed to metrics: the parent is going, and its series with it.
        let (outcome, ended) = self
            .run(
                app_calls,
                MetricsDoor::Closed,
                Some(now),
                doing,
                observation,
                |plugin, store, observation| {
                    Box::pin(async move { plugin.finalize(store, observation).await })
                },
            )
            .await?;
        self.accept(
            (outcome, ended.handed_out),
            doing,
            |d: &FinalizeDecision| &d.actions,
        )
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
        let mut store = self.new_store(app_calls, MetricsDoor::Closed, now);
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

    /// A plugin's answer becomes a decision only if it is not a refusal, its actions fit
    /// the output limit, and carries no credential handed to it.
    fn accept<T>(
        &self,
        (outcome, handed_out): (Result<T, contract::PolicyError>, Vec<HandedOut>),
        doing: &str,
        actions: impl Fn(&T) -> &[contract::Action],
    ) -> Result<T, DecideError> {
        let outcome = outcome.map_err(|mut refusal| {
            // A refusal's message goes into Events and logs as well.
            refusal.message = redact(refusal.message, &handed_out);
            refusal
        });
        let decision = self.refused(outcome, doing)?;
        self.check_output(
            actions(&decision).iter().map(|a| a.output_len()).sum(),
            doing,
        )?;
        if let Some(leak) = find_leak(actions(&decision), &handed_out) {
            return Err(DecideError::CredentialLeak {
                plugin: self.inner.label.clone(),
                doing: doing.to_string(),
                secret: leak.secret,
                key: leak.key,
                place: leak.place,
            });
        }
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
            reason: bounded(e.reason, MAX_REFUSAL_REASON),
            message: bounded(e.message, MAX_REFUSAL_MESSAGE),
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
        metrics: MetricsDoor,
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
    ) -> Result<(T, Ended), DecideError> {
        let inner = &self.inner;
        let limits = &inner.limits;
        // Held until the store is dropped at the end of this call.
        let Some(_slots) = inner.sandbox.take_slots(inner.slot_cost).await else {
            return Err(DecideError::SandboxBusy {
                plugin: inner.label.clone(),
                doing: doing.to_string(),
            });
        };
        let mut store = self.new_store(app_calls, metrics, now);
        let work = async {
            let plugin = inner.pre.instantiate(&mut store).await?;
            call(&plugin, &mut store, input).await
        };
        let result = match tokio::time::timeout(limits.deadline, work).await {
            Ok(result) => result,
            Err(_) => return Err(self.deadline_error(doing)),
        };
        let doors = store.data().doors();
        doors.seal();
        let handed_out = doors.handed_out().to_vec();
        let metrics = store.data_mut().doors_mut().metrics_mut().take();
        result
            .map(|outcome| {
                (
                    outcome,
                    Ended {
                        handed_out,
                        metrics,
                    },
                )
            })
            .map_err(|error| self.classify(error, &store, doing))
    }

    /// A fresh store for one instance, under the plugin's memory limit and deadline.
    fn new_store(
        &self,
        app_calls: AppCallScope,
        metrics: MetricsDoor,
        now: Option<contract::Timestamp>,
    ) -> Store<PluginState> {
        let inner = &self.inner;
        let state = PluginState::new(inner.label.clone(), &inner.limits, app_calls, metrics, now);
        let mut store = Store::new(inner.sandbox.engine(), state);
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
        if store.data().memory_refused() {
            return DecideError::Memory {
                plugin: self.inner.label.clone(),
                limit_mib: self.inner.limits.memory_bytes >> 20,
                doing: doing.to_string(),
            };
        }
        if let Some(size) = store.data().doors().oversized_output() {
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

/// What an instance leaves behind for the host once its call returned: the credentials it was
/// handed (which must not leave in the decision) and its metrics door (declarations or reports).
struct Ended {
    handed_out: Vec<HandedOut>,
    metrics: MetricsDoor,
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

/// Bytes of a refusal's reason: it becomes an Event reason and a metric label (review #16).
pub const MAX_REFUSAL_REASON: usize = 128;
/// Bytes of a refusal's message: it goes into logs, Events and errors.
pub const MAX_REFUSAL_MESSAGE: usize = 4096;

/// `text` cut to at most `max` bytes at a character boundary, the cut marked.
fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mark = "…";
        text.truncate(text.floor_char_boundary(max - mark.len()));
        text.push_str(mark);
    }
    text
}
