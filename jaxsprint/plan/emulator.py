r"""Emulated convergence under a configuration's predicted statistics, and a disk cache of the runs.

The time-to-accuracy planner (:mod:`jaxsprint.plan.law`) needs, for a candidate configuration, the number of
updates a training run takes to reach a target accuracy when each update's gradient is ``tau`` updates stale
and its mini-batch ``B`` is random, with ``tau`` and ``B`` drawn from the candidate's predicted pmfs
(:func:`jaxsprint.perf.sprint.delay_pmfs`). This module trains a small *proxy network* (:data:`PROXY_MODELS`)
on the user's data under exactly those draws:

.. math::
    w_{t+1} = w_t - \eta_t\, m_{t+1}, \quad m_{t+1} = \mu m_t + g_{t-\tau_t} + \lambda w_t, \quad
    g_s = \frac{1}{B_s} \sum_{i \le B_s} \nabla \ell(w_s; x_{s,i})

with the delay through :func:`jaxsprint.emulation.staleness.delayed_gradients` (its ring buffer, warm-up clipping and
the ``staleness_lr`` mitigation for the ``lr_tau`` rule), ``tau_t`` drawn from the staleness pmf and ``B_t``
from the mini-batch pmf (in proxy samples). An update with ``B_t = 0`` (an empty updater cycle: the model
counts it as an update) changes nothing, so the time of ``U`` updates is ``U T_u``. Several seeds run in one
``vmap`` of one jitted ``lax.scan`` whose program depends only on static sizes (the largest mini-batch rounded
up to a power of two, the seeds, the run length), so the candidates of one plan share a few compilations.

**Mini-batch scale.** A cluster mini-batch of ``B`` samples is ``B / scale`` proxy samples; the planner's
default scale is ``N_file / N_proxy_train`` (an update takes the same fraction of an epoch on both), an
assumption stated in every report.

**Updates to target** (:func:`updates_to_target`): the first update at which the seed-mean test accuracy
reaches the target, interpolated between evaluations ("steps to result", Shallue et al., JMLR 2019); ``None``
when the run never reaches it (censored at its length). Per-seed crossings give the seed spread.

**Cache** (:class:`RunCache`): one JSON file per run, named by the SHA-256 of everything the run depends on
(data, proxy, optimizer, run length, seeds, the candidate's statistics to 4 significant digits, learning
rate), so a run is never trained twice and a changed candidate invalidates only its own entry.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsprint.train import data as data_lib
from jaxsprint.emulation import staleness
from jaxsprint.errors import ConfigError, check
from jaxsprint.emulation.samplers import nonempty_staleness_pmf

__all__ = ["LR_RULES", "MAX_STALENESS", "PROXY_MODELS", "CACHE_VERSION", "Emulator", "ProxyData", "RunCache",
           "RunResult", "RunSpec", "load_proxy_data", "make_spec", "minibatch_pmf_from_counts",
           "updates_to_target"]

PROXY_MODELS = ("mlp", "cnn", "tiny_nobn")  # tiny_nobn: jaxsprint.train.models' TinyNet without BN (flax)
LR_RULES = ("linear", "lr_tau", "none")
MAX_STALENESS = 64          # ring buffer of the emulator: larger delays are lumped here by the model's pmf
MAX_PROXY_MINIBATCH = 1024  # proxy mini-batches are clipped here (the draw's mass above is lumped)
CACHE_VERSION = 2           # bump when a change to the emulation changes its results
# Bounds of a run's settings: the seeds are vmapped (each with its delay ring of MAX_STALENESS + 1 gradients, see
# `_memory_bytes`), a run is meant to take seconds to minutes, and the proxies are small networks.
MAX_SEEDS, MAX_UPDATES, MAX_WIDTH = 256, 1_000_000, 65_536


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProxyData:
    """A dataset as flat float32 features in memory: the proxy's whole training and test splits."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    image_size: int
    channels: int

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])


def _features(images: np.ndarray, size: int, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    x = np.asarray(images, np.float32)
    if x.shape[1:3] != (size, size):
        x = np.asarray(jax.image.resize(jnp.asarray(x), (x.shape[0], size, size, x.shape[-1]), "linear",
                                        antialias=True))
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return x.astype(np.float32)


def load_proxy_data(name: str, *, image_size: int = 8, data_dir: str | None = None,
                    max_examples: int = 20_000) -> ProxyData:
    """The training and test splits of ``name`` at ``image_size``, normalised, in memory.

    Args:
      name: ``digits``, ``mnist5k`` (built in) or a TFDS image-classification dataset prepared in ``data_dir``.
      image_size: Side of the proxy's input (8 keeps the emulated runs fast).
      data_dir: Directory of a prepared TFDS dataset (not needed for the built-in ones).
      max_examples: At most this many training examples (and a quarter of it for the test split) are read.

    Raises:
      ConfigError: an unknown dataset, a TFDS dataset without ``data_dir``, a bad ``image_size``.
      DataError: a dataset that cannot be read.
    """
    check(isinstance(image_size, int) and 4 <= image_size <= 32, "config.image_size", image_size,
          "an integer in 4..32")
    check(isinstance(name, str) and bool(name), "config.data", name, f"one of {', '.join(data_lib.BUILTIN)} or a "
          "TFDS dataset name")
    if name in data_lib.BUILTIN:
        ds = data_lib.load_builtin(name, 8 if name == data_lib.DIGITS else 28)
    else:
        ds = data_lib.load_tfds(name, data_dir, image_size=image_size)
    splits = []
    for src, cap in ((ds.train, max_examples), (ds.test, max(1, max_examples // 4))):
        idx = np.arange(min(len(src), cap))
        batch = src.get_batch(idx)
        splits.append((_features(batch["image"], image_size, ds.mean, ds.std),
                       np.asarray(batch["label"], np.int32)))
    (tx, ty), (vx, vy) = splits
    return ProxyData(ds.name, tx, ty, vx, vy, int(ds.num_classes), image_size, int(tx.shape[-1]))


# ----------------------------------------------------------------------------------------------
# Proxy networks (pure functions of a params dict)
# ----------------------------------------------------------------------------------------------


def _flax(model: str, num_classes: int, width: int):
    from jaxsprint.train import models  # only for the flax proxies

    del width  # TinyNet's own width (8 and 16 channels, as the "cnn" proxy at width 64)
    return models.create_model(model, num_classes=num_classes)


def _init(model: str, key: jax.Array, image_size: int, channels: int, num_classes: int, width: int):
    if model == "tiny_nobn":  # the same network the SPRINT runtime can train (config.model = "tiny_nobn")
        net = _flax(model, num_classes, width)
        return net.init(key, jnp.zeros((1, image_size, image_size, channels)), train=False)["params"]
    k1, k2, k3 = jax.random.split(key, 3)
    he = lambda k, shape, fan_in: jax.random.normal(k, shape) * jnp.sqrt(2.0 / fan_in)  # noqa: E731
    if model == "mlp":
        d = image_size * image_size * channels
        return {"w1": he(k1, (d, width), d), "b1": jnp.zeros((width,)),
                "w2": he(k2, (width, num_classes), width) * 0.5, "b2": jnp.zeros((num_classes,))}
    c1, c2 = max(4, width // 8), max(8, width // 4)
    return {"c1": he(k1, (3, 3, channels, c1), 9 * channels), "c2": he(k2, (3, 3, c1, c2), 9 * c1),
            "w": he(k3, (c2, num_classes), c2) * 0.5, "b": jnp.zeros((num_classes,))}


def _apply(model: str, params, x: jax.Array, num_classes: int = 10, width: int = 64) -> jax.Array:
    if model == "tiny_nobn":
        return _flax(model, num_classes, width).apply({"params": params}, x, train=True)
    if model == "mlp":
        h = jax.nn.relu(x.reshape(x.shape[0], -1) @ params["w1"] + params["b1"])
        return h @ params["w2"] + params["b2"]
    conv = lambda h, w, s: jax.lax.conv_general_dilated(  # noqa: E731
        h, w, (s, s), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = jax.nn.relu(conv(x, params["c1"], 1))
    h = jax.nn.relu(conv(h, params["c2"], 2))
    return jnp.mean(h, (1, 2)) @ params["w"] + params["b"]


def _memory_bytes(data: ProxyData, model: str, width: int) -> int:
    """Bytes one seed of a run holds, coarse and high: its parameters, gradient, momentum and the delay ring of
    ``MAX_STALENESS + 1`` gradients (float32), and the activations of the largest proxy mini-batch."""
    shapes = jax.eval_shape(lambda k: _init(model, k, data.image_size, data.channels, data.num_classes, width),
                            jax.random.key(0))
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    acts = data.image_size ** 2 * (data.channels + width)
    return 4 * (params * (MAX_STALENESS + 4) + MAX_PROXY_MINIBATCH * acts)


def _check_memory(data: ProxyData, model: str, seeds: int, width: int) -> None:
    from jaxsprint.train import memory

    device = jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" and hasattr(device, "memory_stats") else None
    limit = int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else memory.host_memory_bytes()
    one = _memory_bytes(data, model, width)
    if limit is None or seeds * one <= limit:
        return
    field, value = ("config.width", width) if one > limit else ("config.seeds", seeds)
    raise ConfigError(field, value, f"a value for which the run fits in memory: {seeds} seeds x "
                                    f"{one / 2**20:,.1f} MiB (the {model}'s weights with a delay ring of "
                                    f"{MAX_STALENESS + 1} gradients, its activations), and this machine has "
                                    f"{limit / 2**30:,.1f} GiB")


# ----------------------------------------------------------------------------------------------
# Run specifications
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What one emulated run draws from: the two pmfs and the learning rate.

    Attributes:
      staleness_pmf: ``P(tau = s)`` for ``s = 0..MAX_STALENESS`` (float64, sums to 1).
      minibatch_pmf: ``P(B = m)`` for ``m = 0..M`` proxy samples (``m = 0``: an empty cycle).
      learning_rate: Peak learning rate of the proxy's SGD (after the batch rule).
      mitigation: ``none`` or ``staleness_lr`` (the ``lr_tau`` rule).
      mean_minibatch: The candidate's mean mini-batch in cluster samples (the fit's input; not hashed).
      mean_staleness: The candidate's mean staleness (the fit's input; not hashed).
      statistics: ``(name, value)`` pairs the pmfs were computed from (learners, ``T_c``, ``T_u``, jitter,
        sub-batch, scale); when given they key the cache instead of the pmfs.
      sub_batch: examples per learner gradient where every mini-batch is a whole number of them (0: not known);
        the network emulator then normalises BN over each sub-batch, as SPRINT's learners do.
    """

    staleness_pmf: np.ndarray
    minibatch_pmf: np.ndarray
    learning_rate: float
    mitigation: str = "none"
    mean_minibatch: float = 0.0
    mean_staleness: float = 0.0
    statistics: tuple[tuple[str, float], ...] | None = None
    sub_batch: int = 0

    @property
    def max_minibatch(self) -> int:
        return int(np.flatnonzero(self.minibatch_pmf > 0)[-1])

    def key_fields(self) -> dict[str, Any]:
        """The fields a run depends on, rounded so that float noise does not change the key.

        With ``statistics``, those (4 significant digits) and the learning rate (4 digits): the model's float32
        pmfs (an FFT) differ in their last bits between processes, so hashing them would train a run again;
        a real change of a statistic moves it far more than 1e-4. Without, the pmfs rounded to 1e-5.
        """
        if self.statistics is not None:
            return {"statistics": {k: float(f"{v:.4g}") for k, v in self.statistics},
                    "learning_rate": float(f"{self.learning_rate:.4g}"), "mitigation": self.mitigation}
        r = lambda p: [round(float(v), 5) for v in np.trim_zeros(np.round(np.asarray(p, np.float64), 5), "b")]  # noqa: E731
        return {"staleness_pmf": r(self.staleness_pmf), "minibatch_pmf": r(self.minibatch_pmf),
                "learning_rate": float(f"{self.learning_rate:.5g}"), "mitigation": self.mitigation,
                **({"sub_batch": self.sub_batch} if self.sub_batch else {})}


def minibatch_pmf_from_counts(count_pmf: np.ndarray, sub_batch: int, scale: float,
                              max_minibatch: int = MAX_PROXY_MINIBATCH) -> np.ndarray:
    """pmf of the proxy mini-batch ``m = clip(round(K sub_batch / scale), 1, max)`` for ``K >= 1``, 0 for K = 0.

    Args:
      count_pmf: ``P(K = k)``, ``k = 0..``: sub-batch gradients per update (the model's count pmf).
      sub_batch: Cluster sub-batch ``N_sub``.
      scale: Cluster samples per proxy sample.
      max_minibatch: Largest proxy mini-batch (the mass above is lumped there).
    """
    p = np.asarray(count_pmf, np.float64)
    k = np.arange(p.size)
    m = np.where(k == 0, 0, np.clip(np.rint(k * sub_batch / scale), 1, max_minibatch)).astype(np.int64)
    out = np.zeros(int(m.max()) + 1)
    np.add.at(out, m, p)
    return out / out.sum()


def make_spec(staleness_pmf: np.ndarray, count_pmf: np.ndarray, *, sub_batch: int, scale: float,
              lr_rule: str, base_lr: float, reference_batch: float, mean_minibatch: float,
              mean_staleness: float, statistics: dict[str, float] | None = None) -> RunSpec:
    """A :class:`RunSpec` from a candidate's model pmfs (:func:`jaxsprint.perf.sprint.delay_pmfs`).

    Learning-rate rules (:data:`LR_RULES`): ``linear``: ``base_lr * E[m] / reference_batch`` (Goyal et al.
    2017) with ``E[m]`` the mean proxy mini-batch of the non-empty updates; ``lr_tau``: the same, divided by
    each gradient's staleness (Zhang et al. 2016, ``staleness_lr``); ``none``: ``base_lr``.

    Raises:
      ConfigError: an unknown rule, a non-positive learning rate, scale or reference batch.
    """
    check(lr_rule in LR_RULES, "config.lr_rule", lr_rule, f"one of {', '.join(LR_RULES)}")
    for field, v in (("config.base_lr", base_lr), ("config.minibatch_scale", scale),
                     ("config.reference_batch", reference_batch)):
        check(isinstance(v, (int, float)) and math.isfinite(v) and v > 0, field, v, "a finite number > 0")
    s = np.zeros(MAX_STALENESS + 1)
    cp = np.asarray(count_pmf, np.float64)
    sp = nonempty_staleness_pmf(staleness_pmf, cp[0] / cp.sum() if cp.size and cp.sum() > 0 else 0.0)
    np.add.at(s, np.minimum(np.arange(sp.size), MAX_STALENESS), sp)
    mb = minibatch_pmf_from_counts(count_pmf, sub_batch, scale)
    nonempty = mb[1:].sum()
    mean_m = float(np.dot(np.arange(mb.size), mb) / nonempty) if nonempty > 0 else 1.0
    lr = base_lr * (mean_m / reference_batch if lr_rule in ("linear", "lr_tau") else 1.0)
    # "delay": 1 marks the delays drawn in non-empty updates (runs cached before that are not reused)
    stats = None if statistics is None else tuple(sorted({**statistics, "sub_batch": sub_batch,
                                                           "scale": scale, "delay": 1.0}.items()))
    return RunSpec(s / s.sum(), mb, float(lr), "staleness_lr" if lr_rule == "lr_tau" else "none",
                   float(mean_minibatch), float(mean_staleness), stats, int(sub_batch) if scale == 1 else 0)


# ----------------------------------------------------------------------------------------------
# The emulator
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Accuracy curves of one run and its updates to the target.

    Attributes:
      updates: ``[E]`` update counts at which the test accuracy was measured.
      accuracy: ``[seeds, E]`` test accuracy.
      cached: Whether it came from the cache.
      seconds: Wall-clock seconds of the training (0 when cached).
    """

    updates: np.ndarray
    accuracy: np.ndarray
    cached: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"updates": self.updates.tolist(), "accuracy": np.round(self.accuracy, 5).tolist(),
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunResult":
        return cls(np.asarray(d["updates"], np.float64), np.asarray(d["accuracy"], np.float64), True, 0.0)


def updates_to_target(updates: np.ndarray, accuracy: np.ndarray, target: float) -> float | None:
    """First update at which ``accuracy`` (a ``[E]`` curve) reaches ``target``, interpolated; None if never.

    The curve starts from chance at update 0 (no measurement before the first one), so a first measurement
    above the target interpolates from ``(0, 0)``.
    """
    u = np.concatenate([[0.0], np.asarray(updates, np.float64)])
    a = np.concatenate([[0.0], np.nan_to_num(np.asarray(accuracy, np.float64), nan=0.0)])
    hit = np.flatnonzero(a >= target)
    if hit.size == 0:
        return None
    i = int(hit[0])
    frac = (target - a[i - 1]) / max(a[i] - a[i - 1], 1e-12)
    return float(u[i - 1] + frac * (u[i] - u[i - 1]))


class Emulator:
    """Trains the proxy network under a :class:`RunSpec`'s draws; owns its compiled programs.

    Args:
      data: The proxy's data.
      model: One of :data:`PROXY_MODELS`.
      seeds: Seeds per run (vmapped).
      max_updates: Updates per run (a multiple of ``eval_every`` after rounding up).
      eval_every: Updates between test evaluations.
      momentum: SGD momentum ``mu`` (the updater's; it sees the stale gradients).
      weight_decay: ``lambda``, applied at the current weights.
      width: Hidden width of the MLP (the CNN uses ``width/8`` and ``width/4`` channels).
      min_bucket: Smallest static mini-batch of the compiled step (give the largest proxy mini-batch of a
        plan, so that all its runs share one compilation per mitigation).

    Raises:
      ConfigError: an unknown model or a bad size.
    """

    def __init__(self, data: ProxyData, model: str = "mlp", *, seeds: int = 4, max_updates: int = 1500,
                 eval_every: int = 25, momentum: float = 0.9, weight_decay: float = 0.0, width: int = 64,
                 min_bucket: int = 1):
        check(model in PROXY_MODELS, "config.model", model, f"one of {', '.join(PROXY_MODELS)} (proxy networks)")
        for field, v, most in (("config.seeds", seeds, MAX_SEEDS), ("config.max_updates", max_updates, MAX_UPDATES),
                               ("config.eval_every", eval_every, MAX_UPDATES), ("config.width", width, MAX_WIDTH)):
            check(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= most, field, v,
                  f"an integer in [1, {most}]")
        check(eval_every <= max_updates, "config.eval_every", eval_every,
              f"at most config.max_updates={max_updates} (at least one evaluation in a run)")
        _check_memory(data, model, seeds, width)
        check(0.0 <= momentum < 1.0, "config.momentum", momentum, "a number in [0, 1)")
        check(weight_decay >= 0.0 and math.isfinite(weight_decay), "config.weight_decay", weight_decay,
              "a finite number >= 0")
        self.data, self.model, self.seeds = data, model, seeds
        self.eval_every = eval_every
        self.num_evals = -(-max_updates // eval_every)
        self.max_updates = self.num_evals * eval_every
        self.momentum, self.weight_decay, self.width = float(momentum), float(weight_decay), width
        self.min_bucket = int(min_bucket)
        self._compiled: dict[tuple, Callable] = {}

    def describe(self) -> str:
        """What the runs train, for the plan's report."""
        d = self.data
        return f"the proxy {self.model} (width {self.width}) on {d.name} at {d.image_size}x{d.image_size}"

    def key_fields(self) -> dict[str, Any]:
        """Everything of the emulator a run's result depends on (for the cache key)."""
        d = self.data
        return {"version": CACHE_VERSION, "data": d.name, "num_train": d.num_train, "num_test": int(d.test_y.size),
                "image_size": d.image_size, "model": self.model, "width": self.width, "seeds": self.seeds,
                "max_updates": self.max_updates, "eval_every": self.eval_every, "momentum": self.momentum,
                "weight_decay": self.weight_decay}

    def _build(self, bucket: int, mitigation: str) -> Callable:
        d, model = self.data, self.model
        train_x, train_y = jnp.asarray(d.train_x), jnp.asarray(d.train_y)
        test_x, test_y = jnp.asarray(d.test_x), jnp.asarray(d.test_y)
        n_train = d.num_train
        tx = optax.chain(staleness.delayed_gradients(MAX_STALENESS, 0, mitigation=mitigation),
                         optax.add_decayed_weights(self.weight_decay), optax.trace(decay=self.momentum))

        def loss_fn(params, x, y, w):
            logits = _apply(model, params, x, d.num_classes, self.width)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
            return jnp.sum(jnp.where(w > 0, w * ce, 0.0))  # unused slots stay 0 even when a run diverges

        def one_seed(key, log_stale, log_mb, lr):
            params = _init(model, jax.random.fold_in(key, 1), d.image_size, d.channels, d.num_classes, self.width)
            opt = tx.init(params)

            def step(carry, t):
                params, opt = carry
                k_tau, k_m, k_idx = jax.random.split(jax.random.fold_in(key, t), 3)
                tau = jax.random.categorical(k_tau, log_stale)
                m = jax.random.categorical(k_m, log_mb)
                # One key per example slot: the first m examples do not depend on the bucket, so a run's
                # result does not either (and the cache key leaves the bucket out).
                idx = jax.vmap(lambda j: jax.random.randint(jax.random.fold_in(k_idx, j), (), 0, n_train))(
                    jnp.arange(bucket))
                w = jnp.where(jnp.arange(bucket) < m, 1.0 / jnp.maximum(m, 1).astype(jnp.float32), 0.0)
                g = jax.grad(loss_fn)(params, train_x[idx], train_y[idx], w)
                upd, new_opt = tx.update(g, opt, params, staleness=tau)
                new_params = jax.tree.map(lambda p, u: p - lr * u, params, upd)
                keep = m > 0  # an empty cycle publishes a version and changes nothing
                params, opt = jax.tree.map(lambda a, b: jnp.where(keep, a, b), (new_params, new_opt), (params, opt))
                return (params, opt), None

            def chunk(carry, e):
                ts = e * self.eval_every + jnp.arange(self.eval_every)
                carry, _ = jax.lax.scan(step, carry, ts)
                logits = _apply(model, carry[0], test_x, d.num_classes, self.width)
                return carry, jnp.mean(jnp.argmax(logits, -1) == test_y)

            _, acc = jax.lax.scan(chunk, (params, opt), jnp.arange(self.num_evals))
            return acc

        return jax.jit(jax.vmap(one_seed, in_axes=(0, None, None, None)))

    def run(self, spec: RunSpec, seed: int = 0) -> RunResult:
        """Trains ``self.seeds`` copies of the proxy under ``spec``; returns the accuracy curves."""
        bucket = int(2 ** math.ceil(math.log2(max(spec.max_minibatch, self.min_bucket, 1))))
        key = (bucket, spec.mitigation)
        if key not in self._compiled:
            self._compiled[key] = self._build(bucket, spec.mitigation)
        mb = np.zeros(bucket + 1)
        mb[:spec.max_minibatch + 1] = spec.minibatch_pmf[:spec.max_minibatch + 1]  # trailing zeros dropped
        log = lambda p: jnp.log(jnp.asarray(p, jnp.float32))  # noqa: E731  (log 0 = -inf: never drawn)
        keys = jax.random.split(jax.random.key(seed), self.seeds)
        t0 = time.perf_counter()
        acc = np.asarray(self._compiled[key](keys, log(spec.staleness_pmf), log(mb), jnp.float32(spec.learning_rate)))
        updates = self.eval_every * np.arange(1, self.num_evals + 1, dtype=np.float64)
        return RunResult(updates, acc.astype(np.float64), False, time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------
# Cache
# ----------------------------------------------------------------------------------------------


class RunCache:
    """Runs on disk, one JSON file per run, named by the hash of what the run depends on.

    Args:
      directory: Where the entries live (created on the first write); None keeps nothing.
    """

    def __init__(self, directory: str | None):
        self.directory = directory
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(emulator: Emulator, spec: RunSpec) -> str:
        """SHA-256 of the emulator's and the spec's key fields."""
        blob = json.dumps({"emulator": emulator.key_fields(), "spec": spec.key_fields()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, f"run-{key[:24]}.json")

    def get(self, emulator: Emulator, spec: RunSpec) -> RunResult | None:
        """The cached result of this run, or None."""
        if not self.directory:
            return None
        path = self._path(self.key(emulator, spec))
        try:
            with open(path) as f:
                d = json.load(f)
            return RunResult.from_dict(d["result"])
        except (OSError, ValueError, KeyError):
            return None

    def put(self, emulator: Emulator, spec: RunSpec, result: RunResult) -> None:
        """Writes the entry atomically (a temporary file renamed into place)."""
        if not self.directory:
            return
        os.makedirs(self.directory, exist_ok=True)
        k = self.key(emulator, spec)
        entry = {"key": k, "emulator": emulator.key_fields(), "spec": spec.key_fields(),
                 "mean_minibatch": spec.mean_minibatch, "mean_staleness": spec.mean_staleness,
                 "result": result.as_dict()}
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, self._path(k))

    def run(self, emulator: Emulator, spec: RunSpec) -> RunResult:
        """The cached result, or a fresh run (then cached)."""
        hit = self.get(emulator, spec)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        result = emulator.run(spec)
        self.put(emulator, spec, result)
        return result

