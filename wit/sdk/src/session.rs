//! Sessions: one TCP connection to a granted port of a pod the parent owns, held across several
//! sends and receives within one decision, for protocols that are a conversation rather than
//! one request and one reply (MySQL/MariaDB: the server greets, the client authenticates, then
//! queries; PostgreSQL; ZooKeeper).
//!
//! The plugin speaks the protocol; the SDK keeps the bytes that arrived and cuts them into the
//! protocol's frames with a check the plugin gives ([`Session::receive_frame`]): "the first
//! `n` bytes are one whole frame", or "not yet". Bytes past a frame stay buffered for the next
//! one, so a server that answers in pipelined frames, or greets before anything is sent, needs
//! nothing special. Open one with [`AppCall::connect`](crate::AppCall::connect); several may be
//! open at once (at most 16 per decision); each closes when dropped and, at the latest, when the
//! decision ends.
//!
//! A session is the WIT `exchange.connection` resource (contract 0.2) and is bounded like every
//! exchange: what it sends and receives counts against the plugin's output limit, each wait is at
//! most the host's app-call timeout (5 s), a decision opens at most 64 connections in all, and
//! everything runs inside the decision's deadline. Ask for it with
//! [`Capability::Exchange`](crate::Capability::Exchange) in `describe`.
//!
//! In native tests a [`ScriptedAppCall`](crate::testing::ScriptedAppCall) answers sessions from
//! rounds (the bytes sent since the last read, and the reply), the same rows `policy-host
//! simulate` reads and the host records in shadow mode.
//!
//! TLS: not on sessions yet. A protocol that upgrades in band (MySQL's and PostgreSQL's
//! SSLRequest) would need the host to take over the connection mid-conversation, and TLS from
//! the first byte needs a contract change; both wait for a plugin that needs them (see the SDK
//! README, "Sessions").

use crate::exchange::ExchangeError;

/// The transport under a [`Session`]: the host's connection in wasm, a fake in tests. Plugins
/// use [`Session`]; a test fake with its own model of the app implements this.
pub trait Connection {
    /// Sends all of `bytes`.
    fn send(&mut self, bytes: &[u8]) -> Result<(), ExchangeError>;

    /// Waits up to `timeout_ms` for bytes and returns those that arrived: at least one, at most
    /// `max_bytes`. [`ExchangeError::Closed`] once the app closed the connection,
    /// [`ExchangeError::Timeout`] when nothing arrived in time (the session is still usable).
    fn receive(&mut self, max_bytes: u32, timeout_ms: u32) -> Result<Vec<u8>, ExchangeError>;
}

/// Largest chunk asked of the transport per receive: a reply is read in a few calls, never into
/// one huge buffer.
const CHUNK: u32 = 64 << 10;

/// An open conversation with one port of one pod.
pub struct Session {
    pod: String,
    port: String,
    connection: Box<dyn Connection>,
    /// Bytes received and not yet handed out as a frame.
    buffered: Vec<u8>,
    timeout_ms: u32,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("pod", &self.pod)
            .field("port", &self.port)
            .field("buffered", &self.buffered.len())
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

impl Session {
    /// A session over `connection` with `port` of `pod`, waiting at most
    /// [`DEFAULT_TIMEOUT_MS`](crate::exchange::DEFAULT_TIMEOUT_MS) per chunk. `AppCall`
    /// implementations build it; plugins get it from
    /// [`AppCall::connect`](crate::AppCall::connect).
    pub fn new(pod: &str, port: &str, connection: Box<dyn Connection>) -> Self {
        Session {
            pod: pod.to_owned(),
            port: port.to_owned(),
            connection,
            buffered: Vec::new(),
            timeout_ms: crate::exchange::DEFAULT_TIMEOUT_MS,
        }
    }

    /// The same session, waiting at most `timeout_ms` for each chunk (the host caps it at 5 s).
    pub fn with_timeout_ms(mut self, timeout_ms: u32) -> Self {
        self.timeout_ms = timeout_ms;
        self
    }

    /// The pod this session talks to.
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// The port, as the plugin named it.
    pub fn port(&self) -> &str {
        &self.port
    }

    /// Sends all of `bytes`.
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), ExchangeError> {
        self.connection.send(bytes)
    }

    /// Reads until `frame` finds a whole frame at the start of the bytes received so far, and
    /// returns that frame; the bytes after it stay for the next call.
    ///
    /// `frame(bytes)` returns `Some(n)` when the first `n` bytes (`n <= bytes.len()`) are one
    /// whole frame, `None` while more are needed. It sees every byte not yet handed out,
    /// starting at a frame boundary. The app closing the connection mid-frame is
    /// [`ExchangeError::Closed`]; nothing arriving within the timeout is
    /// [`ExchangeError::Timeout`], with what did arrive kept.
    pub fn receive_frame(
        &mut self,
        frame: impl Fn(&[u8]) -> Option<usize>,
    ) -> Result<Vec<u8>, ExchangeError> {
        loop {
            if let Some(n) = frame(&self.buffered).filter(|&n| n <= self.buffered.len()) {
                let rest = self.buffered.split_off(n);
                return Ok(std::mem::replace(&mut self.buffered, rest));
            }
            let bytes = self.connection.receive(CHUNK, self.timeout_ms)?;
            self.buffered.extend_from_slice(&bytes);
        }
    }

    /// Sends `request`, then reads one frame (as [`Session::receive_frame`]).
    pub fn request(
        &mut self,
        request: &[u8],
        frame: impl Fn(&[u8]) -> Option<usize>,
    ) -> Result<Vec<u8>, ExchangeError> {
        self.send(request)?;
        self.receive_frame(frame)
    }
}

/// Frame checks for common framings, to pass to [`Session::receive_frame`].
pub mod frames {
    /// A line ending in `\n` (the `\n` is part of the frame).
    pub fn line(bytes: &[u8]) -> Option<usize> {
        bytes.iter().position(|&b| b == b'\n').map(|at| at + 1)
    }

    /// A frame whose first `header` bytes hold, little-endian, the length of what follows
    /// `extra` more bytes: `length_prefixed_le(3, 1)` reads one MySQL packet (3 bytes of
    /// payload length, 1 byte of sequence id, the payload).
    pub fn length_prefixed_le(header: usize, extra: usize) -> impl Fn(&[u8]) -> Option<usize> {
        move |bytes: &[u8]| {
            let prefix = bytes.get(..header)?;
            let length = prefix
                .iter()
                .rev()
                .fold(0usize, |n, &b| (n << 8) | usize::from(b));
            let whole = header.checked_add(extra)?.checked_add(length)?;
            (bytes.len() >= whole).then_some(whole)
        }
    }

    /// A frame whose first `header` bytes hold the length of the whole frame minus `header`,
    /// big-endian (PostgreSQL's messages after the type byte, ZooKeeper's, Kafka's).
    pub fn length_prefixed_be(header: usize) -> impl Fn(&[u8]) -> Option<usize> {
        move |bytes: &[u8]| {
            let prefix = bytes.get(..header)?;
            let length = prefix
                .iter()
                .fold(0usize, |n, &b| (n << 8) | usize::from(b));
            let whole = header.checked_add(length)?;
            (bytes.len() >= whole).then_some(whole)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// A transport that hands out fixed chunks, then says the app closed.
    struct Chunks(VecDeque<Vec<u8>>);

    impl Connection for Chunks {
        fn send(&mut self, _: &[u8]) -> Result<(), ExchangeError> {
            Ok(())
        }
        fn receive(&mut self, max_bytes: u32, _: u32) -> Result<Vec<u8>, ExchangeError> {
            let mut chunk = self.0.pop_front().ok_or(ExchangeError::Closed)?;
            let rest = chunk.split_off(chunk.len().min(max_bytes as usize));
            if !rest.is_empty() {
                self.0.push_front(rest);
            }
            Ok(chunk)
        }
    }

    fn session(chunks: &[&[u8]]) -> Session {
        Session::new(
            "db-0",
            "admin",
            Box::new(Chunks(chunks.iter().map(|c| c.to_vec()).collect())),
        )
    }

    /// A row: situation, chunks as they arrive, frames expected in order.
    type Row = (
        &'static str,
        &'static [&'static [u8]],
        &'static [&'static [u8]],
    );

    #[test]
    fn frames_are_cut_where_the_check_says_whatever_the_chunks() {
        let rows: [Row; 3] = [
            (
                "one frame split over chunks is joined",
                &[b"HEL", b"LO x", b"\n"],
                &[b"HELLO x\n"],
            ),
            (
                "two frames in one chunk come out one by one",
                &[b"OK\nOK 2\n"],
                &[b"OK\n", b"OK 2\n"],
            ),
            (
                "the bytes past a frame wait for the next one",
                &[b"A\nB", b"\n"],
                &[b"A\n", b"B\n"],
            ),
        ];
        for (situation, chunks, expected) in rows {
            let mut session = session(chunks);
            for want in expected {
                let got = session.receive_frame(frames::line);
                assert_eq!(got.as_deref(), Ok(*want), "{situation}");
            }
        }
    }

    #[test]
    fn an_app_closing_mid_frame_is_closed_not_a_short_frame() {
        let mut session = session(&[b"HALF"]);
        assert_eq!(
            session.receive_frame(frames::line),
            Err(ExchangeError::Closed)
        );
    }

    #[test]
    fn length_prefixed_frames_read_their_header() {
        // A MySQL packet: 3-byte little-endian length, sequence id, payload.
        let mysql = frames::length_prefixed_le(3, 1);
        assert_eq!(mysql(&[2, 0, 0, 1, b'o']), None, "payload incomplete");
        assert_eq!(mysql(&[2, 0, 0, 1, b'o', b'k', 9]), Some(6));
        assert_eq!(mysql(&[2, 0]), None, "header incomplete");
        let be = frames::length_prefixed_be(4);
        assert_eq!(be(&[0, 0, 0, 1, 7, 8]), Some(5));
    }
}
