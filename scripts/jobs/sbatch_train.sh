#!/usr/bin/env bash
#SBATCH --job-name=jaxsprint-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=16
#SBATCH --time=01:00:00
#SBATCH --output=%x-%j.out
# Trains with one process per SLURM task: srun starts them, jaxsprint.cluster joins them through JAX's SLURM
# detection (coordinator: the step's first node; its port from the job id, or JAX_COORDINATOR_PORT).
# Submit from the repository's root, with the workdir on a file system every node sees:
#
#   sbatch scripts/jobs/sbatch_train.sh --config=experiments/configs/default.py --workdir=runs/slurm
#   sbatch --nodes=1 --ntasks-per-node=4 --gpus-per-task=1 scripts/jobs/sbatch_train.sh ...  # one task per GPU
#
# Settings (environment): PYTHON (default: .venv/bin/python of the submit directory, else python3), SCRIPT
# (default experiments/train.py; experiments/run_sprint.py with a SPRINT config runs SPRINT the same way).
# Running the launcher in this script without srun is refused (SLURM_NTASKS > 1 outside a step): every task
# must be started by srun.
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
srun "$PYTHON" "${SCRIPT:-experiments/train.py}" "$@"
