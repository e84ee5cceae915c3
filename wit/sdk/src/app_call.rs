//! The app-call client: the one way a plugin reaches its app (HTTP/JSON to a granted port
//! of a pod its parent owns). Decision logic takes `&mut dyn AppCall`, so it runs against
//! the host's import in wasm and against [`ScriptedAppCall`](crate::testing::ScriptedAppCall)
//! in native tests.

use crate::contract::{AppCallError, AppCallRequest, AppCallResponse, Method};
use crate::credentials::{Credential, CredentialError};
use crate::exchange::{ExchangeError, ExchangeRequest};
use crate::session::Session;

/// Sends app-calls. In wasm the SDK passes its implementation over the host import to
/// [`Plugin::reconcile`](crate::Plugin::reconcile); tests pass a fake.
pub trait AppCall {
    /// Sends one request and waits for the response (any status code is a response).
    fn call(&mut self, request: &AppCallRequest) -> Result<AppCallResponse, AppCallError>;

    /// Opens a [`Session`] with a granted port of a pod: one connection for a conversation
    /// of several sends and receives (see [`crate::session`]). Clients without a way to reach
    /// TCP ports (the default) refuse.
    fn connect(&mut self, pod: &str, port: &str) -> Result<Session, ExchangeError> {
        Err(ExchangeError::Refused(format!(
            "this app client cannot open a session with pod `{pod}` port `{port}`"
        )))
    }

    /// The value of `key` in the Secret `secret` of the parent's namespace, if the admin
    /// granted it (see [`crate::credentials`]). Clients without credentials (the default)
    /// refuse.
    fn credential(&mut self, secret: &str, key: &str) -> Result<Credential, CredentialError> {
        Err(CredentialError::Refused(format!(
            "this app client holds no credentials (Secret `{secret}` key `{key}`)"
        )))
    }

    /// Sends raw bytes to a granted port of a pod over a fresh [`Session`] and reads until
    /// `reply_complete` says the reply is whole (see [`crate::exchange`]); returns the reply's
    /// bytes.
    fn exchange(&mut self, request: &ExchangeRequest<'_>) -> Result<Vec<u8>, ExchangeError> {
        let mut session = self
            .connect(request.pod, request.port)?
            .with_timeout_ms(request.timeout_ms);
        session.request(request.request, |reply| {
            (request.reply_complete)(reply).then_some(reply.len())
        })
    }

    /// `GET path` on `pod`:`port`.
    fn get(&mut self, pod: &str, port: &str, path: &str) -> Result<AppCallResponse, AppCallError> {
        self.call(&AppCallRequest {
            pod: pod.to_owned(),
            port: port.to_owned(),
            method: Method::Get,
            path: path.to_owned(),
            body: None,
            tls: None,
        })
    }

    /// `POST path` on `pod`:`port` with a JSON body.
    fn post(
        &mut self,
        pod: &str,
        port: &str,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<AppCallResponse, AppCallError> {
        self.call(&AppCallRequest {
            pod: pod.to_owned(),
            port: port.to_owned(),
            method: Method::Post,
            path: path.to_owned(),
            body: Some(body.to_string()),
            tls: None,
        })
    }
}

impl AppCallResponse {
    /// True for a 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body parsed as JSON `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.body)
    }
}
