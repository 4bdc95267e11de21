#!/usr/bin/env bash
# The main job on the built-in data: creates .venv if missing, installs jaxsprint, then trains ResNet-20 on
# the digits with a large batch, data-parallel over 8 devices (8 fake CPU devices here; real GPUs elsewhere).
# Extra arguments are passed to the launcher, e.g. scripts/demo.sh --config.num_epochs=10
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
WORKDIR="${WORKDIR:-runs/demo-$(date +%Y%m%d-%H%M%S)}"
if ! .venv/bin/python -c "import jax, sys; sys.exit(jax.default_backend() != 'cpu')" 2>/dev/null; then
  echo "accelerator found: using its devices"
else
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8"
fi
START=$(date +%s)
.venv/bin/python experiments/train.py --config=experiments/configs/default.py --workdir="$WORKDIR" "$@"
echo "demo finished in $(( $(date +%s) - START )) s; metrics, checkpoints and summary in $WORKDIR"
