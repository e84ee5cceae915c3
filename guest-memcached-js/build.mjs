// Builds the plugin component: src/component.js → dist/memcached.wasm, a synchronous WASI 0.2
// component of world `policy-host:policy/policy-plugin@0.2.2` (../wit/policy.wit), with
// componentize-js (SpiderMonkey, through StarlingMonkey) from npm. Run through ./build.sh or
// `npm run build` after `npm ci`.
//
// Synchronous, WASI 0.2: policy-host runs synchronous components of WASI 0.2 only and refuses
// component-model async (`PluginNeedsAsync`). componentize-js 0.23.0 has no async switch: it
// always lifts exports and lowers imports synchronously (an `async` JS export is run to
// completion inside the call) and its engine imports WASI 0.2.x. That is a property of this
// exact version, so it is pinned exactly in package.json, and the build checks the result:
// the component's world (`jco wit`) must have no `async` function, no `stream`/`future` and
// no WASI 0.3 import, or the build fails. (The QuickJS path, componentize-qjs, defaults to
// async and needs its `--sync` flag; it is not used here.)
//
// Pinned options, and why:
// - enableAot: false — weval's AOT downloads a binary from GitHub at first use; the project's
//   machines reach npm only.
// - disableFeatures: random, clocks, http, fetch-event — the plugin has no clock but the
//   observation's, no randomness (decisions must be reproducible) and no network but the
//   host's imports. `stdio` stays: an uncaught error prints its stack to stderr, which the
//   host shows when an instance traps.

import { execFileSync } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { componentize } from '@bytecodealliance/componentize-js';

const here = dirname(fileURLToPath(import.meta.url));
const output = join(here, 'dist', 'memcached.wasm');

const started = performance.now();
const { component } = await componentize({
  sourcePath: join(here, 'src', 'component.js'),
  witPath: join(here, '..', 'wit', 'policy.wit'),
  worldName: 'policy-plugin',
  enableAot: false,
  disableFeatures: ['random', 'clocks', 'http', 'fetch-event'],
});
const seconds = (performance.now() - started) / 1000;
await mkdir(dirname(output), { recursive: true });
await writeFile(output, component);

const world = execFileSync(join(here, 'node_modules', '.bin', 'jco'), ['wit', output], { encoding: 'utf8' });
const asyncParts = world.split('\n').filter((line) => /\basync\b|\bstream<|\bfuture<|@0\.3\./.test(line));
if (asyncParts.length > 0) {
  console.error(`${output} is not a synchronous WASI 0.2 component; policy-host would refuse it:\n${asyncParts.join('\n')}`);
  process.exit(1);
}
const imports = world.split('\n').filter((line) => line.trim().startsWith('import ')).map((line) => line.trim());
console.log(`${output}: ${component.length} bytes (${(component.length / 2 ** 20).toFixed(2)} MiB), componentized in ${seconds.toFixed(1)} s`);
console.log(`imports (synchronous, WASI 0.2):\n  ${imports.join('\n  ')}`);
