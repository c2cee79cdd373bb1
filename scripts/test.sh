#!/usr/bin/env bash
# One command: install what the tests need, then run lint, type check and the whole suite.
# pytest runs on KVGATE_TEST_WORKERS processes (pytest-xdist, default 2): most tests wait on
# real servers, so two processes on two cores halve the wall time. tests/conftest.py keeps
# each module on one worker and the CPU-heavy modules on one worker, one at a time.
# KVGATE_TEST_WORKERS=0 runs everything in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
# Tests marked ``alone`` compare latencies of two same-run rows on real engines: they run
# after the parallel part, one at a time, with the machine to themselves.
rc=0
.venv/bin/python -m pytest -n "${KVGATE_TEST_WORKERS:-2}" --dist loadgroup -m "not alone" "$@" || rc=$?
.venv/bin/python -m pytest -p no:xdist -m alone "$@" || rc=$?
exit "$rc"
