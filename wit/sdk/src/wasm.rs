//! The WebAssembly glue (only on `wasm32`): the generated bindings, conversions between
//! them and [`crate::contract`], the app-call client over the host import, and the adapter
//! that [`export_plugin!`](crate::export_plugin) exports. No decision is made here.

use std::marker::PhantomData;

use crate::contract;
use crate::{AppCall, Plugin};

/// The bindings wit-bindgen generates from `wit/policy.wit` (world `policy-plugin`).
///
/// The generated code is `unsafe` FFI (canonical-ABI lifting and lowering of raw pointers),
/// which is how a component imports and exports functions. It is sound as long as the
/// bindings match the WIT world, which wit-bindgen guarantees by generating both sides from
/// the same file; nothing else in the SDK uses `unsafe`.
#[allow(unsafe_code, missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../policy.wit",
        world: "policy-plugin",
        pub_export_macro: true,
        default_bindings_module: "policy_host_sdk::wasm::bindings",
    });
}

use bindings::exports::policy_host::policy::policy::Guest;
use bindings::policy_host::policy::app_call as wit_call;
use bindings::policy_host::policy::credentials as wit_credentials;
use bindings::policy_host::policy::exchange as wit_exchange;
use bindings::policy_host::policy::log as wit_log;
use bindings::policy_host::policy::metrics as wit_metrics;
use bindings::policy_host::policy::types as wit;

/// Implements the generated `Guest` trait for any [`Plugin`]; `export_plugin!` exports it.
pub struct Exported<P>(PhantomData<P>);

/// The app-call client over the host's `app-call` import.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostAppCall;

impl AppCall for HostAppCall {
    fn call(
        &mut self,
        request: &contract::AppCallRequest,
    ) -> Result<contract::AppCallResponse, contract::AppCallError> {
        let wit_request = wit_call::Request {
            pod: request.pod.clone(),
            port: request.port.clone(),
            method: match request.method {
                contract::Method::Get => wit_call::Method::Get,
                contract::Method::Post => wit_call::Method::Post,
                contract::Method::Put => wit_call::Method::Put,
                contract::Method::Delete => wit_call::Method::Delete,
            },
            path: request.path.clone(),
            body: request.body.clone(),
        };
        let answer = match &request.tls {
            Some(tls) => wit_call::call_tls(
                &wit_request,
                &wit_call::TlsClient {
                    secret: tls.secret.clone(),
                    server_name: tls.server_name.clone(),
                },
            ),
            None => wit_call::call(&wit_request),
        };
        answer
            .map(|r| contract::AppCallResponse {
                status: r.status,
                body: r.body,
            })
            .map_err(|e| match e {
                wit_call::CallError::Refused(why) => contract::AppCallError::Refused(why),
                wit_call::CallError::Unreachable(why) => contract::AppCallError::Unreachable(why),
                wit_call::CallError::Timeout => contract::AppCallError::Timeout,
            })
    }

    fn credential(
        &mut self,
        secret: &str,
        key: &str,
    ) -> Result<crate::Credential, crate::CredentialError> {
        wit_credentials::read(secret, key)
            .map(crate::Credential::new)
            .map_err(|e| match e {
                wit_credentials::CredentialError::Refused(why) => {
                    crate::CredentialError::Refused(why)
                }
                wit_credentials::CredentialError::Missing(why) => {
                    crate::CredentialError::Missing(why)
                }
                wit_credentials::CredentialError::Unavailable(why) => {
                    crate::CredentialError::Unavailable(why)
                }
            })
    }

    fn connect(
        &mut self,
        pod: &str,
        port: &str,
    ) -> Result<crate::session::Session, crate::ExchangeError> {
        let connection = wit_exchange::Connection::open(pod, port).map_err(exchange_error)?;
        Ok(crate::session::Session::new(
            pod,
            port,
            Box::new(HostConnection(connection)),
        ))
    }
}

/// A session's transport over the host's `exchange.connection` resource; dropping it closes
/// the connection.
struct HostConnection(wit_exchange::Connection);

impl crate::session::Connection for HostConnection {
    fn send(&mut self, bytes: &[u8]) -> Result<(), crate::ExchangeError> {
        self.0.send(bytes).map_err(exchange_error)
    }

    fn receive(
        &mut self,
        max_bytes: u32,
        timeout_ms: u32,
    ) -> Result<Vec<u8>, crate::ExchangeError> {
        self.0
            .receive(max_bytes, timeout_ms)
            .map_err(exchange_error)
    }
}

fn exchange_error(error: wit_exchange::ExchangeError) -> crate::ExchangeError {
    match error {
        wit_exchange::ExchangeError::Refused(why) => crate::ExchangeError::Refused(why),
        wit_exchange::ExchangeError::Unreachable(why) => crate::ExchangeError::Unreachable(why),
        wit_exchange::ExchangeError::Timeout => crate::ExchangeError::Timeout,
        wit_exchange::ExchangeError::Closed => crate::ExchangeError::Closed,
    }
}

/// Writes one line into the host's log.
pub(crate) fn log(level: crate::log::Level, message: &str, fields: &[(&str, &str)]) {
    let level = match level {
        crate::log::Level::Trace => wit_log::Level::Trace,
        crate::log::Level::Debug => wit_log::Level::Debug,
        crate::log::Level::Info => wit_log::Level::Info,
        crate::log::Level::Warn => wit_log::Level::Warn,
        crate::log::Level::Error => wit_log::Level::Error,
    };
    let fields: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    wit_log::log(level, message, &fields);
}

fn kind_to_wit(kind: contract::KindRef) -> wit::KindRef {
    wit::KindRef {
        group: kind.group,
        version: kind.version,
        kind: kind.kind,
        plural: kind.plural,
        namespaced: kind.namespaced,
    }
}

fn kind_from_wit(kind: wit::KindRef) -> contract::KindRef {
    contract::KindRef {
        group: kind.group,
        version: kind.version,
        kind: kind.kind,
        plural: kind.plural,
        namespaced: kind.namespaced,
    }
}

fn observation_from_wit(observation: wit::Observation) -> contract::Observation {
    contract::Observation {
        parent: observation.parent,
        children: observation
            .children
            .into_iter()
            .map(|c| contract::Child {
                kind: kind_from_wit(c.kind),
                object: c.object,
            })
            .collect(),
        now: contract::Timestamp {
            seconds: observation.now.seconds,
            nanoseconds: observation.now.nanoseconds,
        },
    }
}

fn action_to_wit(action: contract::Action) -> wit::Action {
    match action {
        contract::Action::Apply(object) => wit::Action::Apply(object.to_string()),
        contract::Action::Delete { kind, name } => wit::Action::Delete(wit::ObjectRef {
            kind: kind_to_wit(kind),
            name,
        }),
        contract::Action::SetStatus(status) => wit::Action::SetStatus(status.to_string()),
        contract::Action::RecordEvent(event) => wit::Action::RecordEvent(wit::Event {
            event_type: match event.event_type {
                contract::EventType::Normal => wit::EventType::Normal,
                contract::EventType::Warning => wit::EventType::Warning,
            },
            reason: event.reason,
            message: event.message,
        }),
    }
}

fn error_to_wit(error: contract::PolicyError) -> wit::PolicyError {
    wit::PolicyError {
        reason: error.reason,
        message: error.message,
    }
}

impl<P: Plugin> Guest for Exported<P> {
    fn describe() -> wit::PolicyInfo {
        // The host refuses a bad declaration by failing the load, saying why: nothing to
        // handle here.
        for metric in P::metrics() {
            let _ = wit_metrics::declare(&wit_metrics::Metric {
                name: metric.name().to_owned(),
                kind: match metric {
                    crate::metrics::Metric::Gauge(_) => wit_metrics::MetricKind::Gauge,
                    crate::metrics::Metric::Counter(_) => wit_metrics::MetricKind::Counter,
                },
                help: metric.help().to_owned(),
                labels: metric.labels().iter().map(|l| (*l).to_owned()).collect(),
            });
        }
        let info = P::describe();
        wit::PolicyInfo {
            name: info.name,
            version: info.version,
            target: kind_to_wit(info.target),
            children: info.children.into_iter().map(kind_to_wit).collect(),
            capabilities: info
                .capabilities
                .into_iter()
                .map(|c| match c {
                    contract::Capability::AppCall(port) => wit::Capability::AppCall(port),
                    contract::Capability::Exchange(port) => wit::Capability::Exchange(port),
                })
                .collect(),
            wants_finalizer: info.wants_finalizer,
        }
    }

    fn reconcile(observation: wit::Observation) -> Result<wit::Decision, wit::PolicyError> {
        let decision = P::reconcile(&observation_from_wit(observation), &mut HostAppCall)
            .map_err(error_to_wit)?;
        // A refused sample is dropped and counted by the host; the decision stands.
        for sample in &decision.metrics {
            let _ = match sample.value {
                crate::metrics::SampleValue::Gauge(value) => {
                    wit_metrics::set_gauge(&sample.name, &sample.labels, value)
                }
                crate::metrics::SampleValue::Counter(delta) => {
                    wit_metrics::add_counter(&sample.name, &sample.labels, delta)
                }
            };
        }
        Ok(wit::Decision {
            actions: decision.actions.into_iter().map(action_to_wit).collect(),
            requeue_after_ms: decision.requeue_after_ms,
        })
    }

    fn finalize(observation: wit::Observation) -> Result<wit::FinalizeDecision, wit::PolicyError> {
        let decision = P::finalize(&observation_from_wit(observation), &mut HostAppCall)
            .map_err(error_to_wit)?;
        Ok(wit::FinalizeDecision {
            actions: decision.actions.into_iter().map(action_to_wit).collect(),
            done: decision.done,
            requeue_after_ms: decision.requeue_after_ms,
        })
    }
}
