// The ways out of the sandbox, as the plugin sees them: an `App` (sessions and one-shot
// exchanges over TCP, HTTP app-calls, credentials), the errors each can end in, and the
// `Session` that cuts a TCP conversation into the protocol's frames.
//
// Decision code takes an `App` and never imports the host: in the component it is `hostApp`
// (./host.js, over the WIT imports); in tests it is `ScriptedApp` (./testing.js) or your own
// fake. Anything with the methods below is an App:
//
//   connect(pod, port)            -> Session       (throws ExchangeError)
//   call({ pod, port, method, path, body, tls })
//                                 -> { status, body }  (throws AppCallError)
//   credential(secret, key)       -> Uint8Array    (throws CredentialError)
//
// `exchange(app, request)` below is one request and one reply over a fresh session.

import { encodeUtf8 } from './utf8.js';

/** How long one wait for bytes lasts unless a session says otherwise (ms); the host caps it at 5 s. */
export const DEFAULT_TIMEOUT_MS = 2000;

/** The most bytes one frame may take before the session gives up on it. */
export const MAX_FRAME_BYTES = 1 << 20;

/** Why an error's `kind` happened, from the host's `{ tag, val }` payload. */
class AppError extends Error {
  constructor(kind, detail, what) {
    super(detail ? `${what} ${kind}: ${detail}` : `${what} ${kind}`);
    this.kind = kind;
    this.detail = detail ?? '';
  }
}

/**
 * A session or exchange failed. `kind`: `refused` (pod not owned, port not granted, over a
 * limit), `unreachable` (no IP yet, connection refused or reset), `timeout`, `closed` (the app
 * closed the connection).
 */
export class ExchangeError extends AppError {
  constructor(kind, detail) {
    super(kind, detail, 'exchange');
    this.name = 'ExchangeError';
  }
}

/** An app-call got no response. `kind`: `refused`, `unreachable`, `timeout`. */
export class AppCallError extends AppError {
  constructor(kind, detail) {
    super(kind, detail, 'app-call');
    this.name = 'AppCallError';
  }
}

/** No credential was handed out. `kind`: `refused`, `missing`, `unavailable`. */
export class CredentialError extends AppError {
  constructor(kind, detail) {
    super(kind, detail, 'credential');
    this.name = 'CredentialError';
  }
}

/** `bytes` as a Uint8Array (a string is UTF-8 encoded). */
export function toBytes(bytes) {
  return typeof bytes === 'string' ? encodeUtf8(bytes) : bytes;
}

function concat(a, b) {
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

/**
 * One TCP connection to a granted port of a Pod, held for a conversation. `connection` is the
 * transport: `{ send(bytes), receive(maxBytes, timeoutMs) -> Uint8Array, close() }`, each
 * throwing `ExchangeError`.
 *
 * Frames are yours: `receiveFrame(check)` reads until `check(bytes)` returns the length `n` of
 * one whole frame at the start of `bytes` (undefined while incomplete), returns those `n`
 * bytes and keeps the rest for the next call, so pipelined replies need nothing special.
 */
export class Session {
  constructor(pod, port, connection) {
    this.pod = pod;
    this.port = port;
    this.connection = connection;
    this.buffer = new Uint8Array(0);
    this.timeoutMs = DEFAULT_TIMEOUT_MS;
  }

  /** Waits at most `ms` for each chunk of bytes from now on. */
  withTimeoutMs(ms) {
    this.timeoutMs = ms;
    return this;
  }

  /** Sends all of `bytes` (a Uint8Array or a string, sent as UTF-8). */
  send(bytes) {
    this.connection.send(toBytes(bytes));
  }

  /** Reads one frame, as `check` delimits it. */
  receiveFrame(check) {
    for (;;) {
      const n = check(this.buffer);
      if (n !== undefined && n !== null) {
        const frame = this.buffer.slice(0, n);
        this.buffer = this.buffer.slice(n);
        return frame;
      }
      if (this.buffer.length >= MAX_FRAME_BYTES) {
        throw new ExchangeError('refused', `${this.pod}:${this.port} sent ${this.buffer.length} bytes without completing a frame`);
      }
      this.buffer = concat(this.buffer, this.connection.receive(64 * 1024, this.timeoutMs));
    }
  }

  /** Sends `bytes` and reads the one frame that answers it. */
  request(bytes, check) {
    this.send(bytes);
    return this.receiveFrame(check);
  }

  /** Closes the connection now (otherwise the host closes it when the decision ends). */
  close() {
    this.connection.close();
  }
}

/** Common framings, as `check` functions for `Session.receiveFrame`. */
export const frames = {
  /** One line, up to and including `\n`. */
  line(bytes) {
    const at = bytes.indexOf(0x0a);
    return at < 0 ? undefined : at + 1;
  },
  /** Everything up to and including the first line that is exactly `terminator` (`END`), CRLF-terminated. */
  untilLine(terminator) {
    const marker = encodeUtf8(`${terminator}\r\n`);
    return (bytes) => {
      for (let start = 0; start <= bytes.length - marker.length; ) {
        if (marker.every((b, i) => bytes[start + i] === b)) return start + marker.length;
        const next = bytes.indexOf(0x0a, start);
        if (next < 0) return undefined;
        start = next + 1;
      }
      return undefined;
    };
  },
};

/**
 * One request and one reply over a fresh session: connects to `port` of `pod`, sends
 * `request`, reads the frame `replyComplete` delimits, closes. Ask for
 * `Capability.exchange(port)` in `describe`.
 */
export function exchange(app, { pod, port, request, replyComplete, timeoutMs = DEFAULT_TIMEOUT_MS }) {
  const session = app.connect(pod, port).withTimeoutMs(timeoutMs);
  try {
    return session.request(request, replyComplete);
  } finally {
    session.close();
  }
}
