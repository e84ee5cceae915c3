//! The plugin's only ways out of the sandbox, each with its grant, its limits and the host side
//! of its WIT import: HTTP app-calls ([`http`], with TLS from [`tls`]), raw exchanges
//! ([`exchange`]) and credentials for them ([`credentials`]), all checked against one
//! reconcile's [`scope`] and answered, when there is no network, by [`replay`]; and the one way
//! out that reaches no app, the domain [`metrics`] a plugin declared and reports.
//!
//! The capabilities take their types from [`crate::contract`] and nothing else of the host.
//! The sandbox (`decide`) puts them together: each instance's state holds one [`Doors`] and
//! [`Doors::add_to_linker`] links their imports through a projection, as Spin's embedder does
//! with its factors.

pub mod credentials;
pub mod exchange;
pub mod http;
pub mod metrics;
pub mod replay;
pub mod scope;
pub mod tls;

use wasmtime::component::{HasSelf, Linker};

use crate::contract;
use credentials::HandedOut;
use exchange::Connections;
use metrics::MetricsDoor;
use scope::AppCallScope;

/// What one plugin instance may reach and has open: its scope, the output limit its requests
/// and connections count against, and its exchange connections. Dropped with the instance's
/// store, which closes every connection left open.
#[derive(Debug)]
pub struct Doors {
    /// `name@version` of the plugin, for logs.
    label: String,
    scope: AppCallScope,
    output_limit: usize,
    /// Set when an import saw more plugin output than the output limit allows.
    oversized_output: Option<usize>,
    connections: Connections,
    /// Bytes sent and received over exchanges by this instance: all of them count against the
    /// output limit, whatever the connection (review #5).
    exchanged: usize,
    /// Connections this instance opened in all.
    opened: usize,
    /// Credentials handed to the plugin in this decision: they must not leave it.
    handed_out: Vec<HandedOut>,
    /// The metrics declared (describe) or reported (reconcile) by this instance.
    metrics: MetricsDoor,
}

impl Doors {
    /// The doors of one instance of the plugin `label`, reaching what `scope` allows and
    /// sending at most `output_limit` bytes at a time.
    pub fn new(label: String, scope: AppCallScope, output_limit: usize) -> Self {
        Self {
            label,
            scope,
            output_limit,
            oversized_output: None,
            connections: Connections::default(),
            exchanged: 0,
            opened: 0,
            handed_out: Vec::new(),
            metrics: MetricsDoor::Closed,
        }
    }

    /// The same doors, with `metrics` open for declarations or reports (closed otherwise).
    pub fn with_metrics(mut self, metrics: MetricsDoor) -> Self {
        self.metrics = metrics;
        self
    }

    /// The `metrics` import's state.
    pub(crate) fn metrics_mut(&mut self) -> &mut MetricsDoor {
        &mut self.metrics
    }

    /// `name@version` of the plugin these doors belong to.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Bytes the plugin may send or receive at a time.
    pub fn output_limit(&self) -> usize {
        self.output_limit
    }

    /// What this instance may reach.
    pub fn scope(&self) -> &AppCallScope {
        &self.scope
    }

    /// The size of plugin output an import refused as over the output limit, if one did.
    pub fn oversized_output(&self) -> Option<usize> {
        self.oversized_output
    }

    /// Records that an import refused oversized plugin output.
    pub(crate) fn note_oversized_output(&mut self, size: usize) {
        self.oversized_output = Some(size);
    }

    /// The credentials handed to the plugin so far in this decision.
    pub fn handed_out(&self) -> &[HandedOut] {
        &self.handed_out
    }

    /// Remembers a credential handed out; a recording that already carries it, or will, is
    /// marked incomplete when the decision ends ([`Self::seal`]).
    pub(crate) fn note_handed_out(&mut self, handed: HandedOut) {
        if !self
            .handed_out
            .iter()
            .any(|h| h.secret == handed.secret && h.key == handed.key)
        {
            if let Some(recorder) = self.scope.recorder() {
                recorder.record_credential(&handed);
            }
            self.handed_out.push(handed);
        }
    }

    /// Ends the decision's use of the doors: a recording whose bytes carry a credential
    /// handed out is emptied and marked incomplete, so it is never replayed (a shadow
    /// candidate would otherwise be shown the value, and the value would sit in host memory
    /// for as long as the recording does).
    pub fn seal(&self) {
        if let Some(recorder) = self.scope.recorder() {
            recorder.forget_if_carrying(&self.handed_out);
        }
    }

    /// Links the imports of every capability, of the current contract and of the previous
    /// ones, into `linker`; `doors` finds an instance's [`Doors`] in its state.
    pub fn add_to_linker<T: Send + 'static>(
        linker: &mut Linker<T>,
        doors: fn(&mut T) -> &mut Doors,
    ) -> wasmtime::Result<()> {
        contract::app_call::add_to_linker::<T, HasSelf<Doors>>(linker, doors)?;
        contract::exchange::add_to_linker::<T, HasSelf<Doors>>(linker, doors)?;
        contract::credentials::add_to_linker::<T, HasSelf<Doors>>(linker, doors)?;
        contract::metrics::add_to_linker::<T, HasSelf<Doors>>(linker, doors)?;
        contract::v0_1::policy_host::policy::app_call::add_to_linker::<T, HasSelf<Doors>>(
            linker, doors,
        )?;
        Ok(())
    }
}
