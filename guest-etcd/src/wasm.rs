//! The WebAssembly glue: the WIT bindings, conversions between the generated types and
//! [`crate::protocol`], and an [`EtcdApi`](crate::etcd_api::EtcdApi) whose transport is
//! the host's `app-call` import. No decision is made here.

// The generated bindings are `unsafe` FFI (canonical ABI lifting/lowering), which is how a
// component exports functions; it is sound as long as the bindings match the WIT world,
// which wit-bindgen guarantees by generating both from `wit/policy.wit`.
#![allow(unsafe_code)]

wit_bindgen::generate!({
    path: "../wit",
    world: "policy-plugin",
});

use exports::policy_host::policy::policy::Guest;
use policy_host::policy::app_call;
use policy_host::policy::log::{self, Level};
use policy_host::policy::types as wit;

use crate::etcd_api::GatewayEtcdApi;
use crate::protocol::{self, AppCallError, AppCallRequest, AppCallResponse};

/// The exported plugin.
struct EtcdPlugin;

export!(EtcdPlugin);

fn kind_to_wit(kind: protocol::KindRef) -> wit::KindRef {
    wit::KindRef {
        group: kind.group,
        version: kind.version,
        kind: kind.kind,
        plural: kind.plural,
        namespaced: kind.namespaced,
    }
}

fn kind_from_wit(kind: wit::KindRef) -> protocol::KindRef {
    protocol::KindRef {
        group: kind.group,
        version: kind.version,
        kind: kind.kind,
        plural: kind.plural,
        namespaced: kind.namespaced,
    }
}

fn observation_from_wit(observation: wit::Observation) -> protocol::Observation {
    protocol::Observation {
        parent: observation.parent,
        children: observation
            .children
            .into_iter()
            .map(|c| protocol::Child {
                kind: kind_from_wit(c.kind),
                object: c.object,
            })
            .collect(),
        now: protocol::Timestamp {
            seconds: observation.now.seconds,
            nanoseconds: observation.now.nanoseconds,
        },
    }
}

fn action_to_wit(action: protocol::Action) -> wit::Action {
    match action {
        protocol::Action::Apply(object) => wit::Action::Apply(object.to_string()),
        protocol::Action::Delete { kind, name } => wit::Action::Delete(wit::ObjectRef {
            kind: kind_to_wit(kind),
            name,
        }),
        protocol::Action::SetStatus(status) => wit::Action::SetStatus(status.to_string()),
        protocol::Action::RecordEvent(event) => wit::Action::RecordEvent(wit::Event {
            event_type: match event.event_type {
                protocol::EventType::Normal => wit::EventType::Normal,
                protocol::EventType::Warning => wit::EventType::Warning,
            },
            reason: event.reason,
            message: event.message,
        }),
    }
}

fn error_to_wit(error: protocol::PolicyError) -> wit::PolicyError {
    wit::PolicyError {
        reason: error.reason,
        message: error.message,
    }
}

/// Sends one request through the host, logging failures (the decision only sees that the
/// member did not answer).
fn send(request: &AppCallRequest) -> Result<AppCallResponse, AppCallError> {
    let wit_request = app_call::Request {
        pod: request.pod.clone(),
        port: request.port.clone(),
        method: match request.method {
            protocol::Method::Get => app_call::Method::Get,
            protocol::Method::Post => app_call::Method::Post,
            protocol::Method::Put => app_call::Method::Put,
            protocol::Method::Delete => app_call::Method::Delete,
        },
        path: request.path.clone(),
        body: request.body.clone(),
    };
    let result = app_call::call(&wit_request)
        .map(|r| AppCallResponse {
            status: r.status,
            body: r.body,
        })
        .map_err(|e| match e {
            app_call::CallError::Refused(why) => AppCallError::Refused(why),
            app_call::CallError::Unreachable(why) => AppCallError::Unreachable(why),
            app_call::CallError::Timeout => AppCallError::Timeout,
        });
    match &result {
        Ok(response) if !(200..300).contains(&response.status) => log::log(
            Level::Info,
            "etcd refused a request",
            &[
                ("pod".into(), request.pod.clone()),
                ("path".into(), request.path.clone()),
                ("status".into(), response.status.to_string()),
                ("body".into(), response.body.chars().take(300).collect()),
            ],
        ),
        Err(e) => log::log(
            Level::Debug,
            "etcd member did not answer",
            &[
                ("pod".into(), request.pod.clone()),
                ("path".into(), request.path.clone()),
                ("error".into(), e.to_string()),
            ],
        ),
        Ok(_) => {}
    }
    result
}

fn summarize(actions: &[protocol::Action]) -> String {
    actions
        .iter()
        .map(|a| match a {
            protocol::Action::Apply(o) => format!(
                "apply {}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            ),
            protocol::Action::Delete { kind, name } => format!("delete {}/{name}", kind.kind),
            protocol::Action::SetStatus(_) => "status".to_owned(),
            protocol::Action::RecordEvent(e) => format!("event {}", e.reason),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl Guest for EtcdPlugin {
    fn describe() -> wit::PolicyInfo {
        let info = crate::policy_info();
        wit::PolicyInfo {
            name: info.name,
            version: info.version,
            target: kind_to_wit(info.target),
            children: info.children.into_iter().map(kind_to_wit).collect(),
            capabilities: info
                .capabilities
                .into_iter()
                .map(|c| match c {
                    protocol::Capability::AppCall(port) => wit::Capability::AppCall(port),
                })
                .collect(),
            wants_finalizer: info.wants_finalizer,
        }
    }

    fn reconcile(observation: wit::Observation) -> Result<wit::Decision, wit::PolicyError> {
        let observation = observation_from_wit(observation);
        let mut etcd = GatewayEtcdApi::new(send);
        let decision =
            crate::reconcile::reconcile(&observation, &mut etcd).map_err(error_to_wit)?;
        log::log(
            Level::Debug,
            "decided",
            &[
                ("actions".into(), summarize(&decision.actions)),
                (
                    "requeue_ms".into(),
                    decision
                        .requeue_after_ms
                        .map(|ms| ms.to_string())
                        .unwrap_or_default(),
                ),
            ],
        );
        Ok(wit::Decision {
            actions: decision.actions.into_iter().map(action_to_wit).collect(),
            requeue_after_ms: decision.requeue_after_ms,
        })
    }

    fn finalize(observation: wit::Observation) -> Result<wit::FinalizeDecision, wit::PolicyError> {
        let observation = observation_from_wit(observation);
        let mut etcd = GatewayEtcdApi::new(send);
        let decision = crate::reconcile::finalize(&observation, &mut etcd).map_err(error_to_wit)?;
        Ok(wit::FinalizeDecision {
            actions: decision.actions.into_iter().map(action_to_wit).collect(),
            done: decision.done,
            requeue_after_ms: decision.requeue_after_ms,
        })
    }
}
