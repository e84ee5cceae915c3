//! A plugin that holds one session with a toy protocol shaped like MySQL's, so the SDK's
//! sessions are proven natively (against the SDK's fake) and in the host's sandbox (against a
//! real TCP server): the server speaks first, the client authenticates with a proof of the
//! server's salt, then sends two queries on the same connection.
//!
//! The protocol, per line (`\n`-terminated) unless said otherwise:
//! - server: `TOY 1 <salt>` (the greeting);
//! - client: `AUTH <proof>`, where `<proof>` is [`proof`] of the salt and the token;
//!   server: `OK` or `ERR <why>`;
//! - client: `GET <key>`; server: `=<n>` then exactly `n` bytes (no newline): a frame that a
//!   line check alone cannot cut, as a MySQL result set is several packets.
//!
//! The parent (`Probe`, `test.policy-host.io/v1`) names the token in `spec.token` and the number
//! of pods in `spec.replicas` (default 1); the pods are `<name>-0`, `<name>-1`, ..., port
//! `admin`. The plugin opens a session with every pod before it speaks on any (several at
//! once), and its status carries, per pod, what the queries answered or the error.

use policy_host_sdk::prelude::*;
use policy_host_sdk::{ExchangeError, Session};
use serde_json::json;

/// The port the plugin asks for.
pub const PORT: &str = "admin";

/// The parent kind.
pub fn target_kind() -> KindRef {
    KindRef::namespaced("test.policy-host.io", "v1", "Probe", "probes")
}

/// The client's proof of `salt` and `token` (FNV-1a, hex): toy, never a real hash.
pub fn proof(salt: &str, token: &str) -> String {
    let hash = format!("{salt}:{token}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{hash:016x}")
}

/// Frame check of a `GET` reply: `=<n>\n` and then `n` bytes.
pub fn value_frame(bytes: &[u8]) -> Option<usize> {
    let header = frames::line(bytes)?;
    let length: usize = std::str::from_utf8(bytes.get(1..header - 1)?)
        .ok()?
        .parse()
        .ok()?;
    let whole = header + length;
    (bytes.len() >= whole).then_some(whole)
}

/// What the session learnt.
#[derive(Debug, PartialEq, Eq)]
pub struct Answers {
    /// The server's answer to `GET role`.
    pub role: String,
    /// The server's answer to `GET version`.
    pub version: String,
}

/// Greeting, authentication, two queries, on one session.
pub fn converse(session: &mut Session, token: &str) -> Result<Answers, String> {
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).trim_end().to_owned();
    let failed = |what: &str, e: ExchangeError| format!("{what}: {e}");
    let greeting = text(
        session
            .receive_frame(frames::line)
            .map_err(|e| failed("greeting", e))?,
    );
    let salt = greeting
        .strip_prefix("TOY 1 ")
        .ok_or_else(|| format!("greeting: not a toy server: `{greeting}`"))?;
    let auth = text(
        session
            .request(
                format!("AUTH {}\n", proof(salt, token)).as_bytes(),
                frames::line,
            )
            .map_err(|e| failed("auth", e))?,
    );
    if auth != "OK" {
        return Err(format!("auth: the server said `{auth}`"));
    }
    let mut get = |key: &str| -> Result<String, String> {
        let frame = session
            .request(format!("GET {key}\n").as_bytes(), value_frame)
            .map_err(|e| failed(key, e))?;
        let header = frames::line(&frame).unwrap_or(0);
        Ok(String::from_utf8_lossy(&frame[header..]).into_owned())
    };
    Ok(Answers {
        role: get("role")?,
        version: get("version")?,
    })
}

/// The plugin.
pub struct SessionToy;

policy_host_sdk::export_plugin!(SessionToy);

impl Plugin for SessionToy {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "session-toy".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            target: target_kind(),
            children: vec![children::pod_kind()],
            capabilities: vec![Capability::Exchange(PORT.to_owned())],
            wants_finalizer: false,
        }
    }

    fn reconcile(
        observation: &Observation,
        app: &mut dyn AppCall,
    ) -> Result<Decision, PolicyError> {
        let parent = observation.parent_json()?;
        let name = observation.parent_name()?;
        let token = parent["spec"]["token"].as_str().unwrap_or_default();
        let replicas = parent["spec"]["replicas"].as_u64().unwrap_or(1).min(8);
        let opened: Vec<(String, Result<Session, String>)> = (0..replicas)
            .map(|ordinal| {
                let pod = format!("{name}-{ordinal}");
                let session = app.connect(&pod, PORT).map_err(|e| format!("connect: {e}"));
                (pod, session)
            })
            .collect();
        let mut status = serde_json::Map::new();
        for (pod, session) in opened {
            let answer = match session.and_then(|mut s| converse(&mut s, token)) {
                Ok(answers) => json!({ "role": answers.role, "version": answers.version }),
                Err(error) => json!({ "error": error }),
            };
            status.insert(pod, answer);
        }
        Ok(Decision::nothing().with(Action::SetStatus(status.into())))
    }
}

#[cfg(test)]
mod tests {
    use policy_host_sdk::testing::{Harness, ScriptedAppCall, SessionRound, observation};

    use super::*;

    fn probe(replicas: u64) -> Observation {
        observation(json!({
            "apiVersion": "test.policy-host.io/v1",
            "kind": "Probe",
            "metadata": { "name": "toy", "namespace": "default" },
            "spec": { "token": "s3cret", "replicas": replicas },
        }))
        .build()
    }

    fn server(app: ScriptedAppCall, pod: &str, auth_reply: &str, role: &str) -> ScriptedAppCall {
        app.greets(pod, PORT, "TOY 1 4242\n")
            .answers(
                pod,
                PORT,
                format!("AUTH {}\n", proof("4242", "s3cret")),
                auth_reply,
            )
            .answers(pod, PORT, "GET role\n", format!("={}\n{role}", role.len()))
            // A reply in one frame whose bytes hold a newline: only the length cuts it.
            .answers(pod, PORT, "GET version\n", "=6\n1.2\n.3")
    }

    #[test]
    fn conversations_through_the_fake() {
        let primary = json!({ "role": "primary", "version": "1.2\n.3" });
        // (situation, pods, app, status expected)
        let rows = [
            (
                "greeting, authentication and two queries on one session",
                1,
                server(ScriptedAppCall::new(), "toy-0", "OK\n", "primary"),
                json!({ "toy-0": primary }),
            ),
            (
                "two sessions open at once, each its own conversation",
                2,
                server(
                    server(ScriptedAppCall::new(), "toy-0", "OK\n", "primary"),
                    "toy-1",
                    "OK\n",
                    "replica",
                ),
                json!({ "toy-0": primary, "toy-1": { "role": "replica", "version": "1.2\n.3" } }),
            ),
            (
                "a refused authentication stops before any query",
                1,
                server(
                    ScriptedAppCall::new(),
                    "toy-0",
                    "ERR bad proof\n",
                    "primary",
                ),
                json!({ "toy-0": { "error": "auth: the server said `ERR bad proof`" } }),
            ),
            (
                "a server that closes after its greeting",
                1,
                ScriptedAppCall::new()
                    .greets("toy-0", PORT, "TOY 1 4242\n")
                    .rounds([SessionRound::failing(
                        "toy-0",
                        PORT,
                        format!("AUTH {}\n", proof("4242", "s3cret")),
                        ExchangeError::Closed,
                    )]),
                json!({ "toy-0": { "error": "auth: the app closed the connection" } }),
            ),
            (
                "no server at all",
                1,
                ScriptedAppCall::new(),
                json!({ "toy-0": { "error": "connect: unreachable: no scripted session with pod `toy-0` port `admin`" } }),
            ),
        ];
        for (situation, pods, app, expected) in rows {
            let mut harness = Harness::<SessionToy>::with_app(app);
            let decision = harness
                .reconcile(&probe(pods))
                .unwrap_or_else(|e| panic!("{situation}: refused: {e}"));
            assert_eq!(decision.status(), Some(&expected), "{situation}");
        }
    }

    #[test]
    fn every_round_is_in_the_fakes_log_in_order() {
        let app = server(ScriptedAppCall::new(), "toy-0", "OK\n", "primary");
        let mut harness = Harness::<SessionToy>::with_app(app);
        harness.reconcile(&probe(1)).expect("decides");
        let sent: Vec<String> = harness
            .app
            .session_log()
            .iter()
            .map(|r| String::from_utf8_lossy(&r.request).into_owned())
            .collect();
        assert_eq!(
            sent,
            [
                String::new(),
                format!("AUTH {}\n", proof("4242", "s3cret")),
                "GET role\n".to_owned(),
                "GET version\n".to_owned()
            ]
        );
    }

    /// The responder file the host's simulate test reads too (`host/tests/sessions.rs`).
    #[test]
    fn the_responder_file_of_simulate_drives_the_fake() {
        let app = ScriptedAppCall::from_responses(include_str!("../responses.json"))
            .expect("the responder file parses");
        let mut harness = Harness::<SessionToy>::with_app(app);
        let decision = harness.reconcile(&probe(1)).expect("decides");
        assert_eq!(
            decision.status(),
            Some(&json!({ "toy-0": { "role": "replica", "version": "9.9" } }))
        );
    }
}
