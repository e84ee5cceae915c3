// Lines in the host's log, tagged by the host with the plugin and the parent. In the
// component they go through the `log` import (./host.js installs that sink); natively they go
// to `captured`, which tests may read, and nowhere else.

/** Lines logged natively, as `{ level, message, fields }`. */
export const captured = [];

let sink = (level, message, fields) => captured.push({ level, message, fields });

/** Where lines go from now on: `(level, message, [[key, value], ...]) => void`. */
export function setLogSink(write) {
  sink = write;
}

function write(level, message, fields = {}) {
  sink(level, message, Object.entries(fields).map(([k, v]) => [k, String(v)]));
}

export const debug = (message, fields) => write('debug', message, fields);
export const info = (message, fields) => write('info', message, fields);
export const warn = (message, fields) => write('warn', message, fields);
export const error = (message, fields) => write('error', message, fields);
