r"""The time-to-accuracy planner (experiments/plan.py): ResNet-50's costs on a machine preset, a proxy on digits.

A few minutes on 2 cores (16 emulated runs of 4 seeds; cached runs cost nothing):

  .venv/bin/python experiments/plan.py --config=experiments/configs/plan.py \
      --config.machine=tsubame_kfc_dl --config.network=resnet50 --config.target_accuracy=0.95

``machine`` (or ``machine_file``), ``network`` and ``target_accuracy`` have no default and must be given.
The tuples (``staleness_limits``, ``minibatch_range``) also take comma-separated text on the command line:
``--config.staleness_limits=2,8,inf``. Mini-batches are in cluster samples; the proxy trains on
``B / minibatch_scale`` samples. With ``runtime_configs`` the launcher compares the law with the SPRINT runtime
instead of planning (``--workdir`` is then where the runtime writes its runs; see docs/planning.md).
"""
import math
import os

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # The cluster: its figures, the network whose costs give T_c and T_u, and the accuracy to reach.
    c.machine = config_dict.placeholder(str)        # machine preset (see experiments/search.py)
    c.machine_file = config_dict.placeholder(str)   # a calibrated preset (JSON) instead of machine
    c.network = config_dict.placeholder(str)        # network of the zoo (jaxsprint.perf.zoo)
    c.target_accuracy = config_dict.placeholder(float)  # test accuracy to reach, in (0, 1]; required

    # What the emulated runs train: a proxy at 8x8 (jaxsprint.plan.emulator: mlp, cnn, tiny_nobn) or the network
    # itself, any model of the zoo trained by the trainer (jaxsprint.plan.network: resnet8, resnet20, ...).
    c.data = "digits"               # digits, mnist5k, or a TFDS dataset prepared in data_dir
    c.data_dir = config_dict.placeholder(str)       # directory of a prepared TFDS dataset
    c.model = "mlp"                 # mlp, cnn or tiny_nobn (proxies), or a zoo model such as resnet8
    c.width = 64                    # hidden width of the proxy
    c.image_size = config_dict.placeholder(int)     # a zoo model's input side (None: the data's own, 8 or 28)
    # Or a training config file whose model, data, image size, BN and augmentation the runs train (batch,
    # schedule, learning rate and momentum stay the plan's), e.g. experiments/configs/noise_scale.py.
    c.train_config = ""
    # A measured gradient noise scale of that network on that data (its samples; experiments/configs/
    # noise_scale.py): the law then takes B_noise from it and fits S_min and the staleness factor only.
    c.b_noise = config_dict.placeholder(float)
    c.b_noise_se = 0.0

    # The configuration space (None: the machine's, or the largest sub-batch that fits, at most 4096).
    c.max_nodes = config_dict.placeholder(int)
    c.max_gpus_per_node = config_dict.placeholder(int)
    c.max_sub_batch = config_dict.placeholder(int)
    c.dataset_size = config_dict.placeholder(int)   # samples per epoch on the cluster (None: the proxy's set)
    c.minibatch_scale = config_dict.placeholder(float)  # cluster samples per proxy sample (None: derived)

    # Candidates: SPRINT's rule over a ladder of mean mini-batch targets and mean-staleness limits.
    c.minibatch_range = config_dict.placeholder(tuple)  # (lo, hi) in cluster samples (None: 8 and 256 x scale)
    c.ladder = 5                    # mini-batch targets on the ladder
    c.staleness_limits = (2.0, 4.0, 8.0, math.inf)  # mean-staleness limits of the candidates (> 1, or inf)
    c.max_staleness = config_dict.placeholder(float)  # limit on the chosen configuration's mean staleness
    c.tolerance = 0.05              # relative band of SPRINT's rule around a mini-batch target
    c.search_starts = 8             # starts of each gradient search

    # Training of the proxy: learning rate, momentum, jitter of the learners' compute time, seeds, length.
    c.lr_rule = "linear"            # linear (scaled with the mean mini-batch), lr_tau (also / staleness), none
    c.base_lr = 0.05                # proxy learning rate at reference_batch proxy samples
    c.reference_batch = 32.0        # proxy mini-batch of base_lr
    c.momentum = 0.5                # proxy SGD momentum (asynchrony adds its own, docs/planning.md)
    c.t_compute_cv = 0.05           # coefficient of variation of the learners' compute time
    c.seeds = 4                     # seeds per emulated run (vmapped)
    c.max_updates = 1500            # updates per run (a run that does not reach the target is censored)
    c.eval_every = 25               # updates between test evaluations

    # The budget of emulated runs: a space-filling first design, then runs where the law is least certain.
    c.budget_runs = 16              # emulated runs at most (cached ones included)
    c.initial_runs = 8              # runs of the first, space-filling design (at most budget_runs)
    c.runs_per_round = 2            # runs added per round where the fit is least certain
    c.cache_dir = os.path.join(os.path.expanduser("~"), ".cache", "jaxsprint", "plan")  # "" keeps nothing
    c.holdout = 0                   # after the plan, emulate this many held-out cells and report the law's error

    # Instead of a plan: learners:sub_batch:network_time_s configurations run on the SPRINT runtime here
    # (tiny_nobn on digits at 8x8), compared with the law's leave-one-out prediction from emulated runs.
    c.runtime_configs = ""          # comma-separated, e.g. "2:16:0,8:16:0.01"; empty: plan
    c.runtime_updates = 600         # updates per runtime run
    c.runtime_seeds = 1             # runtime runs per configuration (seeds 0, 1, ...; pooled, medians of the times)
    c.runtime_reuse = False         # read a finished run of the same config from --workdir instead of running
    c.lock()
    return c
