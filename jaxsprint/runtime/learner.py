"""SPRINT learners: one Python thread per local device, each computing sub-batch gradients without waiting.

Protocol of a learner (SPRINT's, see docs/sprint-model.md): read the newest published version ``v`` and its
weights, draw a sub-batch from this host's shard, compute the gradient at those weights, add it to the node
buffer, start again at once. Learners never wait for the updater, except in lockstep mode, where a learner
that has added its gradient for version ``v`` waits until a newer version is published (the synchronous
check mode: then every update holds exactly one gradient of every learner).

Design choices:
  * Weights travel as ONE flat float32 vector (``ravel_pytree``): a learner copies it to its device once per
    new version it sees, and the gradient comes back as one vector; JAX releases the GIL while a computation
    runs, so the threads overlap.
  * The gradient function is ``train.make_train_step``'s loss (the same model, the same smoothed
    cross-entropy, the weighted mean over the sub-batch) and the training augmentation of ``data.py``, in
    one jitted program per device. Its result vector is ``[gradient (P) | BN batch statistics (S) | loss |
    correct]``: the node buffer sums all of it in one addition.
  * BatchNorm normalises over the learner's sub-batch (per-device BN). The learner's model is built with
    ``bn_momentum = 0``, so the "running" statistics it returns ARE the sub-batch's; the updater turns their
    mean over the update's gradients into the EMA (`jaxsprint.runtime.updater`).
  * Data: host ``p`` of ``H`` reads the stream ``pipeline.train_index_batches(n, seed, sub_batch * H)``,
    its part ``p``: element ``c`` is the ``c``-th sub-batch this host draws, whichever learner draws it (a
    counter under a lock). The hosts' parts of round ``c`` are disjoint, and the host's stream walks its
    share of each epoch's permutation in order, however fast its learners are. Sub-batch ``c`` of host ``p``
    is augmented with the key ``fold_in(fold_in(key(seed + 1), p), c)`` (`augment_key`), so a run in
    lockstep mode is reproducible: cycle ``i`` of host ``p`` reads elements ``i L .. i L + L - 1``.
  * More learners than local devices: learner ``j`` drives device ``j mod D`` (round-robin); learners that
    share a device are independent threads whose programs the device runs in turn.
  * The test hook ``time_fn(learner, gradient) -> seconds`` makes a learner's cycle last exactly that long
    from its read to its addition (it sleeps after the gradient; the stop ends the sleep early).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxsprint.train import optim, pipeline
from jaxsprint.runtime.buffer import Control, GradientRecord, NodeBuffer, Published

# How long one wait may block before a thread rechecks the run's stop and error flags (seconds).
POLL_S = 0.05


def augment_key(seed: int, host: int, counter) -> jax.Array:
    """The augmentation key of sub-batch `counter` of `host` (usable inside and outside jit)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed + 1), host), counter)


def make_gradient_fn(*, model, num_classes: int, label_smoothing: float, unravel_params: Callable,
                     batch_stats: Any, preprocess: Callable, seed: int) -> Callable:
    """Builds ``fn(params_flat, images_uint8, labels, draw) -> float32 [P + S + 2]``; pure, jit it once.

    Args:
      model: the flax model, built with ``bn_momentum=0`` so that its returned statistics are the batch's.
      num_classes, label_smoothing: of the loss, as in ``train.make_train_step``.
      unravel_params: flat vector -> params tree (from ``ravel_pytree``).
      batch_stats: a batch-statistics tree of the right structure (its values do not matter with momentum 0;
        ``{}`` for a model without BatchNorm).
      preprocess: ``(key, uint8 images) -> float images``, the training augmentation.
      seed: the run's seed (see `augment_key`).

    ``draw`` is int32 ``[host, counter]``. The loss is sum_i CE_i / b over the sub-batch (``train``'s weighted
    mean with unit weights). The result is ``[grad (P) | ravel(batch statistics) (S) | loss | correct]``.
    """

    def loss_fn(params, images, labels):
        logits, new_vars = model.apply({"params": params, "batch_stats": batch_stats}, images, train=True,
                                       mutable=["batch_stats"])
        ce = optim.smoothed_cross_entropy(logits, labels, num_classes, label_smoothing)
        weights = jnp.ones(labels.shape, jnp.float32)
        loss = jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1e-12)
        correct = jnp.sum(jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        return loss, (new_vars.get("batch_stats", {}), correct)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def fn(params_flat, images, labels, draw):
        x = preprocess(augment_key(seed, draw[0], draw[1]), images)
        (loss, (stats, correct)), grads = grad_fn(unravel_params(params_flat), x, labels)
        return jnp.concatenate([ravel_pytree(grads)[0], ravel_pytree(stats)[0].astype(jnp.float32),
                                jnp.stack([loss, correct]).astype(jnp.float32)])

    return fn


class SubBatches:
    """This host's sub-batches: element ``c`` of its part of the stream (see the module docstring)."""

    def __init__(self, source, *, seed: int, sub_batch: int, host: int, num_hosts: int):
        self._source = source
        self._index = pipeline.train_index_batches(len(source), seed=seed, global_batch=sub_batch * num_hosts,
                                                   process_index=host, process_count=num_hosts)
        self._lock = threading.Lock()
        self._next = 0

    def indices(self, counter: int) -> np.ndarray:
        """The example indices of sub-batch `counter` (for tests that replay a run)."""
        return np.asarray(self._index[int(counter)])

    def draw(self) -> tuple[int, dict[str, np.ndarray]]:
        """(counter, {"image": uint8, "label": int32}) of the next sub-batch of this host."""
        with self._lock:
            c = self._next
            self._next += 1
        batch = self._source.get_batch(self.indices(c))
        return c, {"image": np.asarray(batch["image"], np.uint8), "label": np.asarray(batch["label"], np.int32)}


class Learner:
    """One learner thread's loop (``threading.Thread(target=learner.run)``).

    Args:
      index: global learner index (host * learners_per_host + local index).
      host: this process's index.
      device: the device it drives.
      gradient_fn: the jitted `make_gradient_fn` result.
      data: the host's `SubBatches`.
      buffer, published, control: the shared objects of the host.
      clock: seconds since the common start.
      lockstep: wait for a newer version after each gradient.
      time_fn: the test hook (see the module docstring), or None.
    """

    def __init__(self, *, index: int, host: int, device, gradient_fn: Callable, data: SubBatches,
                 buffer: NodeBuffer, published: Published, control: Control, clock: Callable[[], float],
                 lockstep: bool = False, time_fn: Callable[[int, int], float] | None = None):
        self.index, self.host, self.device = index, host, device
        self._fn, self._data = gradient_fn, data
        self._buffer, self._published, self._control = buffer, published, control
        self._clock, self._lockstep, self._time_fn = clock, lockstep, time_fn
        self.gradients = 0

    def warm_up(self, params_flat, example: dict[str, np.ndarray]) -> None:
        """Compiles the gradient program for this learner's device (before the clock starts)."""
        args = jax.device_put((params_flat, example["image"], example["label"], np.zeros(2, np.int32)),
                              self.device)
        jax.block_until_ready(self._fn(*args))

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 (re-raised by the caller of runtime.run)
            self._control.fail(e)
            self._published.wake()

    def _loop(self) -> None:
        stop = self._control.stop
        seen, weights = -1, None
        host_draw = np.empty(2, np.int32)
        while not stop.is_set():
            t_start = self._clock()
            version, params, _ = self._published.current
            if version != seen:
                weights, seen = jax.device_put(params, self.device), version
            counter, batch = self._data.draw()
            host_draw[:] = (self.host, counter)
            images, labels, draw = jax.device_put((batch["image"], batch["label"], host_draw), self.device)
            vector = np.asarray(self._fn(weights, images, labels, draw))
            if self._time_fn is not None:
                remaining = t_start + float(self._time_fn(self.index, self.gradients)) - self._clock()
                if remaining > 0:
                    stop.wait(remaining)
            self._buffer.add(vector, GradientRecord(self.index, self.host, version, t_start, self._clock()))
            self.gradients += 1
            if self._lockstep:
                while not self._published.wait_newer(version, POLL_S):
                    if stop.is_set():
                        return

