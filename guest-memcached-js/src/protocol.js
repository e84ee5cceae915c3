// memcached's text protocol, as far as the plugin speaks it: the `stats` command, where its
// reply ends, and what it says. From memcached's doc/protocol.txt ("General-purpose
// statistics"): the reply is `STAT <name> <value>\r\n` lines closed by `END\r\n`; a server
// that cannot answer sends one `ERROR`, `CLIENT_ERROR <why>` or `SERVER_ERROR <why>` line.

import { decodeUtf8, frames } from '../sdk/index.js';

/** The request: general-purpose statistics. */
export const STATS_REQUEST = 'stats\r\n';

const untilEnd = frames.untilLine('END');
const ERROR_LINE = /^(ERROR|CLIENT_ERROR|SERVER_ERROR)\b/;

/** Frame check for a `stats` reply: its length once complete (through `END\r\n`, or one error line). */
export function statsReplyLength(bytes) {
  const firstLine = frames.line(bytes);
  if (firstLine !== undefined && ERROR_LINE.test(decodeUtf8(bytes.slice(0, firstLine)))) return firstLine;
  return untilEnd(bytes);
}

/** A reply that is not what `stats` answers. */
export class ProtocolError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ProtocolError';
  }
}

/** The `STAT` lines of a complete reply, as `{ name: value }` (text values), or a ProtocolError. */
export function parseStats(bytes) {
  const text = decodeUtf8(bytes);
  const lines = text.split('\r\n');
  if (lines.at(-1) === '') lines.pop();
  if (ERROR_LINE.test(lines[0])) throw new ProtocolError(`the server answered \`${lines[0]}\` to stats`);
  const stats = {};
  for (const line of lines) {
    if (line === 'END') return stats;
    const match = /^STAT (\S+) (.*)$/.exec(line);
    if (!match) throw new ProtocolError(`\`${line.slice(0, 80)}\` is not a STAT line`);
    stats[match[1]] = match[2];
  }
  throw new ProtocolError('the reply has no END line');
}

/**
 * A counter as a Number. memcached's counters are 64-bit; past 2^53 a Number loses precision
 * (this is a status figure, not an identifier, so the nearest double is acceptable).
 */
export function counter(stats, name) {
  const value = stats[name];
  if (value === undefined || !/^[0-9]+$/.test(value)) throw new ProtocolError(`stats has no counter ${name} (got ${JSON.stringify(value)})`);
  return Number(value);
}

/** What the plugin reports of a server, from its `stats`. */
export function serverFacts(stats) {
  return {
    pid: counter(stats, 'pid'),
    version: stats.version ?? '',
    uptimeSeconds: counter(stats, 'uptime'),
    currItems: counter(stats, 'curr_items'),
    evictions: counter(stats, 'evictions'),
    memoryMiB: Math.floor(counter(stats, 'limit_maxbytes') / (1024 * 1024)),
  };
}
