// Whether a component is synchronous, as policy-host requires: no component-model async
// builtins (`context.get`, `task.return`, `waitable-set.*`, `subtask.*`, `stream.*`,
// `future.*`, `error-context.*`, `backpressure.*`, `yield`, `thread.*`), no `async` lift or
// lower, and no WASI 0.3 import. The world alone (`jco wit`) does not show it: a QuickJS
// component built without `--sync` has the same world as one built with it, and uses
// `context.get` and `waitable-set.new` inside (policy-host refuses it: PluginNeedsAsync).
// So this reads the component's text (`jco print`, wasm-tools' printer).
//
//   node tools/check-sync.mjs dist/memcached.wasm     # exit 1, with the offending lines, if not

import { execFileSync } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const jco = join(dirname(fileURLToPath(import.meta.url)), '..', 'node_modules', '.bin', 'jco');

const ASYNC_BUILTIN = /\(canon (context\.|task\.|waitable|subtask\.|stream\.|future\.|error-context\.|backpressure\.|yield|thread\.)/;
const ASYNC_OPTION = /\(canon (lift|lower)\b.*\basync\b/;
// Only declarations, not data segments that might spell the same words.
const DECLARATION = /^\s*\((core func|func|import|export|alias)\b/;

/** The lines of `component`'s text that make it asynchronous (empty when it is synchronous). */
export async function asyncParts(component) {
  const dir = await mkdtemp(join(tmpdir(), 'check-sync-'));
  try {
    const wat = join(dir, 'component.wat');
    execFileSync(jco, ['print', component, '-o', wat], { stdio: ['ignore', 'ignore', 'inherit'] });
    const found = [];
    for await (const line of createInterface({ input: createReadStream(wat) })) {
      if (!DECLARATION.test(line)) continue;
      if (ASYNC_BUILTIN.test(line) || ASYNC_OPTION.test(line) || /"wasi:[a-z-]+\/[a-z-]+@0\.3\./.test(line)) {
        found.push(line.trim().slice(0, 160));
      }
    }
    return found;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const component = process.argv[2];
  const found = await asyncParts(component);
  if (found.length > 0) {
    console.error(`${component} is not a synchronous WASI 0.2 component; policy-host would refuse it:\n  ${found.slice(0, 10).join('\n  ')}`);
    process.exit(1);
  }
  console.log(`${component}: synchronous (no component-model async builtin, async option or WASI 0.3 import)`);
}
