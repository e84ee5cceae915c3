//! RESP, the Redis protocol, as far as the plugin needs it: commands out, replies in.
//!
//! A command is an array of bulk strings; a reply is one value. [`parse`] tells a whole reply
//! from a partial one, which is how the exchange knows when to stop reading
//! (<https://redis.io/docs/latest/develop/reference/protocol-spec/>).

/// A RESP2 reply value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$n` bytes, or `$-1` (nil).
    Bulk(Option<Vec<u8>>),
    /// `*n` values, or `*-1` (nil).
    Array(Option<Vec<Reply>>),
}

/// Encodes a command as RESP: an array of bulk strings.
pub fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// True once `bytes` hold at least one whole reply.
pub fn is_complete(bytes: &[u8]) -> bool {
    parse(bytes).is_some()
}

/// Parses one reply from the start of `bytes`: the reply and the bytes it took, or `None`
/// while it is incomplete (or malformed, which reads as "never complete": the exchange then
/// times out rather than misreading).
pub fn parse(bytes: &[u8]) -> Option<(Reply, usize)> {
    let end = bytes.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(bytes.get(1..end)?).ok()?;
    let rest = end + 2;
    match bytes.first()? {
        b'+' => Some((Reply::Simple(line.to_owned()), rest)),
        b'-' => Some((Reply::Error(line.to_owned()), rest)),
        b':' => Some((Reply::Integer(line.parse().ok()?), rest)),
        b'$' => {
            let len: i64 = line.parse().ok()?;
            if len < 0 {
                return Some((Reply::Bulk(None), rest));
            }
            let len = usize::try_from(len).ok()?;
            let body = bytes.get(rest..rest + len)?;
            (bytes.get(rest + len..rest + len + 2)? == b"\r\n")
                .then(|| (Reply::Bulk(Some(body.to_vec())), rest + len + 2))
        }
        b'*' => {
            let count: i64 = line.parse().ok()?;
            if count < 0 {
                return Some((Reply::Array(None), rest));
            }
            let mut items = Vec::new();
            let mut at = rest;
            for _ in 0..count {
                let (item, used) = parse(bytes.get(at..)?)?;
                items.push(item);
                at += used;
            }
            Some((Reply::Array(Some(items)), at))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(
            command(&["INFO", "replication"]),
            b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n".to_vec()
        );
    }

    #[test]
    fn replies_table() {
        let rows: [(&str, &[u8], Option<Reply>); 9] = [
            (
                "a simple string",
                b"+OK\r\n",
                Some(Reply::Simple("OK".into())),
            ),
            (
                "an error",
                b"-ERR no\r\n",
                Some(Reply::Error("ERR no".into())),
            ),
            ("an integer", b":3\r\n", Some(Reply::Integer(3))),
            (
                "a bulk string",
                b"$2\r\nhi\r\n",
                Some(Reply::Bulk(Some(b"hi".to_vec()))),
            ),
            ("a nil bulk", b"$-1\r\n", Some(Reply::Bulk(None))),
            ("a bulk cut in its body is incomplete", b"$5\r\nhel", None),
            ("a line without its CRLF is incomplete", b"+OK", None),
            (
                "an array of bulks",
                b"*2\r\n$1\r\na\r\n:1\r\n",
                Some(Reply::Array(Some(vec![
                    Reply::Bulk(Some(b"a".to_vec())),
                    Reply::Integer(1),
                ]))),
            ),
            (
                "an array missing an item is incomplete",
                b"*2\r\n$1\r\na\r\n",
                None,
            ),
        ];
        for (situation, bytes, want) in rows {
            assert_eq!(parse(bytes).map(|(r, _)| r), want, "{situation}");
            assert_eq!(is_complete(bytes), want.is_some(), "{situation}");
        }
    }
}
