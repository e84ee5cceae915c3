// The host's side of the App, over the WIT imports of world `policy-plugin@0.2.2`. Only the
// component's entry module imports this file: the `policy-host:policy/...` modules exist only
// inside the component, where componentize-js binds them to the host's imports. Everything
// else in the SDK, and all decision code, runs natively under `node --test`.
//
// componentize-js calling convention (jco's): an import returning `result<T, E>` returns T or
// throws an error whose `payload` is E (`{ tag, val }` for a variant); `list<u8>` is a
// Uint8Array; a resource is a class whose instances are dropped by `Symbol.dispose`.

import { call as witCall, callTls as witCallTls } from 'policy-host:policy/app-call@0.2.2';
import { read as witRead } from 'policy-host:policy/credentials@0.2.2';
import { Connection } from 'policy-host:policy/exchange@0.2.2';
import { log as witLog } from 'policy-host:policy/log@0.2.2';

import { AppCallError, CredentialError, ExchangeError, Session } from './app.js';
import { setLogSink } from './log.js';

const dispose = Symbol.dispose ?? Symbol.for('dispose');

/** Runs `f`, turning the host's error payload into `Error` (a JS class of ./app.js). */
function translated(f, ErrorClass) {
  try {
    return f();
  } catch (error) {
    const payload = error?.payload;
    if (payload && typeof payload.tag === 'string') {
      throw new ErrorClass(payload.tag, typeof payload.val === 'string' ? payload.val : undefined);
    }
    throw error;
  }
}

/** The transport of a `Session` over one host `connection` resource. */
class HostConnection {
  constructor(resource) {
    this.resource = resource;
  }

  send(bytes) {
    translated(() => this.resource.send(bytes), ExchangeError);
  }

  receive(maxBytes, timeoutMs) {
    return translated(() => this.resource.receive(maxBytes, timeoutMs), ExchangeError);
  }

  close() {
    if (this.resource) {
      this.resource[dispose]?.();
      this.resource = undefined;
    }
  }
}

/** The App the component decides with: sessions, app-calls and credentials through the host. */
export const hostApp = {
  connect(pod, port) {
    const resource = translated(() => Connection.open(pod, port), ExchangeError);
    return new Session(pod, port, new HostConnection(resource));
  },

  call({ pod, port, method = 'get', path, body, tls }) {
    const request = { pod, port, method, path, body };
    return translated(
      () => (tls ? witCallTls(request, { secret: tls.secret, serverName: tls.serverName }) : witCall(request)),
      AppCallError,
    );
  },

  credential(secret, key) {
    return translated(() => witRead(secret, key), CredentialError);
  },
};

setLogSink((level, message, fields) => witLog(level, message, fields));
