//! The MySQL client protocol over an SDK [`Session`], as far as the plugin needs it: the
//! server's greeting, `mysql_native_password` authentication (MariaDB 10.11's default for
//! password accounts), and `COM_QUERY` with OK, ERR and text result sets.
//!
//! The packets are `mysql_common`'s (`HandshakePacket`, `HandshakeResponse`,
//! `AuthSwitchRequest`, `OkPacket`, `ErrPacket`, `Column`, text values), built without its
//! I/O and without default features (its `flate2/zlib` is C); the SDK session does the bytes.
//! What is written here is only the framing (a 3-byte length and a sequence id per packet,
//! which `mysql_common` leaves to its std-io codec) and the order of the conversation.
//!
//! Plaintext only: sessions have no TLS yet (SDK README, "Sessions"), which the
//! challenge-response of `mysql_native_password` tolerates (the password never crosses the
//! wire). Payloads of 16 MiB or more (split over several packets) are refused; the plugin's
//! queries and their answers are a few hundred bytes.

use mysql_common::Value;
use mysql_common::auth::plugins::mysql_native_password::scramble_native;
use mysql_common::constants::CapabilityFlags;
use mysql_common::io::ParseBuf;
use mysql_common::misc::raw::RawInt;
use mysql_common::misc::raw::int::LenEnc;
use mysql_common::packets::{
    AuthPlugin, AuthSwitchRequest, Column, CommonOkPacket, ErrPacket, HandshakePacket,
    HandshakeResponse, OkPacketDeserializer,
};
use mysql_common::proto::MySerialize;
use mysql_common::value::{TextValue, ValueDeserializer};
use policy_host_sdk::prelude::*;
use policy_host_sdk::{ExchangeError, Session};

/// Largest payload one packet carries; a payload this long continues in the next packet.
const MAX_PAYLOAD: usize = 0x00ff_ffff;

/// What the client can do, offered to the server (and intersected with what it offers).
fn client_capabilities() -> CapabilityFlags {
    CapabilityFlags::CLIENT_PROTOCOL_41
        | CapabilityFlags::CLIENT_SECURE_CONNECTION
        | CapabilityFlags::CLIENT_LONG_PASSWORD
        | CapabilityFlags::CLIENT_TRANSACTIONS
        | CapabilityFlags::CLIENT_PLUGIN_AUTH
}

/// Why a conversation with a server failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The session failed (unreachable, timed out, closed, refused by the host).
    #[error("{0}")]
    Session(#[from] ExchangeError),
    /// The server sent bytes that are not the packet expected at this point.
    #[error("the server's {what} is not a MySQL packet this client understands: {detail}")]
    Malformed {
        /// Which packet.
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// The server refused the login.
    #[error("login as `{user}` refused: {message} (check the credentials Secret)")]
    Login {
        /// The account.
        user: String,
        /// The server's message.
        message: String,
    },
    /// The server asks for an authentication method this client does not speak.
    #[error(
        "the server asks for authentication plugin `{0}`; the account must use mysql_native_password"
    )]
    AuthPlugin(String),
    /// The server answered a statement with an error.
    #[error("error {code}: {message}")]
    Server {
        /// The MySQL error number (1236: the replica asks for a GTID the source purged or
        /// never had).
        code: u16,
        /// The server's message.
        message: String,
    },
}

fn malformed(what: &'static str, detail: impl ToString) -> WireError {
    WireError::Malformed {
        what,
        detail: detail.to_string(),
    }
}

/// One packet: the header (payload length, sequence id) and the payload.
pub fn packet(sequence: u8, payload: &[u8]) -> Vec<u8> {
    let length = payload.len().min(MAX_PAYLOAD) as u32;
    let mut bytes = Vec::with_capacity(payload.len() + 4);
    bytes.extend_from_slice(&length.to_le_bytes()[..3]);
    bytes.push(sequence);
    bytes.extend_from_slice(payload);
    bytes
}

/// The rows of a text result set, with the column names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResultSet {
    /// Column names (or aliases), in order.
    pub columns: Vec<String>,
    /// Each row's values as text; `None` is SQL NULL.
    pub rows: Vec<Vec<Option<String>>>,
}

impl ResultSet {
    /// The value of column `column` in row `row`, if the column exists and is not NULL.
    pub fn get(&self, row: usize, column: &str) -> Option<&str> {
        let at = self.columns.iter().position(|c| c == column)?;
        self.rows.get(row)?.get(at)?.as_deref()
    }
}

/// An authenticated connection to one server.
#[derive(Debug)]
pub struct Client {
    session: Session,
    capabilities: CapabilityFlags,
}

impl Client {
    /// Opens a session with `port` of `pod`, reads the greeting and logs in as `user`.
    pub fn connect(
        app: &mut dyn AppCall,
        pod: &str,
        port: &str,
        user: &str,
        password: &str,
    ) -> Result<Client, WireError> {
        let mut session = app.connect(pod, port)?;
        let (_, greeting) = read_packet(&mut session)?;
        if greeting.first() == Some(&0xff) {
            return Err(server_error(&greeting, CapabilityFlags::CLIENT_PROTOCOL_41));
        }
        let handshake: HandshakePacket<'_> = ParseBuf(&greeting)
            .parse(())
            .map_err(|e| malformed("greeting", e))?;
        let capabilities = client_capabilities() & handshake.capabilities();
        if !capabilities.contains(CapabilityFlags::CLIENT_PROTOCOL_41) {
            return Err(malformed(
                "greeting",
                "the server does not speak protocol 4.1",
            ));
        }
        let nonce = handshake.nonce();
        // The version only chooses the response's collation (utf8mb4 from 5.5.3); every
        // MariaDB this plugin runs is past it. Parsing the greeting's version links
        // mysql_common's regex: with it (and `Value::as_sql`) the component was 1,750,458 B
        // instead of 616,044 B (plugin profile).
        let version = (10, 11, 0);
        let scramble = scramble_native(&nonce, password.as_bytes()).map(|s| s.to_vec());
        let response = HandshakeResponse::new(
            scramble,
            version,
            Some(user.as_bytes()),
            None::<&[u8]>,
            Some(AuthPlugin::MysqlNativePassword),
            capabilities,
            None,
            MAX_PAYLOAD as u32,
        );
        let mut payload = Vec::new();
        response.serialize(&mut payload);
        session.send(&packet(1, &payload))?;
        let mut client = Client {
            session,
            capabilities,
        };
        let (sequence, reply) = read_packet(&mut client.session)?;
        let reply = match reply.first() {
            // An account on another plugin: the server switches; only the native one is spoken.
            Some(0xfe) => {
                let switch: AuthSwitchRequest<'_> = ParseBuf(&reply)
                    .parse(())
                    .map_err(|e| malformed("authentication switch", e))?;
                let plugin = switch.auth_plugin();
                if plugin != AuthPlugin::MysqlNativePassword {
                    return Err(WireError::AuthPlugin(
                        String::from_utf8_lossy(plugin.as_bytes()).into_owned(),
                    ));
                }
                let nonce = switch.plugin_data();
                let nonce = nonce.strip_suffix(&[0]).unwrap_or(nonce);
                let scramble = scramble_native(nonce, password.as_bytes())
                    .map(|s| s.to_vec())
                    .unwrap_or_default();
                client
                    .session
                    .send(&packet(sequence.wrapping_add(1), &scramble))?;
                read_packet(&mut client.session)?.1
            }
            _ => reply,
        };
        match reply.first() {
            Some(0x00) => Ok(client),
            Some(0xff) => Err(match server_error(&reply, capabilities) {
                WireError::Server { message, .. } => WireError::Login {
                    user: user.to_owned(),
                    message,
                },
                other => other,
            }),
            _ => Err(malformed("login reply", "neither OK nor ERR")),
        }
    }

    /// Runs a statement that returns no rows (`SET`, `STOP SLAVE`, `CHANGE MASTER`).
    pub fn execute(&mut self, sql: &str) -> Result<(), WireError> {
        self.query(sql).map(|_| ())
    }

    /// Runs a statement and returns its rows (none for a statement answered with OK).
    pub fn query(&mut self, sql: &str) -> Result<ResultSet, WireError> {
        let mut payload = Vec::with_capacity(sql.len() + 1);
        payload.push(0x03); // COM_QUERY
        payload.extend_from_slice(sql.as_bytes());
        self.session.send(&packet(0, &payload))?;
        let (_, first) = read_packet(&mut self.session)?;
        match first.first() {
            Some(0x00) => {
                ParseBuf(&first)
                    .parse::<OkPacketDeserializer<'_, CommonOkPacket>>(self.capabilities)
                    .map_err(|e| malformed("OK", e))?;
                return Ok(ResultSet::default());
            }
            Some(0xff) => return Err(server_error(&first, self.capabilities)),
            Some(0xfb) => return Err(malformed("reply", "LOCAL INFILE is not supported")),
            _ => {}
        }
        let count = ParseBuf(&first)
            .parse::<RawInt<LenEnc>>(())
            .map_err(|e| malformed("column count", e))?;
        let count = usize::try_from(count.0).map_err(|e| malformed("column count", e))?;
        let mut columns = Vec::with_capacity(count);
        for _ in 0..count {
            let (_, bytes) = read_packet(&mut self.session)?;
            let column: Column = ParseBuf(&bytes)
                .parse(())
                .map_err(|e| malformed("column definition", e))?;
            columns.push(column.name_str().into_owned());
        }
        // Without CLIENT_DEPRECATE_EOF an EOF packet ends the column definitions.
        let (_, eof) = read_packet(&mut self.session)?;
        if !is_eof(&eof) {
            return Err(malformed("column definitions' end", "not an EOF packet"));
        }
        let mut rows = Vec::new();
        loop {
            let (_, bytes) = read_packet(&mut self.session)?;
            if is_eof(&bytes) {
                break;
            }
            if bytes.first() == Some(&0xff) {
                return Err(server_error(&bytes, self.capabilities));
            }
            let mut buf = ParseBuf(&bytes);
            let mut row = Vec::with_capacity(count);
            for _ in 0..count {
                let value = buf
                    .parse::<ValueDeserializer<TextValue>>(())
                    .map_err(|e| malformed("row", e))?
                    .0;
                row.push(match value {
                    Value::NULL => None,
                    Value::Bytes(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    // A text result set holds only bytes and NULLs.
                    other => return Err(malformed("row", format!("a binary value {other:?}"))),
                });
            }
            rows.push(row);
        }
        Ok(ResultSet { columns, rows })
    }
}

/// An EOF packet (0xfe and less than 9 bytes; a longer 0xfe is a length-encoded integer).
fn is_eof(payload: &[u8]) -> bool {
    payload.first() == Some(&0xfe) && payload.len() < 9
}

fn server_error(payload: &[u8], capabilities: CapabilityFlags) -> WireError {
    match ParseBuf(payload).parse::<ErrPacket<'_>>(capabilities) {
        Ok(ErrPacket::Error(error)) => WireError::Server {
            code: error.error_code(),
            message: error.message_str().into_owned(),
        },
        Ok(ErrPacket::Progress(_)) => malformed("error", "a progress report instead"),
        Err(e) => malformed("error", e),
    }
}

/// Reads one packet: its sequence id and payload.
fn read_packet(session: &mut Session) -> Result<(u8, Vec<u8>), WireError> {
    let mut bytes = session.receive_frame(frames::length_prefixed_le(3, 1))?;
    let length = usize::from(bytes[0]) | usize::from(bytes[1]) << 8 | usize::from(bytes[2]) << 16;
    if length == MAX_PAYLOAD {
        return Err(malformed("reply", "a payload of 16 MiB or more"));
    }
    let sequence = bytes[3];
    Ok((sequence, bytes.split_off(4)))
}

/// A server's side of the protocol, to script sessions in tests.
#[cfg(test)]
pub mod fixtures {
    use mysql_common::auth::plugins::mysql_native_password::scramble_native;
    use mysql_common::constants::{CapabilityFlags, StatusFlags};
    use mysql_common::packets::{AuthPlugin, HandshakePacket, HandshakeResponse};
    use mysql_common::proto::MySerialize;

    use super::packet;

    /// The 20-byte nonce every fixture greeting carries.
    pub const NONCE: &[u8; 20] = b"abcdefghijklmnopqrst";

    /// A MariaDB 10.11 greeting offering `mysql_native_password`.
    pub fn greeting() -> Vec<u8> {
        let mut scramble_1 = [0u8; 8];
        scramble_1.copy_from_slice(&NONCE[..8]);
        let mut scramble_2 = NONCE[8..].to_vec();
        scramble_2.push(0);
        let handshake = HandshakePacket::new(
            10,
            &b"5.5.5-10.11.6-MariaDB-0+deb12u1-log"[..],
            7,
            scramble_1,
            Some(scramble_2),
            CapabilityFlags::CLIENT_PROTOCOL_41
                | CapabilityFlags::CLIENT_SECURE_CONNECTION
                | CapabilityFlags::CLIENT_LONG_PASSWORD
                | CapabilityFlags::CLIENT_TRANSACTIONS
                | CapabilityFlags::CLIENT_PLUGIN_AUTH
                | CapabilityFlags::CLIENT_DEPRECATE_EOF,
            45,
            StatusFlags::SERVER_STATUS_AUTOCOMMIT,
            Some(&b"mysql_native_password"[..]),
        );
        let mut payload = Vec::new();
        handshake.serialize(&mut payload);
        packet(0, &payload)
    }

    /// An OK packet with sequence id `sequence`.
    pub fn ok(sequence: u8) -> Vec<u8> {
        packet(sequence, &[0x00, 0, 0, 0x02, 0, 0, 0])
    }

    /// An ERR packet.
    pub fn err(sequence: u8, code: u16, message: &str) -> Vec<u8> {
        let mut payload = vec![0xff];
        payload.extend_from_slice(&code.to_le_bytes());
        payload.extend_from_slice(b"#HY000");
        payload.extend_from_slice(message.as_bytes());
        packet(sequence, &payload)
    }

    fn lenenc_str(out: &mut Vec<u8>, text: &[u8]) {
        // Fixture strings are short: a one-byte length.
        out.push(u8::try_from(text.len()).unwrap_or(250).min(250));
        out.extend_from_slice(text);
    }

    /// A text result set: column definitions, EOF, rows, EOF (sequence ids from 1).
    pub fn result_set(columns: &[&str], rows: &[&[Option<&str>]]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut sequence = 1u8;
        let mut push = |bytes: &mut Vec<u8>, payload: &[u8]| {
            bytes.extend(packet(sequence, payload));
            sequence = sequence.wrapping_add(1);
        };
        push(&mut bytes, &[u8::try_from(columns.len()).unwrap_or(0)]);
        for name in columns {
            let mut def = Vec::new();
            for part in [&b"def"[..], b"", b"", b"", name.as_bytes(), name.as_bytes()] {
                lenenc_str(&mut def, part);
            }
            // Fixed fields: length 0x0c, charset, column length, type (VAR_STRING), flags,
            // decimals, filler.
            def.extend_from_slice(&[0x0c, 0x21, 0, 0, 0, 0, 0, 0, 0, 0xfd, 0, 0, 0, 0, 0]);
            push(&mut bytes, &def);
        }
        push(&mut bytes, &[0xfe, 0, 0, 0x02, 0]);
        for row in rows {
            let mut payload = Vec::new();
            for value in *row {
                match value {
                    Some(text) => lenenc_str(&mut payload, text.as_bytes()),
                    None => payload.push(0xfb),
                }
            }
            push(&mut bytes, &payload);
        }
        push(&mut bytes, &[0xfe, 0, 0, 0x02, 0]);
        bytes
    }

    /// The handshake response this client sends to [`greeting`] for `user` and `password`.
    pub fn login(user: &str, password: &str) -> Vec<u8> {
        let scramble = scramble_native(NONCE, password.as_bytes()).map(|s| s.to_vec());
        let response = HandshakeResponse::new(
            scramble,
            (10, 11, 0),
            Some(user.as_bytes()),
            None::<&[u8]>,
            Some(AuthPlugin::MysqlNativePassword),
            super::client_capabilities(),
            None,
            super::MAX_PAYLOAD as u32,
        );
        let mut payload = Vec::new();
        response.serialize(&mut payload);
        packet(1, &payload)
    }

    /// The COM_QUERY packet of `sql`.
    pub fn com_query(sql: &str) -> Vec<u8> {
        let mut payload = vec![0x03];
        payload.extend_from_slice(sql.as_bytes());
        packet(0, &payload)
    }
}

#[cfg(test)]
mod tests {
    use policy_host_sdk::testing::ScriptedAppCall;

    use super::fixtures::*;
    use super::*;

    #[test]
    fn the_native_password_scramble_is_sha1_of_the_password_xor_the_nonce_proof() {
        // SHA1("secret") XOR SHA1(nonce ‖ SHA1(SHA1("secret"))), computed independently with
        // Python's hashlib for this nonce.
        let scramble = scramble_native(NONCE, b"secret").expect("a scramble");
        let hex: String = scramble.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "8817c50fa779daef010ee7577825b0847df9842e");
        assert_eq!(
            scramble_native(NONCE, b""),
            None,
            "an empty password sends nothing"
        );
    }

    #[test]
    fn logs_in_then_reads_a_result_set_with_nulls() {
        let sql = "SELECT @@global.read_only AS ro, @@global.gtid_slave_pos AS pos";
        let app = ScriptedAppCall::new()
            .greets("db-0", "mysql", greeting())
            .answers("db-0", "mysql", login("root", "secret"), ok(2))
            .answers(
                "db-0",
                "mysql",
                com_query(sql),
                result_set(&["ro", "pos"], &[&[Some("1"), None]]),
            );
        let mut caller = app.clone();
        let mut client =
            Client::connect(&mut caller, "db-0", "mysql", "root", "secret").expect("logs in");
        let rows = client.query(sql).expect("rows");
        assert_eq!(rows.columns, ["ro", "pos"]);
        assert_eq!(rows.get(0, "ro"), Some("1"));
        assert_eq!(rows.get(0, "pos"), None, "NULL");
        assert_eq!(app.session_log().len(), 3);
    }

    #[test]
    fn errors_say_what_the_server_said() {
        // (situation, reply to the login, expected error)
        let rows: [(&str, Vec<u8>, WireError); 2] = [
            (
                "a wrong password is a refused login naming the account",
                err(2, 1045, "Access denied for user 'root'@'10.0.0.1'"),
                WireError::Login {
                    user: "root".into(),
                    message: "Access denied for user 'root'@'10.0.0.1'".into(),
                },
            ),
            (
                "another authentication plugin is refused, naming it",
                packet(2, b"\xfeclient_ed25519\0abcdefghijklmnopqrstuvwxyz012345\0"),
                WireError::AuthPlugin("client_ed25519".into()),
            ),
        ];
        for (situation, reply, expected) in rows {
            let mut app = ScriptedAppCall::new()
                .greets("db-0", "mysql", greeting())
                .answers("db-0", "mysql", login("root", "secret"), reply);
            let got = Client::connect(&mut app, "db-0", "mysql", "root", "secret");
            assert_eq!(got.err(), Some(expected), "{situation}");
        }
        let mut app = ScriptedAppCall::new()
            .greets("db-0", "mysql", greeting())
            .answers("db-0", "mysql", login("root", "secret"), ok(2))
            .answers(
                "db-0",
                "mysql",
                com_query("START SLAVE"),
                err(1, 1200, "Misconfigured slave"),
            );
        let mut client =
            Client::connect(&mut app, "db-0", "mysql", "root", "secret").expect("logs in");
        assert_eq!(
            client.execute("START SLAVE"),
            Err(WireError::Server {
                code: 1200,
                message: "Misconfigured slave".into()
            })
        );
    }

    #[test]
    fn an_unreachable_server_is_a_session_error() {
        let mut app = ScriptedAppCall::new();
        assert!(matches!(
            Client::connect(&mut app, "db-0", "mysql", "root", "secret"),
            Err(WireError::Session(ExchangeError::Unreachable(_)))
        ));
    }
}
