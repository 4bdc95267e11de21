"""The SPRINT updater: one thread per host, cycles back to back, all hosts applying the same update.

Cycle k (k = 0, 1, ...; docs/sprint-model.md, "The protocol this project models"):
  1. swap the node buffer: every gradient that arrived since the previous swap (lockstep mode: first wait
     until every local learner's gradient is there);
  2. emulated network: sleep ``network_time_s`` (on one host too: it stands for the all-reduce, so that
     T_u / T_c ratios this machine cannot reach can be set);
  3. with several hosts, all-reduce ``[sum of the result vectors | count | stop flag | error flag]`` across
     them (`jaxsprint.runtime.collective`);
  4. if the global count K > 0: apply the optimizer to the MEAN gradient of the realised mini-batch
     (sum / K, i.e. K x sub_batch examples), and move the BatchNorm running statistics by one EMA step
     toward the mean of the reported sub-batch statistics:
         running <- m running + (1 - m) (sum of reported statistics) / K,   m = config.bn.momentum;
     if K = 0 (an empty cycle): weights, statistics and optimizer state stay as they are (the optimizer is
     not stepped, so the schedule counts non-empty updates);
  5. publish version k + 1 (also after an empty cycle: this is what the model and the simulator assume).
A gradient read at version v and gathered in cycle k is applied in version u = k + 1: staleness
``u - 1 - v``. Every host all-reduces the same numbers and runs the same jitted program on them, so the
replicas stay bit-identical.

Stopping: after cycle k the run stops when ``duration_s`` has passed (on any host: each host's flag goes
through the all-reduce, so all hosts stop after the same cycle), or ``num_updates`` versions are published,
or the applied examples reach ``num_epochs`` x the training-set size, or any thread on any host failed.

Learning rate: the schedule is derived for the NOMINAL mini-batch, sub_batch x learners (what one update
holds in lockstep mode), by `nominal_hparams`, whatever mini-batch an update realises.

The per-update rows (version, global count, swap time, publish time) and the applied gradients' records
are kept in Python lists (appends only); `jaxsprint.runtime.run` turns them into the event log.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from jaxsprint.train import optim
from jaxsprint.runtime.buffer import Control, GradientRecord, NodeBuffer, Published
from jaxsprint.runtime.learner import POLL_S


def nominal_hparams(config, num_train: int, num_learners: int) -> optim.HParams:
    """Schedule bookkeeping of a SPRINT run for the nominal mini-batch ``sub_batch * num_learners``.

    An "epoch" of updates is ``max(1, n // nominal)``; the schedule's horizon is ``sprint.num_updates`` if
    set, else ``ceil(num_epochs * updates per epoch)`` if set, else ``sprint.schedule_updates``; warmup is
    ``lr.warmup_epochs`` epochs of updates; the peak rate follows ``lr.scaling`` for the nominal batch.
    """
    s = config.sprint
    nominal = int(s.sub_batch) * int(num_learners)
    per_epoch = max(1, num_train // nominal)
    if s.num_updates > 0:
        horizon = int(s.num_updates)
    elif s.num_epochs > 0:
        horizon = int(math.ceil(s.num_epochs * per_epoch))
    else:
        horizon = int(s.schedule_updates)
    warmup = min(int(round(config.lr.warmup_epochs * per_epoch)), horizon)
    peak = config.lr.base * nominal / config.lr.reference_batch if config.lr.scaling == "linear" else config.lr.base
    return optim.HParams(global_batch=nominal, accum_steps=1, micro_batch=nominal, steps_per_epoch=per_epoch,
                         total_steps=horizon, warmup_steps=warmup, peak_lr=float(peak),
                         end_lr=float(config.lr.end_lr))


def make_apply_fn(*, tx: optax.GradientTransformation, unravel_params: Callable, num_params: int,
                  num_stats: int, bn_momentum: float) -> Callable:
    """Builds ``apply(params_flat, opt_state, stats_flat, total, count) -> (params_flat, opt_state, stats_flat)``.

    `total` is the (all-reduced) sum of result vectors, `count` the gradients in it (> 0); pure, jit it.
    """

    def apply(params_flat, opt_state, stats_flat, total, count):
        count = jnp.asarray(count, jnp.float32)
        grads = unravel_params(total[:num_params] / count)
        params = unravel_params(params_flat)
        updates, opt_state = tx.update(grads, opt_state, params)
        new_params = ravel_pytree(optax.apply_updates(params, updates))[0]
        reported = total[num_params:num_params + num_stats] / count
        stats = bn_momentum * stats_flat + (1.0 - bn_momentum) * reported
        return new_params, opt_state, stats

    return apply


class StopRule:
    """When the run ends (the first reached; 0 = not used)."""

    def __init__(self, *, duration_s: float, num_updates: int, max_examples: float):
        self.duration_s, self.num_updates, self.max_examples = duration_s, num_updates, max_examples

    def local_flag(self, t: float) -> bool:
        """Whether this host's clock says stop (goes through the all-reduce)."""
        return self.duration_s > 0 and t >= self.duration_s

    def global_stop(self, updates: int, examples: float) -> bool:
        """Whether the global counts say stop (the same on every host)."""
        return (self.num_updates > 0 and updates >= self.num_updates) or \
            (self.max_examples > 0 and examples >= self.max_examples)


class Updater:
    """One host's updater loop (``threading.Thread(target=updater.run)``); see the module docstring.

    Args:
      apply_fn: the jitted `make_apply_fn` result.
      params, opt_state, stats: initial flat weights, optimizer state and flat running statistics (jax
        arrays on the updater's device).
      buffer, published, control: the host's shared objects.
      collective: a `HostCollective` with several hosts, else None.
      clock: seconds since the common start.
      stop_rule: the `StopRule`.
      sub_batch: examples per gradient.
      network_time_s: emulated all-reduce time per cycle.
      lockstep: wait for one gradient from each of `local_learners` learners before each swap.
      local_learners: learners on this host.
      snapshot_every: keep a reference to the published weights and statistics of every version that is a
        multiple of it, in ``snapshots`` (0: none). Published arrays are never modified, so this copies
        nothing; the run evaluates them after it ends (``config.sprint.eval_deferred``).
    """

    def __init__(self, *, apply_fn: Callable, params: Any, opt_state: Any, stats: Any, buffer: NodeBuffer,
                 published: Published, control: Control, collective, clock: Callable[[], float],
                 stop_rule: StopRule, sub_batch: int, network_time_s: float, lockstep: bool,
                 local_learners: int, snapshot_every: int = 0):
        self._apply = apply_fn
        self.params, self.opt_state, self.stats = params, opt_state, stats
        self._buffer, self._published, self._control = buffer, published, control
        self._collective, self._clock, self._stop = collective, clock, stop_rule
        self._sub_batch, self._network_time_s = sub_batch, network_time_s
        self._lockstep, self._local_learners = lockstep, local_learners
        self._snapshot_every = int(snapshot_every)
        self.snapshots: list[tuple[int, Any, np.ndarray]] = []          # (version, params, stats)
        self.version = 0
        self.examples = 0.0
        self.updates: list[tuple[int, int, float, float]] = []          # (version, count, t_swap, t_publish)
        self.applied: list[tuple[int, list[GradientRecord]]] = []       # (version, records) of each update
        self.loss_sum, self.correct_sum, self.gradients_applied = 0.0, 0.0, 0
        self.t_stop = 0.0
        self.remote_failure = False  # another host's thread failed

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 (re-raised by the caller of runtime.run)
            self._control.fail(e)
        finally:
            self._control.stop.set()
            self._published.wake()

    def _loop(self) -> None:
        width = self._buffer.width
        while True:
            if self._lockstep:
                while not self._buffer.wait_count(self._local_learners, POLL_S):
                    if self._control.error is not None:
                        break
            t_swap = self._clock()
            gathered = self._buffer.swap()
            error = self._control.error is not None
            vec = np.empty(width + 3, np.float32)
            vec[:width] = gathered.total
            vec[width:] = (gathered.count, float(self._stop.local_flag(t_swap) or error), float(error))
            if self._network_time_s > 0:
                time.sleep(self._network_time_s)
            if self._collective is not None:
                vec = self._collective.allreduce(vec)
            count, stop_flag, error_flag = int(round(vec[width])), vec[width + 1] > 0, vec[width + 2] > 0
            if count > 0:
                self.params, self.opt_state, self.stats = self._apply(self.params, self.opt_state, self.stats,
                                                                      vec[:width], count)
                stats_host = np.asarray(self.stats)  # waits for the update (releases the GIL)
                jax.block_until_ready(self.params)
                self.loss_sum += float(vec[width - 2])
                self.correct_sum += float(vec[width - 1])
            else:
                stats_host = self._published.current[2]
            self.version += 1
            self._published.publish(self.version, self.params, stats_host)
            t_publish = self._clock()
            if self._snapshot_every and self.version % self._snapshot_every == 0:
                self.snapshots.append((self.version, self.params, stats_host))
            self.updates.append((self.version, count, t_swap, t_publish))
            self.applied.append((self.version, gathered.records))
            self.examples += count * self._sub_batch
            self.gradients_applied += count
            if count == 0:
                time.sleep(0)  # an empty cycle: let waiting learner threads take the GIL
            if error_flag and not error:
                self.remote_failure = True
            if stop_flag or error_flag or self._stop.global_stop(self.version, self.examples):
                self.t_stop = t_publish
                return
