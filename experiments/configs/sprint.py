r"""SPRINT for real (jaxsprint.runtime): learner threads, one updater per host, ResNet-8 on digits at 16x16.

Built on `default.py` (data, model, bn, optimizer and lr fields keep their meaning) with momentum SGD and a
constant learning rate, plus ``config.sprint``. About 15-30 s on a 2-core laptop (10 s of training after
compilation):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/run_sprint.py \
      --config=experiments/configs/sprint.py --workdir=/tmp/jaxsprint_sprint

Fields that a SPRINT run does not use: ``batch_size`` / ``grad_accum_steps`` (the mini-batch is
``sprint.sub_batch`` x the gradients an update gathers), ``bn.reduction`` (BatchNorm always normalises over
one learner's sub-batch), ``num_epochs`` / ``num_train_steps`` (see ``sprint.*``), ``async_emulation``,
``seed`` (``sprint.seed`` is the run's seed), ``eval_every_epochs`` / ``checkpoint_every_epochs``.
"""
import ml_collections

from experiments.configs import default


def get_config() -> ml_collections.ConfigDict:
    c = default.get_config()
    c.image_size = 16
    c.model = "resnet8"
    c.eval_batch_size = 256
    c.progress_bar = False
    c.optimizer.name = "sgd"        # momentum SGD ("lars" works too)
    c.optimizer.momentum = 0.9
    c.optimizer.weight_decay = 5e-4
    c.lr.base = 0.1                 # peak = base * nominal mini-batch / reference_batch (linear scaling),
    c.lr.scaling = "linear"         # nominal mini-batch = sub_batch x learners (one gradient per learner)
    c.lr.warmup_epochs = 0.0
    c.lr.schedule = "constant"      # a decaying schedule runs over the update horizon (see schedule_updates)

    c.sprint = ml_collections.ConfigDict()
    # Learner threads per host (None: one per local device; more than the devices share them round-robin).
    c.sprint.learners_per_host = ml_collections.config_dict.placeholder(int)
    # Local devices the learners use (None: all; 1: every learner on the first device, e.g. one GPU).
    c.sprint.devices = ml_collections.config_dict.placeholder(int)
    # Where the updater's programs (all-reduce, optimizer step) run: "shared" = the first local device, which
    # learner 0 also uses (its programs queue behind that learner's step and the learner's behind them);
    # "own" = the last local device, which no learner may use (set devices below the local device count).
    c.sprint.updater_device = "shared"
    c.sprint.sub_batch = 32          # examples per learner gradient
    c.sprint.network_time_s = 0.0    # emulated network time added to each updater cycle's all-reduce
    c.sprint.lockstep = False        # True: synchronous check mode (one gradient per learner per update)
    # Stop at the first reached (0 = not used; at least one > 0).
    c.sprint.duration_s = 10.0       # wall seconds after the common start
    c.sprint.num_updates = 0         # published versions
    c.sprint.num_epochs = 0.0        # applied examples / training-set size
    c.sprint.warmup_s = 1.0          # events that start before this are the start-up transient
    c.sprint.eval_every_updates = 0  # evaluate the published weights every N updates (0: only at the end)
    # True: keep those weights and evaluate them after the run (needs num_updates), so that evaluation takes
    # no core from the run it measures; False: evaluate while the learners go on.
    c.sprint.eval_deferred = False
    c.sprint.schedule_updates = 1000  # lr schedule horizon when neither num_updates nor num_epochs is set
    c.sprint.seed = 0                # model init, data order and augmentation
    c.sprint.checkpoint = True       # save the last weights with orbax (process 0)
    c.sprint.join_timeout_s = 120.0  # bound on every wait for a thread (a learner's gradient, the updater)
    c.sprint.init_timeout_s = 60     # jax.distributed start-up bound (jaxsprint.cluster.initialize)
    return c
