// memcached's `stats` reply: where it ends and what it says.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ProtocolError, parseStats, serverFacts, statsReplyLength } from '../src/protocol.js';
import { statsReply } from './fixtures.js';

const bytes = (text) => new TextEncoder().encode(text);

test('a stats reply is complete at its END line, not before', () => {
  const reply = statsReply();
  assert.equal(statsReplyLength(bytes(reply.slice(0, 30))), undefined);
  assert.equal(statsReplyLength(bytes(reply.slice(0, -1))), undefined, 'END without its \\n');
  assert.equal(statsReplyLength(bytes(reply)), bytes(reply).length);
});

test('END inside a value does not end the reply; bytes after END are left for the next frame', () => {
  const reply = 'STAT version 1.6.18 END\r\nEND\r\nSTAT pid';
  assert.equal(statsReplyLength(bytes(reply)), 'STAT version 1.6.18 END\r\nEND\r\n'.length);
});

test('an error line is a whole reply, and parses as a protocol error', () => {
  for (const line of ['ERROR\r\n', 'SERVER_ERROR out of memory\r\n', 'CLIENT_ERROR bad command line format\r\n']) {
    assert.equal(statsReplyLength(bytes(line)), line.length, line);
    assert.throws(() => parseStats(bytes(line)), ProtocolError, line);
  }
});

test('the figures the status reports come from pid, uptime, version, curr_items, evictions, limit_maxbytes', () => {
  const facts = serverFacts(parseStats(bytes(statsReply({ pid: 7, uptime: 3600, items: 12, evictions: 5, maxbytes: 128 * 2 ** 20 }))));
  assert.deepEqual(facts, { pid: 7, version: '1.6.18', uptimeSeconds: 3600, currItems: 12, evictions: 5, memoryMiB: 128 });
});

test('a reply missing a counter, with a non-STAT line or without END is refused', () => {
  assert.throws(() => serverFacts(parseStats(bytes('STAT pid 1\r\nEND\r\n'))), /uptime/);
  assert.throws(() => parseStats(bytes('STAT pid 1\r\nVALUE x 0 1\r\nEND\r\n')), /not a STAT line/);
  assert.throws(() => parseStats(bytes('STAT pid 1\r\n')), /no END/);
});

test("a reply recorded from Debian 12's memcached 1.6.18 (one item stored) parses whole", async () => {
  // Recorded with `memcached -p 21211 -U 0 -l 127.0.0.1 -m 64 -c 1024` run as uid 65532 (the
  // test image's user), after `set k 0 0 5`: the bytes on the wire, CRLFs included.
  const { readFileSync } = await import('node:fs');
  const reply = readFileSync(new URL('./recorded/stats-memcached-1.6.18.txt', import.meta.url));
  const withNext = new Uint8Array([...reply, ...bytes('STAT')]);
  assert.equal(statsReplyLength(withNext), reply.length);
  const facts = serverFacts(parseStats(reply));
  assert.equal(facts.version, '1.6.18');
  assert.equal(facts.currItems, 1);
  assert.equal(facts.evictions, 0);
  assert.equal(facts.memoryMiB, 64);
  assert.ok(facts.pid > 0 && facts.uptimeSeconds >= 0);
});
