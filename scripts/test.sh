#!/usr/bin/env bash
# Creates .venv if missing, installs the test extras and runs the pytest suite, without the tests marked slow
# (end-to-end runs of the benchmark and study scripts: scripts/test.sh -m slow runs those, -m "" everything).
# Extra arguments go to pytest, e.g. scripts/test.sh -k optim
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh test,plot
exec .venv/bin/python -m pytest -n 2 -m "not slow" "$@"
