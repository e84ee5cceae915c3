// Which specs run, and what the message says when one does not: one row per situation.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DEFAULT_REPLICAS, DEFAULT_VERSION, readSpec } from '../src/spec.js';

test('spec validation table', () => {
  const rows = [
    ['an empty spec runs three servers of Debian 12 memcached, 64 MiB each', {}, undefined],
    ['zero servers is a pool scaled to zero', { replicas: 0 }, undefined],
    ['sixteen servers is the most', { replicas: 16 }, undefined],
    ['an image overrides the version', { image: 'registry.example/memcached:1.6.18-custom' }, undefined],
    ['negative replicas are refused', { replicas: -1 }, 'spec.replicas'],
    ['seventeen servers are refused', { replicas: 17 }, 'spec.replicas'],
    ['fractional replicas are refused', { replicas: 1.5 }, 'spec.replicas'],
    ['replicas as text are refused', { replicas: '3' }, 'spec.replicas'],
    ['8 MiB is too small for memcached', { memoryMiB: 8 }, 'spec.memoryMiB'],
    ['memory beyond 64 GiB is refused', { memoryMiB: 65537 }, 'spec.memoryMiB'],
    ['a version that is not x.y.z is refused', { version: 'latest' }, 'spec.version'],
    ['an image with a space is refused', { image: 'memcached 1.6' }, 'spec.image'],
  ];
  for (const [situation, raw, field] of rows) {
    const { problem } = readSpec(raw);
    if (field === undefined) assert.equal(problem, undefined, situation);
    else assert.match(problem ?? '', new RegExp(field.replace('.', '\\.')), situation);
  }
});

test('a spec that is not a mapping is refused, not read as defaults', () => {
  for (const raw of ['three', 3, null, []]) assert.match(readSpec(raw).problem, /not an object/, JSON.stringify(raw));
});

test('defaults: three servers, 64 MiB, memcached:<Debian 12 version>', () => {
  assert.deepEqual(readSpec({}).spec, { replicas: DEFAULT_REPLICAS, memoryMiB: 64, version: DEFAULT_VERSION, image: `memcached:${DEFAULT_VERSION}` });
});
