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
TRAIN_END=$(date +%s)
# The SPRINT model's view of the run just made: 8 learners with sub-batch 64 whose measured step time is the
# learner time T_c, and an updater cycle of the same length (one update per step, as the synchronous run did).
STEP_S=$(.venv/bin/python -c "import json; print(json.load(open('$WORKDIR/summary.json'))['step_time_s'])")
echo
echo "SPRINT performance model, for the configuration just run (8 learners x sub-batch 64, T_c = T_u = measured step time):"
.venv/bin/python experiments/predict.py --workers=8 --sub_batch=64 --t_compute="$STEP_S" --t_compute_cv=0 \
    --t_update="$STEP_S" --dataset_size=1500 2>/dev/null
echo
echo "SPRINT performance model, for a real cluster (ResNet-50 on 16 TSUBAME-KFC/DL nodes x 8 K80 dies, sub-batch 32):"
.venv/bin/python experiments/predict.py --machine=tsubame_kfc_dl --network=resnet50 --nodes=16 --gpus_per_node=8 \
    --sub_batch=32 2>/dev/null
echo
echo "demo finished in $(( $(date +%s) - START )) s (training $(( TRAIN_END - START )) s); metrics, checkpoints and summary in $WORKDIR"
