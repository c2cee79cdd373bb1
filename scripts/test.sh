#!/usr/bin/env bash
# One command: install what the tests need, then run lint, type check and the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
