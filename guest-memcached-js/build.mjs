// Builds the plugin component from src/component.js, a synchronous WASI 0.2 component of world
// `policy-host:policy/policy-plugin@0.2.2` (../wit/frozen/0.2.2/policy.wit: the contract version
// this plugin pins; the host serves every frozen minor, so a contract bump does not break this
// build), with one of two JavaScript
// engines from npm (run through ./build.sh or `npm run build` after `npm ci`):
//
//   node build.mjs                  # both
//   node build.mjs starlingmonkey   # dist/memcached.wasm      componentize-js (SpiderMonkey), ~12 MiB
//   node build.mjs quickjs          # dist/memcached-qjs.wasm  componentize-qjs (QuickJS), ~1.2 MiB
//
// Synchronous, WASI 0.2: policy-host runs synchronous components of WASI 0.2 only and refuses
// component-model async (`PluginNeedsAsync`). Each engine is kept synchronous its own way,
// and every build is checked (tools/check-sync.mjs: no async builtin, no async lift/lower,
// no WASI 0.3 import), so a toolchain upgrade that changes its default fails here:
// - componentize-js 0.23.0 has no async switch: it always lifts exports and lowers imports
//   synchronously (an `async` JS export runs to completion inside the call), and its engine
//   imports WASI 0.2.x. A property of this version, so it is pinned exactly.
// - componentize-qjs 0.4.5 defaults to the component-model async ABI (its components use
//   `context.get`, `waitable-set.new`, ...): `--sync` is the flag that keeps it synchronous.
//
// Other pinned options, and why:
// - componentize-js `enableAot: false`: weval's AOT downloads a binary from GitHub at first
//   use; the project's machines reach npm only.
// - componentize-js `disableFeatures: random, clocks, http, fetch-event`: the plugin has no
//   clock but the observation's, no randomness (decisions must be reproducible) and no network
//   but the host's imports. `stdio` stays: an uncaught error prints its stack to stderr, which
//   the host shows when an instance traps.
// - componentize-qjs `--opt-size` (its smaller runtime) and `--module-root .` (the folder the
//   entry module's relative imports resolve in).

import { execFileSync } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { componentize } from '@bytecodealliance/componentize-js';

import { asyncParts } from './tools/check-sync.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const entry = join(here, 'src', 'component.js');
const wit = join(here, '..', 'wit', 'frozen', '0.2.2', 'policy.wit');
const bin = (name) => join(here, 'node_modules', '.bin', name);

const engines = {
  async starlingmonkey(output) {
    const { component } = await componentize({
      sourcePath: entry,
      witPath: wit,
      worldName: 'policy-plugin',
      enableAot: false,
      disableFeatures: ['random', 'clocks', 'http', 'fetch-event'],
    });
    await writeFile(output, component);
  },
  async quickjs(output) {
    execFileSync(
      bin('componentize-qjs'),
      ['--wit', wit, '--js', entry, '--module-root', here, '--world', 'policy-plugin', '--sync', '--opt-size', '--output', output],
      { stdio: ['ignore', 'ignore', 'inherit'] },
    );
  },
};
const outputs = { starlingmonkey: 'memcached.wasm', quickjs: 'memcached-qjs.wasm' };

const chosen = process.argv.slice(2);
for (const name of chosen) {
  if (!engines[name]) {
    console.error(`unknown engine \`${name}\`; choose starlingmonkey or quickjs (or none, for both)`);
    process.exit(2);
  }
}
await mkdir(join(here, 'dist'), { recursive: true });
for (const name of chosen.length > 0 ? chosen : Object.keys(engines)) {
  const output = join(here, 'dist', outputs[name]);
  const started = performance.now();
  await engines[name](output);
  const seconds = (performance.now() - started) / 1000;
  const found = await asyncParts(output);
  if (found.length > 0) {
    console.error(`${output} is not a synchronous WASI 0.2 component; policy-host would refuse it:\n  ${found.slice(0, 10).join('\n  ')}`);
    process.exit(1);
  }
  const { size } = await import('node:fs').then((fs) => fs.statSync(output));
  const imports = execFileSync(bin('jco'), ['wit', output], { encoding: 'utf8' })
    .split('\n')
    .filter((line) => line.trim().startsWith('import '))
    .map((line) => line.trim().replace(/^import |;$/g, ''));
  console.log(`${output} (${name}): ${size} bytes (${(size / 2 ** 20).toFixed(2)} MiB), built in ${seconds.toFixed(1)} s; synchronous`);
  console.log(`  imports: ${imports.join(', ')}`);
}
