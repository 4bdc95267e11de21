r"""The SPRINT model judged against the runtime over a grid (experiments/validate_runtime.py).

The SPRINT config of every run (``sprint.py``; its ``--config.<field>`` overrides reach every run) plus
``config.validation``, the grid and the predictions. The validation grid takes about 30-40 minutes on a quiet
2-core machine, the calibration grid about 12, the random one (12 configurations) about 10-20:

  python experiments/validate_runtime.py --config=experiments/configs/validate_runtime.py \
      --out=runs/validate_runtime
  python experiments/validate_runtime.py --config.validation.grid=calibration --out=docs/runtime-calibration-runs
  python experiments/validate_runtime.py --config.validation.grid=random --out=runs/validate_runtime_random
"""
import ml_collections
from ml_collections import config_dict

from experiments.configs import sprint


def get_config() -> ml_collections.ConfigDict:
    c = sprint.get_config()
    c.validation = ml_collections.ConfigDict()
    v = c.validation
    # validation: the 20 configurations the model is judged on; calibration: 10 others, whose runs
    # calibrate_runtime.py (calibration.runs_from) fits the preset to, so that it never sees the validation grid;
    # random: num_random configurations drawn from the whole space (jaxsprint.calibration.grids.draw: 1-2 hosts,
    # 1-8 learners per host, sub-batch 8-128, network 0-100 ms, each with its own updater placement), none a
    # calibration run (calibration grid, and the runs the preset's measurement file records).
    v.grid = "validation"
    v.num_random = 12               # grid=random: how many configurations
    v.random_seed = 0               # grid=random: the seed of the draw (names and configurations follow it)
    v.only = ()                     # run only these configurations of the grid (names); empty: all
    # The length of each run: enough gradients and updates after the warm-up (from the specs estimate).
    v.min_gradients = 2000          # gradients after the warm-up each run needs
    v.min_updates = 500             # updates after the warm-up each run needs
    v.warmup_s = 2.0                # warm-up cut of every run (config.sprint.warmup_s of the runs)
    v.max_duration_s = 180.0        # longest run (s)
    v.run_timeout_s = 900.0         # stop a run's processes after this long (s)
    v.updater_device = "own"        # config.sprint.updater_device of every run of a fixed grid; own: one device
    #                                 more, the updater's (grid=random: each configuration draws its own)
    # The predictions.
    v.machine = "cpu_runtime"       # machine preset of the specs prediction and of the durations
    v.machine_file = config_dict.placeholder(str)  # a preset file instead of machine
    # loo: each run from the preset refitted to the OTHER runs; preset: as it is; unset: loo, and preset with
    # grid=random (held out: the preset was fitted elsewhere; loo is refused there).
    v.specs = config_dict.placeholder(str)
    # An earlier --out of the same grid (e.g. the same random_seed): each run is also compared with that draw's
    # measurement of its configuration (the source "repeat": how far the machine repeats itself). Unset: none.
    v.repeat_of = config_dict.placeholder(str)
    return c
