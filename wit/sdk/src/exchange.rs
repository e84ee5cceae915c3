//! The exchange client: raw request/response bytes over TCP with a granted port of a pod the
//! parent owns, for apps whose admin protocol is not HTTP (Redis' RESP, a line protocol, ...).
//!
//! The plugin speaks the protocol: it hands over the request bytes and a function that says
//! when the bytes read so far are a whole reply; the SDK sends, then reads until that function
//! agrees (or the app closes the connection, or nothing arrives within the timeout). The host
//! bounds every exchange (the plugin's output limit, the app-call timeout, the decision's
//! deadline) and checks the pod and port exactly as for app-calls. Ask for it with
//! [`Capability::Exchange`](crate::Capability::Exchange) in `describe`.
//!
//! Decision logic reaches it through [`AppCall::exchange`](crate::AppCall::exchange), so the
//! same `&mut dyn AppCall` serves both doors and a test fake can answer both.

/// Why an exchange got no (whole) reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExchangeError {
    /// The host refused (pod not owned, port not granted, over a limit, no exchanges here).
    Refused(String),
    /// The pod could not be reached (no IP yet, connection refused, reset, ...).
    Unreachable(String),
    /// Nothing (more) arrived within the timeout.
    Timeout,
    /// The app closed the connection before the reply was complete.
    Closed,
}

impl std::fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExchangeError::Refused(why) => write!(f, "refused: {why}"),
            ExchangeError::Unreachable(why) => write!(f, "unreachable: {why}"),
            ExchangeError::Timeout => f.write_str("timed out"),
            ExchangeError::Closed => f.write_str("the app closed the connection"),
        }
    }
}

impl std::error::Error for ExchangeError {}

/// One request/reply exchange.
#[derive(Clone, Copy)]
pub struct ExchangeRequest<'a> {
    /// A Pod child of the parent.
    pub pod: &'a str,
    /// Container port name or number, as granted.
    pub port: &'a str,
    /// The request, as the app's protocol writes it.
    pub request: &'a [u8],
    /// True once the bytes read so far are a whole reply.
    pub reply_complete: &'a dyn Fn(&[u8]) -> bool,
    /// How long to wait for each chunk of the reply, in milliseconds (the host caps it at its
    /// app-call timeout, 5 s).
    pub timeout_ms: u32,
}

impl std::fmt::Debug for ExchangeRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangeRequest")
            .field("pod", &self.pod)
            .field("port", &self.port)
            .field("request", &String::from_utf8_lossy(self.request))
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// Default wait per chunk of a reply.
pub const DEFAULT_TIMEOUT_MS: u32 = 2_000;
