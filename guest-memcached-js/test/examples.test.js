// README.md's example plugin (examples/hello.js) decides as the README says, through the same
// export edge the component uses.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { exportPlugin } from '../sdk/index.js';
import { ScriptedApp, observation } from '../sdk/testing.js';
import { helloPlugin } from '../examples/hello.js';

test("the README's hello plugin applies one ConfigMap per parent", () => {
  const exported = exportPlugin(helloPlugin, new ScriptedApp());
  const decision = exported.reconcile(observation({ metadata: { name: 'demo' } }).raw());
  assert.deepEqual(decision.actions, [
    { tag: 'apply', val: '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"demo-hello","labels":{}},"data":{"greeting":"hello"}}' },
  ]);
  assert.equal(decision.requeueAfterMs, undefined);
});

test('README.md shows examples/hello.js as it is', () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const example = readFileSync(new URL('../examples/hello.js', import.meta.url), 'utf8');
  const body = example.slice(example.indexOf('export const helloPlugin'));
  assert.ok(readme.includes(body.trim()), 'copy examples/hello.js (from `export const helloPlugin`) into README.md');
});
