#!/usr/bin/env bash
# Builds dist/memcached.wasm (componentize-js) and dist/memcached-qjs.wasm (componentize-qjs)
# from a fresh checkout: installs the pinned toolchain from npm (package-lock.json; nothing
# else is downloaded), runs the native tests, componentizes and checks each component is
# synchronous (build.mjs says which flags are pinned and why). With a built policy-host
# (`POLICY_HOST=path/to/policy-host`, or target/debug/policy-host of this checkout), it also
# checks each as the host would load it.
set -euo pipefail
cd "$(dirname "$0")"

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
	npm ci --no-audit --no-fund
fi
npm test
node build.mjs "$@"

host=${POLICY_HOST:-../target/debug/policy-host}
if [ -x "$host" ]; then
	for component in dist/*.wasm; do
		"$host" validate "$component"
	done
else
	echo "no policy-host at $host: skipped \`policy-host validate\` of dist/*.wasm (set POLICY_HOST)"
fi
