//! The second door out of the sandbox: raw request/response exchanges over TCP with a granted
//! port of a Pod the parent controls, for apps whose admin protocol is not HTTP.
//!
//! The host moves bytes and knows no protocol: the plugin sends a request and reads until its
//! own parser says the reply is complete. Reach is checked by the same scope as app-calls
//! ([`AppCallScope::authorize_exchange`]: an owned Pod, a port granted for exchanges), so a plugin reaches
//! nothing it could not already call over HTTP. What bounds it:
//! - bytes: everything one decision sends and receives over all its connections counts
//!   against the plugin's output limit;
//! - time: one connect or one receive waits at most [`APP_CALL_TIMEOUT`], and the whole decision
//!   runs under its deadline;
//! - count: at most [`MAX_OPEN_CONNECTIONS`] open at once and [`MAX_OPENS_PER_DECISION`] in
//!   all per instance;
//! - lifetime: a [`Connection`] lives in the instance's [`Connections`] (inside its
//!   [`Doors`]), so dropping the store (the instance ends, traps or runs out of time) closes
//!   whatever the plugin left open.
//!
//! Without a network (a scripted scope: `simulate`, shadow mode, benchmarks) each *round* (the
//! bytes sent before the plugin reads, and the reply) is answered from the [`AppCallScript`];
//! a live scope with a recorder writes each round down, so a replay answers the same rounds.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wasmtime::component::Resource;

use super::Doors;
use super::http::APP_CALL_TIMEOUT;
use super::replay::{AppCallRecorder, AppCallScript, ExchangeRound};
use super::scope::{AppCallScope, ExchangeRoute};
use crate::contract::app_call::CallError;
use crate::contract::exchange::{self as wit, ExchangeError};

/// Connections one instance may have open at once.
pub const MAX_OPEN_CONNECTIONS: usize = 16;

/// Connections one instance (one decision) may open in all (review #5's churn).
pub const MAX_OPENS_PER_DECISION: usize = 64;

/// Largest single `receive` the host serves, whatever `max-bytes` asks (a read buffer is
/// allocated at this size at most).
pub const MAX_RECEIVE_CHUNK: usize = 1 << 20;

/// An open exchange with one port of one Pod: the host side of the WIT `connection` resource,
/// whose handle the plugin holds ([`Connections`] maps it here).
pub struct Connection {
    pod: String,
    port: String,
    transport: Transport,
    /// Bytes sent in the current round.
    request: Vec<u8>,
    /// Bytes received in the current round.
    reply: Vec<u8>,
    /// Bytes received over the whole connection, against the output limit.
    received_total: usize,
    output_limit: usize,
}

enum Transport {
    Live {
        stream: TcpStream,
        recorder: Option<AppCallRecorder>,
    },
    Scripted {
        script: AppCallScript,
        /// The scripted reply of the current round, not yet read by the plugin.
        pending: Option<VecDeque<u8>>,
    },
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("pod", &self.pod)
            .field("port", &self.port)
            .field("received_total", &self.received_total)
            .finish()
    }
}

fn from_call_error(error: CallError) -> ExchangeError {
    match error {
        CallError::Refused(why) => ExchangeError::Refused(why),
        CallError::Unreachable(why) => ExchangeError::Unreachable(why),
        CallError::Timeout => ExchangeError::Timeout,
    }
}

impl Connection {
    /// Opens a connection in `scope` (checked like an app-call), or says why not.
    pub async fn open(
        scope: &AppCallScope,
        pod: String,
        port: String,
        output_limit: usize,
    ) -> Result<Connection, ExchangeError> {
        let transport = match scope.exchange_route() {
            ExchangeRoute::Refused => {
                return Err(ExchangeError::Refused(
                    "exchanges are not available here (a plugin describing itself reaches nothing)"
                        .to_owned(),
                ));
            }
            ExchangeRoute::Scripted(script) => Transport::Scripted {
                script: script.clone(),
                pending: None,
            },
            ExchangeRoute::Live(recorder) => {
                let connected = Self::connect(scope, &pod, &port).await;
                match connected {
                    Ok(stream) => Transport::Live {
                        stream,
                        recorder: recorder.cloned(),
                    },
                    Err(error) => {
                        if let Some(recorder) = recorder {
                            recorder.record_exchange(ExchangeRound {
                                pod: pod.clone(),
                                port: Some(port.clone()),
                                request: Vec::new(),
                                reply: Err(error.clone()),
                            });
                        }
                        return Err(error);
                    }
                }
            }
        };
        Ok(Connection {
            pod,
            port,
            transport,
            request: Vec::new(),
            reply: Vec::new(),
            received_total: 0,
            output_limit,
        })
    }

    async fn connect(
        scope: &AppCallScope,
        pod: &str,
        port: &str,
    ) -> Result<TcpStream, ExchangeError> {
        let (host, number) = scope
            .authorize_exchange(pod, port)
            .map_err(from_call_error)?;
        let address = format!("{host}:{number}");
        match tokio::time::timeout(APP_CALL_TIMEOUT, TcpStream::connect(&address)).await {
            Err(_) => Err(ExchangeError::Timeout),
            Ok(Err(error)) => Err(ExchangeError::Unreachable(format!(
                "pod `{pod}` port `{port}` ({address}): {error}"
            ))),
            Ok(Ok(stream)) => {
                // Requests are small and a reply is awaited after each: no Nagle delay.
                let _ = stream.set_nodelay(true);
                Ok(stream)
            }
        }
    }

    /// Pod and port, for logs.
    pub fn target(&self) -> (&str, &str) {
        (&self.pod, &self.port)
    }

    /// Sends all of `bytes` (a send after a reply starts a new round).
    pub async fn send(&mut self, bytes: Vec<u8>) -> Result<(), ExchangeError> {
        if bytes.len() > self.output_limit {
            return Err(ExchangeError::Refused(format!(
                "a send of {} bytes is over the plugin's {} byte output limit",
                bytes.len(),
                self.output_limit
            )));
        }
        if !self.reply.is_empty() {
            self.finish_round(Ok(()));
        }
        if let Transport::Scripted { pending, .. } = &mut self.transport {
            *pending = None;
        }
        self.request.extend_from_slice(&bytes);
        if let Transport::Live { stream, .. } = &mut self.transport {
            let written = tokio::time::timeout(APP_CALL_TIMEOUT, stream.write_all(&bytes)).await;
            let outcome = match written {
                Err(_) => Err(ExchangeError::Timeout),
                Ok(Err(error)) => Err(ExchangeError::Unreachable(format!(
                    "pod `{}` port `{}`: sending: {error}",
                    self.pod, self.port
                ))),
                Ok(Ok(())) => Ok(()),
            };
            if let Err(error) = &outcome {
                self.finish_round(Err(error.clone()));
            }
            return outcome;
        }
        Ok(())
    }

    /// Waits up to `timeout` (capped at [`APP_CALL_TIMEOUT`]) for bytes: at least one, at most
    /// `max_bytes` and what is left of the output limit.
    pub async fn receive(
        &mut self,
        max_bytes: u32,
        timeout: Duration,
    ) -> Result<Vec<u8>, ExchangeError> {
        let left = self.output_limit.saturating_sub(self.received_total);
        if left == 0 {
            let error = ExchangeError::Refused(format!(
                "this connection received {} bytes, the plugin's output limit; open a new one or raise the limit",
                self.received_total
            ));
            self.finish_round(Err(error.clone()));
            return Err(error);
        }
        let wanted = (max_bytes as usize).clamp(1, MAX_RECEIVE_CHUNK).min(left);
        let timeout = timeout.min(APP_CALL_TIMEOUT);
        let outcome = match &mut self.transport {
            Transport::Live { stream, .. } => {
                let mut buffer = vec![0; wanted];
                match tokio::time::timeout(timeout, stream.read(&mut buffer)).await {
                    Err(_) => Err(ExchangeError::Timeout),
                    Ok(Err(error)) => Err(ExchangeError::Unreachable(format!(
                        "pod `{}` port `{}`: receiving: {error}",
                        self.pod, self.port
                    ))),
                    Ok(Ok(0)) => Err(ExchangeError::Closed),
                    Ok(Ok(n)) => {
                        buffer.truncate(n);
                        Ok(buffer)
                    }
                }
            }
            Transport::Scripted { script, pending } => {
                if pending.is_none() {
                    match script.answer_exchange(&self.pod, &self.port, &self.request) {
                        Ok(reply) => *pending = Some(reply.into()),
                        Err(error) => {
                            self.request.clear();
                            return Err(error);
                        }
                    }
                }
                match pending {
                    // Past the scripted reply the app says nothing more, as a live one would.
                    Some(bytes) if bytes.is_empty() => Err(ExchangeError::Timeout),
                    Some(bytes) => {
                        let n = wanted.min(bytes.len());
                        Ok(bytes.drain(..n).collect())
                    }
                    None => Err(ExchangeError::Timeout),
                }
            }
        };
        match &outcome {
            Ok(bytes) => {
                self.received_total += bytes.len();
                self.reply.extend_from_slice(bytes);
            }
            // A timeout mid-round is not the end of it: the plugin may wait again.
            Err(ExchangeError::Timeout) => {}
            Err(error) => self.finish_round(Err(error.clone())),
        }
        outcome
    }

    /// Ends the current round: a live, recorded connection writes it down.
    fn finish_round(&mut self, outcome: Result<(), ExchangeError>) {
        let request = std::mem::take(&mut self.request);
        let reply = std::mem::take(&mut self.reply);
        if request.is_empty() && reply.is_empty() && outcome.is_ok() {
            return;
        }
        if let Transport::Live {
            recorder: Some(recorder),
            ..
        } = &self.transport
        {
            recorder.record_exchange(ExchangeRound {
                pod: self.pod.clone(),
                port: Some(self.port.clone()),
                request,
                reply: outcome.map(|()| reply),
            });
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.finish_round(Ok(()));
    }
}

/// The connections one instance has open, keyed by the `rep()` of the handle the plugin holds.
///
/// The host's own table rather than wasmtime's resource table, so that the contract's
/// `connection` stays an opaque handle and the bindings need no host type (see
/// [`crate::contract`]).
#[derive(Debug, Default)]
pub struct Connections {
    open: HashMap<u32, Connection>,
    /// The next handle to try; handles of dropped connections are used again only after
    /// `u32::MAX` opens.
    next: u32,
}

impl Connections {
    /// Connections open now.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when none is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    fn insert(&mut self, connection: Connection) -> Resource<wit::Connection> {
        // At most MAX_OPEN_CONNECTIONS handles are taken, so a free one is near.
        while self.open.contains_key(&self.next) {
            self.next = self.next.wrapping_add(1);
        }
        let rep = self.next;
        self.next = self.next.wrapping_add(1);
        self.open.insert(rep, connection);
        Resource::new_own(rep)
    }

    fn get_mut(
        &mut self,
        connection: &Resource<wit::Connection>,
    ) -> Result<&mut Connection, ExchangeError> {
        self.open.get_mut(&connection.rep()).ok_or_else(|| {
            ExchangeError::Refused(format!(
                "no such connection: handle {} is not open",
                connection.rep()
            ))
        })
    }

    fn remove(&mut self, connection: &Resource<wit::Connection>) -> Option<Connection> {
        self.open.remove(&connection.rep())
    }
}

impl wit::Host for Doors {}

impl wit::HostConnection for Doors {
    async fn open(
        &mut self,
        pod: String,
        port: String,
    ) -> Result<Resource<wit::Connection>, ExchangeError> {
        if self.connections.len() >= MAX_OPEN_CONNECTIONS {
            return Err(ExchangeError::Refused(format!(
                "{MAX_OPEN_CONNECTIONS} connections are open already; drop one first"
            )));
        }
        if self.opened >= MAX_OPENS_PER_DECISION {
            return Err(ExchangeError::Refused(format!(
                "this decision opened {MAX_OPENS_PER_DECISION} connections already; keep one open and reuse it"
            )));
        }
        self.opened += 1;
        let connection = Connection::open(&self.scope, pod, port, self.output_limit)
            .await
            .inspect_err(|error| {
                if let ExchangeError::Refused(why) = error {
                    tracing::warn!(plugin = %self.label, parent = %self.scope.parent_label(), %why, "exchange refused");
                }
            })?;
        Ok(self.connections.insert(connection))
    }

    async fn send(
        &mut self,
        connection: Resource<wit::Connection>,
        bytes: Vec<u8>,
    ) -> Result<(), ExchangeError> {
        if bytes.len() > self.output_limit {
            self.note_oversized_output(bytes.len());
        }
        if self.exchanged + bytes.len() > self.output_limit {
            return Err(ExchangeError::Refused(format!(
                "this decision's exchanges moved {} bytes; {} more would pass the plugin's {} byte output limit",
                self.exchanged,
                bytes.len(),
                self.output_limit
            )));
        }
        self.exchanged += bytes.len();
        self.connections.get_mut(&connection)?.send(bytes).await
    }

    async fn receive(
        &mut self,
        connection: Resource<wit::Connection>,
        max_bytes: u32,
        timeout_ms: u32,
    ) -> Result<Vec<u8>, ExchangeError> {
        let left = self.output_limit.saturating_sub(self.exchanged);
        if left == 0 {
            return Err(ExchangeError::Refused(format!(
                "this decision's exchanges moved {} bytes, the plugin's output limit",
                self.exchanged
            )));
        }
        let max_bytes = max_bytes.min(u32::try_from(left).unwrap_or(u32::MAX));
        let received = self
            .connections
            .get_mut(&connection)?
            .receive(max_bytes, Duration::from_millis(u64::from(timeout_ms)))
            .await?;
        self.exchanged += received.len();
        Ok(received)
    }

    async fn drop(&mut self, connection: Resource<wit::Connection>) -> wasmtime::Result<()> {
        match self.connections.remove(&connection) {
            Some(_) => Ok(()),
            None => Err(wasmtime::Error::msg(format!(
                "the plugin dropped connection handle {}, which is not open",
                connection.rep()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The byte pipe against a local TCP peer that answers one fixed reply per request (a
    //! stand-in app: what is tested is the host's transport, authorization, limits, recording
    //! and replay, not any protocol).

    use std::collections::HashMap;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::capability::http::http_client;
    use crate::capability::scope::{Grants, PodEndpoint};

    async fn peer(reply: &'static [u8]) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 || socket.write_all(reply).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        port
    }

    fn scope(port: u16, exchange_ports: &[&str]) -> AppCallScope {
        let pods = HashMap::from([(
            "app-0".to_string(),
            PodEndpoint {
                ip: Some("127.0.0.1".into()),
                named_ports: HashMap::from([("admin".to_string(), port)]),
                declared_ports: vec![port],
                ..PodEndpoint::default()
            },
        )]);
        let grants = Grants {
            app_call_ports: vec!["admin".into()],
            exchange_ports: exchange_ports.iter().map(|p| (*p).to_owned()).collect(),
            ..Grants::default()
        };
        AppCallScope::new(
            "ns/app".into(),
            pods,
            grants,
            http_client().expect("the app-call client"),
        )
    }

    #[tokio::test]
    async fn exchanges_are_authorized_like_app_calls() {
        let port = peer(b"+PONG\r\n").await;
        let rows: [(&str, AppCallScope, &str, &str, Option<&str>); 4] = [
            (
                "a port granted for exchanges opens",
                scope(port, &["admin"]),
                "app-0",
                "admin",
                None,
            ),
            (
                "a port granted only for app-calls is refused",
                scope(port, &[]),
                "app-0",
                "admin",
                Some("not granted"),
            ),
            (
                "a pod the parent does not control is refused",
                scope(port, &["admin"]),
                "other-0",
                "admin",
                Some("not controlled"),
            ),
            (
                "the scope of describe reaches nothing",
                AppCallScope::none(),
                "app-0",
                "admin",
                Some("not available"),
            ),
        ];
        for (situation, scope, pod, port_name, refused) in rows {
            let opened = Connection::open(&scope, pod.into(), port_name.into(), 1024).await;
            match (refused, opened) {
                (None, Ok(_)) => {}
                (Some(fragment), Err(ExchangeError::Refused(message))) => {
                    assert!(message.contains(fragment), "{situation}: {message}")
                }
                (expected, got) => panic!("{situation}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    /// Review #5: sends without a reply kept every byte of the round, and a plugin could
    /// open and drop connections without end (each a socket in TIME_WAIT).
    #[tokio::test]
    async fn one_decision_moves_at_most_its_output_limit_and_opens_a_bounded_number() {
        use wasmtime::component::Resource;

        let port = peer(b"+OK\r\n").await;
        let mut doors = Doors::new("p".into(), scope(port, &["admin"]), 4096);
        let opened = wit::HostConnection::open(&mut doors, "app-0".into(), "admin".into())
            .await
            .expect("opens");
        let rep = opened.rep();
        let mut sent = 0;
        let refused = loop {
            let handle = Resource::<wit::Connection>::new_borrow(rep);
            match wit::HostConnection::send(&mut doors, handle, vec![b'x'; 1024]).await {
                Ok(()) => sent += 1024,
                Err(error) => break error,
            }
            assert!(sent <= 64 << 10, "{sent} bytes sent and never refused");
        };
        assert!(
            matches!(&refused, ExchangeError::Refused(m) if m.contains("output limit")),
            "{refused:?}"
        );
        assert!(sent <= 4096, "{sent} bytes sent for a 4096 byte limit");

        let mut doors = Doors::new("p".into(), scope(port, &["admin"]), 4096);
        let mut opens = 0;
        let refused = loop {
            match wit::HostConnection::open(&mut doors, "app-0".into(), "admin".into()).await {
                Ok(handle) => {
                    opens += 1;
                    wit::HostConnection::drop(&mut doors, handle)
                        .await
                        .expect("drops");
                }
                Err(error) => break error,
            }
            assert!(
                opens <= 10_000,
                "{opens} connections opened and never refused"
            );
        };
        assert!(
            matches!(&refused, ExchangeError::Refused(m) if m.contains("opened")),
            "{refused:?}"
        );
        assert!(opens <= MAX_OPENS_PER_DECISION, "{opens}");
    }

    #[tokio::test]
    async fn a_recorded_round_is_replayed_without_the_network() {
        let port = peer(b"+PONG\r\n").await;
        let recorder = AppCallRecorder::new();
        let live = scope(port, &["admin"]).recorded_by(recorder.clone());
        let mut connection = Connection::open(&live, "app-0".into(), "admin".into(), 1024)
            .await
            .expect("opens");
        connection.send(b"PING\r\n".to_vec()).await.expect("sends");
        let reply = connection
            .receive(64, Duration::from_secs(2))
            .await
            .expect("receives");
        assert_eq!(reply, b"+PONG\r\n");
        drop(connection);
        let rounds = recorder.exchanges();
        assert_eq!(rounds.len(), 1, "{rounds:?}");
        assert_eq!(rounds[0].request, b"PING\r\n");

        let replay = AppCallScope::scripted("ns/app".into(), recorder.replay());
        let mut connection = Connection::open(&replay, "app-0".into(), "admin".into(), 1024)
            .await
            .expect("opens without a network");
        connection.send(b"PING\r\n".to_vec()).await.expect("sends");
        let first = connection.receive(3, Duration::from_secs(2)).await;
        let rest = connection.receive(64, Duration::from_secs(2)).await;
        assert_eq!(first.as_deref(), Ok(&b"+PO"[..]), "max-bytes is honoured");
        assert_eq!(rest.as_deref(), Ok(&b"NG\r\n"[..]));
        connection.send(b"QUIT\r\n".to_vec()).await.expect("sends");
        let unknown = connection.receive(64, Duration::from_secs(2)).await;
        assert!(
            matches!(&unknown, Err(ExchangeError::Unreachable(m)) if m.contains("no scripted exchange")),
            "{unknown:?}"
        );
    }

    #[tokio::test]
    async fn what_a_connection_receives_is_bounded_by_the_output_limit() {
        let port = peer(b"0123456789").await;
        let live = scope(port, &["admin"]);
        let mut connection = Connection::open(&live, "app-0".into(), "admin".into(), 8)
            .await
            .expect("opens");
        let too_big = connection.send(vec![b'x'; 9]).await;
        assert!(
            matches!(too_big, Err(ExchangeError::Refused(_))),
            "{too_big:?}"
        );
        connection.send(b"go".to_vec()).await.expect("sends");
        let mut received = 0;
        let outcome = loop {
            match connection.receive(64, Duration::from_secs(2)).await {
                Ok(bytes) => received += bytes.len(),
                Err(error) => break error,
            }
        };
        assert_eq!(received, 8, "never more than the limit");
        assert!(
            matches!(outcome, ExchangeError::Refused(ref m) if m.contains("output limit")),
            "{outcome:?}"
        );
    }
}
