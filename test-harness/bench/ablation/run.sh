#!/usr/bin/env bash
# Where the filter's Envoy CPU goes: builds the filter once per ablation variant (each leaves one
# part of the per-request work out; filter-ablation.patch, applied in a throwaway git worktree,
# never to the working tree) and runs `bench overhead` on each, the variants interleaved round
# by round so drift in the machine's load hits them alike. Prints, per run, the Envoy CPU µs per
# request the module adds over plain Envoy in the same run (closed loop and sequential), the
# req/s ratio and the added p50, per body size; then the medians per variant and size.
#
#   test-harness/bench/ablation/run.sh [ROUNDS] [VARIANT ...]
#
# Variants: full (the shipped filter), floor (full, requests to a path it does not route),
# nobody (holds the body, never reads it), noroute (reads and parses it, no decision, no
# headers), nodecision (+ snapshot read, cluster and endpoint headers, clear_route_cache),
# nocrc (full without clear_route_cache), noresp (full without the response callbacks' work),
# noprop (no upstream.address read), nousage (no usage scan), noprefix (no prefix index page
# read or write: every prompt looks uncached), nometrics (no per-request metric
# calls), parse2 (parses the body twice), get10 / set10 / now10 / hdr10 (ten extra shared-data
# reads / writes / clock reads / header writes per request: the unit cost of a host call).
# Default: 3 rounds of floor nodecision full. nobody and noroute set no routing headers, and
# the bench's route takes its cluster from the filter's header: their requests fail (reported
# as failed, no figures); nodecision sets them.
# Needs ./build.sh setup (Envoy in .venv, binaryen) and a built workspace (./build.sh build).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
rounds="${1:-3}"
shift || true
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(floor nodecision full)
target="${CARGO_TARGET_DIR:-$HOME/.cache/wasm-llm-router/target}"
export CARGO_TARGET_DIR="$target"
export ENVOY_BIN="${ENVOY_BIN:-$repo/.venv/bin/envoy}"
bench="$target/release/bench"
[ -x "$bench" ] || { echo "ablation: $bench missing (./build.sh build)" >&2; exit 2; }
out="$target/bench/ablation"
mkdir -p "$out"
work="$(mktemp -d)"
cleanup() {
  git -C "$repo" worktree remove --force "$work/tree" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
git -C "$repo" worktree add --detach "$work/tree" HEAD >/dev/null
git -C "$work/tree" apply "$here/filter-ablation.patch"
for v in "${variants[@]}"; do
  name="$v"
  [ "$v" = floor ] && name=full
  abl="$name"
  [ "$name" = full ] && abl=""
  # A target dir of their own: the workspace's filter build stays as it was.
  (cd "$work/tree" && LLMR_ABL="$abl" CARGO_TARGET_DIR="$out/target" cargo build --quiet \
    --profile wasm --target wasm32-wasip1 -p llm-router-wasm)
  wasm-opt -O3 -g "$out/target/wasm32-wasip1/wasm/llm_router_filter.wasm" -o "$out/$name.wasm"
done
summary="$out/summary.txt"
: >"$summary"
for r in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    name="$v" extra=()
    [ "$v" = floor ] && name=full extra=(--pass-through)
    LLM_ROUTER_FILTER_WASM="$out/$name.wasm" "$bench" overhead --requests 400 --rps-secs 4 --arms envoy,envoy_filter \
      "${extra[@]}" >"$out/$v.$r.json.txt" 2>&1
    python3 - "$out/$v.$r.json.txt" "$v" <<'PY' | tee -a "$summary"
import json, sys
text = open(sys.argv[1]).read()
cases = json.loads(text[text.index('['):])
def case(c):
    # A variant whose requests failed has no figures (e.g. one that never sets the routing
    # headers the route needs): say so instead of stopping the rounds.
    if c['filter_cpu_us'] is None or c['filter_seq_cpu_us'] is None:
        return "%dB failed errors=%d" % (c['body_bytes'], c['errors'])
    return "%dB added_cpu_us=%.0f seq_added_cpu_us=%.0f rps_ratio=%.2f added_p50_ms=%.3f" % (
        c['body_bytes'], c['filter_cpu_us'] - c['plain_cpu_us'],
        c['filter_seq_cpu_us'] - c['plain_seq_cpu_us'], c['rps_ratio'], c['added_p50_ms'])
print(sys.argv[2], *[case(c) for c in cases])
PY
  done
done
python3 - "$summary" <<'PY'
import re, statistics, sys
# Per variant, per body size: the added CPU and the req/s ratio of each round (bench overhead
# reports every body size it ran: 200 B, 2 KB, 16 KB, 200 KB).
rows = {}
case = re.compile(r"(\d+)B added_cpu_us=(-?[\d.]+) seq_added_cpu_us=(-?[\d.]+) rps_ratio=([\d.]+)")
for line in open(sys.argv[1]):
    v = line.split()[0]
    for size, cpu, _seq, ratio in case.findall(line):
        rows.setdefault(v, {}).setdefault(int(size), []).append((float(cpu), float(ratio)))
print("\nmedians over rounds, per body size: added Envoy CPU µs/request, req/s ratio")
for v, sizes in rows.items():
    cols = []
    for size in sorted(sizes):
        runs = sizes[size]
        cpu = statistics.median(r[0] for r in runs)
        ratio = statistics.median(r[1] for r in runs)
        cols.append(f"{size} B: {cpu:5.0f} µs {ratio:.2f}")
    n = max(len(r) for r in sizes.values())
    print(f"{v:>11} | " + " | ".join(cols) + f"  ({n} runs)")
PY
