#!/usr/bin/env bash
# Creates .venv (if missing) and installs jaxsprint with the given extras.
# Usage: scripts/setup_env.sh [extras]   e.g. scripts/setup_env.sh test,plot
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
SPEC="."
if [ -n "$EXTRAS" ]; then SPEC=".[${EXTRAS}]"; fi
# Re-run pip only when pyproject.toml changed since the last install with these extras.
STAMP=".venv/.jaxsprint-installed-${EXTRAS:-base}"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  .venv/bin/python -m pip install --quiet -e "$SPEC"
  touch "$STAMP"
fi
# Build the native CPU kernels now rather than on first use (jaxsprint/train/cpu/kernels.py; a few seconds, cached
# per user and CPU). Without a C++ compiler jaxsprint uses XLA's kernels instead.
JAX_PLATFORMS=cpu .venv/bin/python -c "from jaxsprint.train.cpu import kernels; print('native CPU kernels:', 'built' if kernels.available() else 'unavailable (' + kernels.unavailable_reason() + ')')"
