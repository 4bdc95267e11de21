#!/usr/bin/env bash
# A SPRINT run (experiments/run_sprint.py) under mpirun: one process per host, each with its learners and its
# updater; the updaters all-reduce over gloo. Settings as scripts/jobs/mpirun_train.sh.
#
#   NP=2 scripts/jobs/mpirun_sprint.sh --config=experiments/configs/sprint.py --workdir=runs/sprint-mpi [--json]
set -euo pipefail
SCRIPT=experiments/run_sprint.py exec "$(dirname "${BASH_SOURCE[0]}")/mpirun_train.sh" "$@"
