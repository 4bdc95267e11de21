r"""Calibrate a machine preset (experiments/calibrate.py): time this project's CIFAR ResNets and all-reduces, fit.

About 3-4 minutes on 2 cores (refitting saved measurements instead: about 30 s):

  .venv/bin/python experiments/calibrate.py --config=experiments/configs/calibrate.py \
      --out=runs/calibrate/this_machine.json
  .venv/bin/python experiments/calibrate.py --config.measurements=runs/calibrate/this_machine.json \
      --out=runs/calibrate/refit.json

``measurements`` also reads the small-CNN calibration set ``docs/perf-calibration.json``. The tuples also take
comma-separated text on the command line (``--config.batches=4,16,64``; ``--config.holdout_batches=()`` holds
nothing out).
"""
import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # What is measured (or read): the steps of this project's models and the all-reduces.
    c.measurements = config_dict.placeholder(str)  # refit this file's measurements instead of measuring
    c.base = "cpu"                  # preset the fit starts from (jaxsprint.perf.machines.PRESETS)
    c.name = "this_machine"         # name of the written preset (base's own name: a refit of it, its description kept)
    c.models = ("resnet8", "resnet20", "resnet32", "resnet56")  # models to time (with a zoo cost table)
    c.batches = (4, 8, 16, 32, 64)  # batch sizes of the step timings
    c.cpu_kernels = "auto"          # CPU switch of the timed steps, as config.cpu_kernels of training
    c.one_core = True               # time the steps pinned to one CPU (one learner per core, as the preset)
    c.rounds = 4                    # interleaved timing rounds (each step's best round median is kept)
    c.min_time_s = 0.2              # time each step at least this long per round
    c.ranks = (2, 3, 4)             # process counts of the all-reduce timings (empty: none)
    c.allreduce_bytes = (4096, 65536, 1048576, 4194304, 16777216)  # message sizes, bytes per rank
    c.allreduce_reps = 10           # all-reduces timed per size and round
    c.allreduce_timeout_s = 120.0   # stop the all-reduce processes after this long

    # What is held out of the fit (and predicted).
    c.holdout_batches = (8, 32)     # batch sizes held out
    c.holdout_models = ()           # models held out
    c.holdout_fraction = 0.0        # also hold out this random share of the steps (in [0, 1))
    c.holdout_seed = 0              # seed of that share
    c.leave_one_model_out = True    # also refit once per model without its steps and report their errors

    # The fit (jaxsprint.calibration.model_fit.fit).
    c.fit_fields = ("efficiency_fwd", "efficiency_bwd_weight", "cache_miss_slowdown_weight_grad",
                    "half_efficiency_rows", "half_efficiency_batch", "per_layer_overhead_s",
                    "half_efficiency_depth", "norm_memory_efficiency")  # compute figures fitted to the steps
    c.bounds = ""                   # bounds of fitted figures, "name=lo:hi,..." (empty: model_fit.default_bounds)
    c.fixed = ()                    # figures held at their values of calibrate.FIXED (its reasons their sources)
    c.loss = "squared"              # loss of the log-errors: squared, or soft_l1 (robust)
    c.loss_scale = 0.1              # scale of the soft_l1 loss, in log units
    c.seed = 0                      # seed of the fit's random starts
    c.starts = 6                    # starting points of each fit (the preset's values and random ones)
    c.lock()
    return c
