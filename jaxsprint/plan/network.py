r"""Emulated runs of the network the plan is for: the trainer under a candidate's predicted draws.

:class:`NetworkEmulator` stands where :class:`jaxsprint.plan.emulator.Emulator` stands in the planner (the same
``run(spec) -> RunResult``, ``key_fields`` and ``max_updates``), but trains a network of the zoo
(``jaxsprint.train.models``) on any dataset the trainer reads, through
`jaxsprint.train.trainer.train_and_evaluate` with ``config.async_emulation``: each update's gradient is
``tau`` updates stale (the delayed-gradient transform) and its mini-batch is ``m`` examples of the run's
batch (one example per sub-batch, ``m`` drawn from the spec's mini-batch pmf). So the plan's numbers
describe that network on that data, not an 8x8 proxy.

**Batch.** Each run trains at its own batch: the mini-batch below which 99.9% of its non-empty draws fall
(the rest are lumped there), so a run's cost follows its candidate's mini-batch. A run that diverges (the
trainer's non-finite guard) counts as never reaching the target from there on, and so does a training that
has gone less than 10% of the way from its first evaluation to the target in the first quarter of its updates
(`stalled`: such runs, at high staleness and large batches, cost the most and do not arrive).

**Empty cycles.** The trainer's random mini-batch never draws ``m = 0`` (an update with no gradient changes
nothing, so it draws again), and the spec's staleness pmf is already the one of non-empty updates. The
planner counts every updater cycle, so a run's ``s`` trained updates are ``s / (1 - P(m = 0))`` cycles; its
evaluation points and its length are reported in cycles.

**BatchNorm.** Where the spec knows its sub-batch (``RunSpec.sub_batch``: the planner's candidates at
mini-batch scale 1, the runtime's measured runs), the batch is whole sub-batches, each normalised on its own
as SPRINT's learners do. Otherwise statistics are taken over the whole batch (zero-weight examples included).

**Cost.** A run is ``seeds`` trainings of at most ``max_updates`` cycles each, stopped once the mean of the
last 3 evaluations reaches the target (later evaluations repeat the last one). A measured noise scale lets
the planner fit only S_min and the staleness factor, so fewer runs are needed (docs/planning.md).
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from jaxsprint.errors import ConfigError, NonFiniteError, check
from jaxsprint.plan import emulator
from jaxsprint.train import data as data_lib
from jaxsprint.train import models, optim

__all__ = ["NetworkEmulator", "STOP_EVALS", "VERSION", "stalled"]

VERSION = 3      # bump when a change here changes the runs' results (the cache key holds it)
STOP_EVALS = 3   # evaluations averaged for the stop at the target
TAIL_MASS = 0.999  # the share of non-empty mini-batch draws a run's batch covers exactly
STALL_CHECK, STALL_PROGRESS = 0.25, 0.1  # a training that has not gone 10% of the way to the target in 25% of
                                         # its updates is stopped (it would take the longest and never arrive)


class NetworkEmulator:
    """Trains `base`'s network under a :class:`jaxsprint.plan.emulator.RunSpec`'s draws.

    Args:
      base: a training config (``experiments/configs/default.py`` form) naming the model, dataset, image size,
        optimizer (its momentum and weight decay are the updater's) and BN; batch, devices, schedule, learning
        rate, evaluation and the emulation are set per run.
      seeds: trainings per run (sequential; seeds 0..seeds-1 offset by ``base.seed``).
      max_updates: cycles per run at most (a run that has not reached the target by then is censored).
      eval_every: cycles between evaluations.
      target_accuracy: stop a training once it is reached (None: train max_updates cycles).

    Raises:
      ConfigError: a model outside the zoo, or bad sizes.
    """

    def __init__(self, base, *, seeds: int = 2, max_updates: int = 1500, eval_every: int = 25,
                 target_accuracy: float | None = None):
        check(base.model in models.MODELS, "config.model", base.model,
              f"one of {', '.join(emulator.PROXY_MODELS)} (proxies) or of the zoo: {', '.join(models.MODELS)}")
        for field, v, most in (("config.seeds", seeds, 64), ("config.max_updates", max_updates, emulator.MAX_UPDATES),
                               ("config.eval_every", eval_every, emulator.MAX_UPDATES)):
            check(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= most, field, v,
                  f"an integer in [1, {most}]")
        check(eval_every <= max_updates, "config.eval_every", eval_every,
              f"at most config.max_updates={max_updates} (at least one evaluation in a run)")
        self.base, self.model, self.seeds = base, base.model, seeds
        self.eval_every = eval_every
        self.num_evals = -(-max_updates // eval_every)
        self.max_updates = self.num_evals * eval_every
        self.target_accuracy = target_accuracy
        self.min_bucket = 1  # the planner's hint for the proxies' shared compilation; unused here
        self.num_train = data_lib.load_dataset(base).num_train

    def describe(self) -> str:
        b = self.base
        return (f"the network {b.model} on {b.dataset} at {b.image_size}x{b.image_size} (trained by the trainer, "
                f"{b.optimizer.name} momentum {b.optimizer.momentum})")

    def key_fields(self) -> dict[str, Any]:
        """Everything a run's result depends on beside the spec (for the cache key)."""
        b = self.base
        return {"version": emulator.CACHE_VERSION, "network_version": VERSION, "model": b.model,
                "data": b.dataset, "data_dir": b.data_dir, "image_size": b.image_size, "num_train": self.num_train,
                "optimizer": b.optimizer.to_dict(), "bn": b.bn.to_dict(), "dtype": b.dtype, "seed": b.seed,
                "label_smoothing": b.label_smoothing, "augment": b.augment.to_dict(), "seeds": self.seeds,
                "max_updates": self.max_updates, "eval_every": self.eval_every, "target": self.target_accuracy}

    def training_config(self, spec: emulator.RunSpec, seed: int):
        """The trainer's config of one training of a run: the draws of `spec`, seed `seed`."""
        mb = np.asarray(spec.minibatch_pmf, np.float64)
        p_empty = float(mb[0])
        check(p_empty < 1, "minibatch_pmf", mb[:4].tolist(), "some mass on non-empty updates")
        # Each run at its own batch (the trainer compiles every run anyway): the mini-batch that covers
        # TAIL_MASS of the non-empty draws; the rare larger ones are lumped there.
        sub = spec.sub_batch if spec.sub_batch and not np.any(mb[np.arange(mb.size) % spec.sub_batch != 0]) else 1
        counts = mb[::sub]  # P(K = k): k sub-batches of `sub` examples
        nonempty = counts[1:] / counts[1:].sum()
        bucket = int(np.searchsorted(np.cumsum(nonempty), TAIL_MASS) + 1)
        k_pmf = np.zeros(bucket + 1)
        k_pmf[1:] = nonempty[:bucket]
        k_pmf[bucket] += nonempty[bucket:].sum()
        stale = np.trim_zeros(np.asarray(spec.staleness_pmf, np.float64), "b")
        steps = max(1, math.ceil(self.max_updates * (1 - p_empty)))
        c = copy.deepcopy(self.base)
        with c.unlocked():
            c.seed = int(self.base.seed + seed)
            c.batch_size, c.eval_batch_size = bucket * sub, max(bucket * sub, 256)
            c.num_devices, c.grad_accum_steps = 1, 1
            c.bn.reduction, c.bn.group_size = ("global", 0) if sub == 1 else ("group", sub)
            c.num_train_steps = steps
            c.lr.base, c.lr.scaling, c.lr.schedule, c.lr.warmup_epochs = spec.learning_rate, "none", "constant", 0.0
            spe = optim.derive_hparams(c, self.num_train).steps_per_epoch
            c.eval_every_epochs = max(1.0, self.eval_every * (1 - p_empty)) / spe
            c.checkpoint_every_epochs, c.keep_checkpoints = 0.0, 1
            c.stop_at_accuracy = self.target_accuracy or 0.0
            c.stop_evals = STOP_EVALS
            c.polish.mode, c.progress_bar, c.log_every_steps = "none", False, 0
            c.noise_scale.enabled = False
            a = c.async_emulation
            a.enabled, a.sampler, a.max_staleness = True, "pmf", len(stale) - 1
            a.pmf = tuple(float(v) for v in stale / stale.sum())
            a.mitigation = spec.mitigation
            a.num_sub_batches, a.k_pmf = bucket, tuple(float(v) for v in k_pmf / k_pmf.sum())
        return c, 1.0 / (1 - p_empty)

    def run(self, spec: emulator.RunSpec, seed: int = 0) -> emulator.RunResult:
        """Trains ``self.seeds`` copies under `spec`; the accuracy curves at every ``eval_every`` cycles."""
        from jaxsprint.train import trainer

        grid = self.eval_every * np.arange(1, self.num_evals + 1, dtype=np.float64)
        curves = np.zeros((self.seeds, grid.size))
        t0 = time.perf_counter()
        for s in range(self.seeds):
            config, cycles_per_step = self.training_config(spec, seed * self.seeds + s)
            workdir = tempfile.mkdtemp(prefix="jaxsprint-plan-run-")
            stopped = False
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # the plan's report is the output, not the runs'
                    stopped = self._train(trainer, config, workdir)
            except NonFiniteError:  # diverged: its evaluations so far, then 0 (it never reaches the target)
                stopped = True
            finally:
                steps, acc = _eval_curve(workdir)
                shutil.rmtree(workdir, ignore_errors=True)
            if stopped:
                steps, acc = np.append(steps, steps[-1] + 1 if steps.size else 1), np.append(acc, 0.0)
            if not steps.size:
                raise ConfigError("config.max_updates", self.max_updates, "long enough for one evaluation")
            # The accuracy at each grid point: the last evaluation at or before it (0 before the first);
            # after a stop at the target, the last evaluation holds.
            at = np.searchsorted(steps * cycles_per_step, grid, side="right") - 1
            curves[s] = np.where(at >= 0, acc[np.maximum(at, 0)], 0.0)
        return emulator.RunResult(grid, curves, False, time.perf_counter() - t0)

    def _train(self, trainer, config, workdir: str) -> bool:
        """Trains `config` in `workdir`; True when it was stopped for a stall (`stalled` after the first
        `STALL_CHECK` of its updates: it then counts as never reaching the target). The check point is a
        checkpoint, and the rest of the run resumes from it bit for bit."""
        if not self.target_accuracy:
            trainer.train_and_evaluate(config, workdir)
            return False
        check_at = max(1, int(config.num_train_steps * STALL_CHECK))
        summary = trainer.train_and_evaluate(config, workdir, stop_after_steps=check_at)
        accuracy = _eval_curve(workdir)[1]
        if summary["steps"] < check_at or trainer.reached_target(config, list(accuracy)):  # at the target
            return False
        if stalled(accuracy, self.target_accuracy):
            return True
        trainer.train_and_evaluate(config, workdir)
        return False


def stalled(accuracy: np.ndarray, target: float) -> bool:
    """Whether a training has covered less than `STALL_PROGRESS` of the way from its first evaluation to the
    target (the best evaluation so far)."""
    if accuracy.size < 2:
        return False
    return float(accuracy.max()) < accuracy[0] + STALL_PROGRESS * (target - accuracy[0])


def _eval_curve(workdir: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, top-1) of a run's evaluations, from its metrics.jsonl (none when it has none)."""
    steps, acc = [], []
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return np.zeros(0), np.zeros(0)
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "eval_accuracy" in rec:
                steps.append(rec["step"])
                acc.append(rec["eval_accuracy"])
    return np.asarray(steps, np.float64), np.asarray(acc, np.float64)
