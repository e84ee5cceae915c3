//! The previous contract, `policy-host:policy@0.1.0`, served beside the current one: bindings
//! generated from its frozen WIT (`wit/frozen/0.1.0/`) and conversions to and from the current
//! types at the boundary, so everything past `decide` sees one set of types.
//!
//! Why a second set of bindings rather than one linker entry: the component model treats
//! `0.1` and `0.2` as incompatible packages (wasmtime links `@0.1.x` imports only to `@0.1.y`
//! definitions), and 0.2 changed a type that `describe` returns (`capability` gained a case),
//! so a 0.1 plugin does not type-check against 0.2 bindings. A plugin is bound by the version
//! of the `policy` interface it exports ([`exports_v0_1`]).

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::contract as current;

/// The bindings generated from the frozen 0.1.0 WIT; that file is their documentation.
#[allow(missing_docs)]
mod generated {
    wasmtime::component::bindgen!({
        path: "../wit/frozen/0.1.0",
        world: "policy-plugin",
        imports: { default: async },
        exports: { default: async },
    });
}

pub use generated::*;

use generated::exports::policy_host::policy::policy::PolicyError;
use generated::policy_host::policy::app_call;
use generated::policy_host::policy::types as old;

/// The version these bindings serve.
pub const VERSION: &str = "0.1.0";

/// True when `component` exports the `policy` interface of contract 0.1.x.
pub fn exports_v0_1(engine: &Engine, component: &Component) -> bool {
    component
        .component_type()
        .exports(engine)
        .any(|(name, _)| name.starts_with("policy-host:policy/policy@0.1."))
}

fn kind_from_old(kind: old::KindRef) -> current::KindRef {
    current::KindRef {
        group: kind.group,
        version: kind.version,
        kind: kind.kind,
        plural: kind.plural,
        namespaced: kind.namespaced,
    }
}

fn kind_to_old(kind: &current::KindRef) -> old::KindRef {
    old::KindRef {
        group: kind.group.clone(),
        version: kind.version.clone(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
        namespaced: kind.namespaced,
    }
}

/// A 0.1 self-description in current types.
pub fn policy_info_from_old(info: old::PolicyInfo) -> current::PolicyInfo {
    current::PolicyInfo {
        name: info.name,
        version: info.version,
        target: kind_from_old(info.target),
        children: info.children.into_iter().map(kind_from_old).collect(),
        capabilities: info
            .capabilities
            .into_iter()
            .map(|c| match c {
                old::Capability::AppCall(port) => current::Capability::AppCall(port),
            })
            .collect(),
        wants_finalizer: info.wants_finalizer,
    }
}

/// An observation in 0.1 types (a copy: the two sets of bindings share no Rust type).
pub fn observation_to_old(observation: &current::Observation) -> old::Observation {
    old::Observation {
        parent: observation.parent.clone(),
        children: observation
            .children
            .iter()
            .map(|c| old::Child {
                kind: kind_to_old(&c.kind),
                object: c.object.clone(),
            })
            .collect(),
        now: old::Timestamp {
            seconds: observation.now.seconds,
            nanoseconds: observation.now.nanoseconds,
        },
    }
}

fn action_from_old(action: old::Action) -> current::Action {
    match action {
        old::Action::Apply(json) => current::Action::Apply(json),
        old::Action::Delete(target) => current::Action::Delete(current::ObjectRef {
            kind: kind_from_old(target.kind),
            name: target.name,
        }),
        old::Action::SetStatus(json) => current::Action::SetStatus(json),
        old::Action::RecordEvent(event) => current::Action::RecordEvent(current::Event {
            event_type: match event.event_type {
                old::EventType::Normal => current::EventType::Normal,
                old::EventType::Warning => current::EventType::Warning,
            },
            reason: event.reason,
            message: event.message,
        }),
    }
}

fn error_from_old(error: PolicyError) -> current::PolicyError {
    current::PolicyError {
        reason: error.reason,
        message: error.message,
    }
}

/// A 0.1 reconcile answer in current types.
pub fn decision_from_old(
    outcome: Result<old::Decision, PolicyError>,
) -> Result<current::Decision, current::PolicyError> {
    outcome
        .map(|d| current::Decision {
            actions: d.actions.into_iter().map(action_from_old).collect(),
            requeue_after_ms: d.requeue_after_ms,
        })
        .map_err(error_from_old)
}

/// A 0.1 finalize answer in current types.
pub fn finalize_decision_from_old(
    outcome: Result<old::FinalizeDecision, PolicyError>,
) -> Result<current::FinalizeDecision, current::PolicyError> {
    outcome
        .map(|d| current::FinalizeDecision {
            actions: d.actions.into_iter().map(action_from_old).collect(),
            done: d.done,
            requeue_after_ms: d.requeue_after_ms,
        })
        .map_err(error_from_old)
}

/// A 0.1 log level in current types.
pub fn level_from_old(level: generated::policy_host::policy::log::Level) -> current::LogLevel {
    use generated::policy_host::policy::log::Level;
    match level {
        Level::Trace => current::LogLevel::Trace,
        Level::Debug => current::LogLevel::Debug,
        Level::Info => current::LogLevel::Info,
        Level::Warn => current::LogLevel::Warn,
        Level::Error => current::LogLevel::Error,
    }
}

/// A 0.1 app-call request in current types.
pub fn request_from_old(request: app_call::Request) -> current::app_call::Request {
    use current::app_call::Method as New;
    current::app_call::Request {
        pod: request.pod,
        port: request.port,
        method: match request.method {
            app_call::Method::Get => New::Get,
            app_call::Method::Post => New::Post,
            app_call::Method::Put => New::Put,
            app_call::Method::Delete => New::Delete,
        },
        path: request.path,
        body: request.body,
    }
}

/// A current app-call answer in 0.1 types.
pub fn answer_to_old(
    answer: Result<current::app_call::Response, current::app_call::CallError>,
) -> Result<app_call::Response, app_call::CallError> {
    use current::app_call::CallError as New;
    answer
        .map(|r| app_call::Response {
            status: r.status,
            body: r.body,
        })
        .map_err(|e| match e {
            New::Refused(why) => app_call::CallError::Refused(why),
            New::Unreachable(why) => app_call::CallError::Unreachable(why),
            New::Timeout => app_call::CallError::Timeout,
        })
}
