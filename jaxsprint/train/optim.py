"""The large-batch recipe: derived hyper-parameters, learning-rate schedules, optimizers, label smoothing.

Every derived value (peak learning rate by the linear scaling rule, steps per epoch, warmup and decay steps,
micro-batch for accumulation) is computed once, in `derive_hparams`, from the config and the dataset size.

References:
  Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017 (linear scaling, warmup).
  You et al., "Large Batch Training of Convolutional Networks", 2017 (LARS).
  You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes", 2019 (LAMB).
  Szegedy et al., "Rethinking the Inception Architecture", 2016 (label smoothing).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxsprint.errors import ConfigError, check, is_real

OPTIMIZERS = ("sgd", "nesterov", "lars", "lamb")
SCHEDULES = ("cosine", "poly", "constant")
SCALINGS = ("linear", "none")


def _check_range(field: str, value, lo: float, hi: float = math.inf, *, lo_open: bool = False,
                 hi_open: bool = True) -> None:
    """Raises ConfigError unless `value` is finite and in [lo, hi) (``lo_open``/``hi_open`` choose each end)."""
    ok = is_real(value) and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if hi == math.inf:
        allowed = f"a finite number {'>' if lo_open else '>='} {lo:g}"
    else:
        allowed = f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    check(ok, field, value, allowed)


def validate_config(config) -> None:
    """Checks the training recipe: ``config.optimizer.*``, ``config.lr.*`` and ``config.label_smoothing``.

    The run's length (``num_epochs``, ``num_train_steps``) is the training loop's setting and checked there.

    Needs no data: call it before anything is read or written. NaN and infinities are rejected everywhere.

    Raises:
      ConfigError: naming the first bad field: an unknown optimizer, schedule or scaling rule; ``lr.base``,
        ``lr.end_lr``, ``lr.warmup_epochs``, a weight decay or an epsilon that is not finite and >= 0; a
        ``lr.reference_batch``, ``lr.poly_power`` or ``optimizer.lars_trust_coefficient`` that is not finite
        and > 0; a momentum or LAMB beta outside [0, 1); ``lr.warmup_init`` outside [0, 1];
        ``label_smoothing`` outside [0, 1).
    """
    o, lr = config.optimizer, config.lr
    check(o.name in OPTIMIZERS, "config.optimizer.name", o.name, f"allowed: {', '.join(OPTIMIZERS)}")
    for name in ("momentum", "lamb_b1", "lamb_b2"):
        _check_range(f"config.optimizer.{name}", o[name], 0.0, 1.0)
    for name in ("weight_decay", "lars_eps", "lamb_eps"):
        _check_range(f"config.optimizer.{name}", o[name], 0.0)
    _check_range("config.optimizer.lars_trust_coefficient", o.lars_trust_coefficient, 0.0, lo_open=True)
    check(isinstance(o.lars_nesterov, bool), "config.optimizer.lars_nesterov", o.lars_nesterov, "True or False")
    _check_range("config.lr.base", lr.base, 0.0)
    check(lr.scaling in SCALINGS, "config.lr.scaling", lr.scaling, f"allowed: {', '.join(SCALINGS)}")
    _check_range("config.lr.reference_batch", lr.reference_batch, 0.0, lo_open=True)
    _check_range("config.lr.warmup_epochs", lr.warmup_epochs, 0.0)
    _check_range("config.lr.warmup_init", lr.warmup_init, 0.0, 1.0, hi_open=False)
    check(lr.schedule in SCHEDULES, "config.lr.schedule", lr.schedule, f"allowed: {', '.join(SCHEDULES)}")
    _check_range("config.lr.poly_power", lr.poly_power, 0.0, lo_open=True)
    _check_range("config.lr.end_lr", lr.end_lr, 0.0)
    _check_range("config.label_smoothing", config.label_smoothing, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class HParams:
    """Values derived from the config; the only place they are computed."""

    global_batch: int
    accum_steps: int
    micro_batch: int          # examples per forward/backward pass (global, all devices)
    steps_per_epoch: int      # optimizer updates per epoch
    total_steps: int
    warmup_steps: int
    peak_lr: float            # base_lr * global_batch / reference_batch under the linear rule
    end_lr: float


def derive_hparams(config, num_train_examples: int) -> HParams:
    """Derives the schedule and batch bookkeeping from `config` (see experiments/configs/default.py).

    Raises:
      ConfigError: as :func:`validate_config` (called first), or when the batch does not fit the data.
    """
    validate_config(config)
    b = int(config.batch_size)
    k = int(config.grad_accum_steps)
    if k < 1 or b % k:
        raise ConfigError("config.grad_accum_steps", k, f"must be >= 1 and divide config.batch_size={b}")
    if b > num_train_examples:
        raise ConfigError("config.batch_size", b,
                          f"must be at most the training-set size {num_train_examples}")
    steps_per_epoch = num_train_examples // b
    if config.get("num_train_steps", -1) and config.get("num_train_steps", -1) > 0:
        total = int(config.num_train_steps)
    else:
        total = int(math.ceil(config.num_epochs * steps_per_epoch))
    warmup = int(round(config.lr.warmup_epochs * steps_per_epoch))
    warmup = min(warmup, total)
    if config.lr.scaling == "linear":
        peak = config.lr.base * b / config.lr.reference_batch
    else:  # "none"
        peak = config.lr.base
    return HParams(global_batch=b, accum_steps=k, micro_batch=b // k, steps_per_epoch=steps_per_epoch,
                   total_steps=total, warmup_steps=warmup, peak_lr=float(peak), end_lr=float(config.lr.end_lr))


def make_schedule(config, hp: HParams) -> optax.Schedule:
    """Linear warmup from `config.lr.warmup_init` x peak to the peak over `warmup_steps`, then decay.

    Decay over the remaining ``total_steps - warmup_steps`` updates:
      * "cosine": end + (peak - end) * (1 + cos(pi * t / T)) / 2;
      * "poly": end + (peak - end) * (1 - t / T) ** power (Fujitsu used power 2.2, NVIDIA 2);
      * "constant": the peak.

    Raises:
      ConfigError: as :func:`validate_config` (called first).
    """
    validate_config(config)
    peak, end = hp.peak_lr, hp.end_lr
    decay_steps = max(hp.total_steps - hp.warmup_steps, 1)
    if config.lr.schedule == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=end / peak if peak else 0.0)
    elif config.lr.schedule == "poly":
        decay = optax.polynomial_schedule(peak, end, config.lr.poly_power, decay_steps)
    else:
        decay = optax.constant_schedule(peak)
    if hp.warmup_steps == 0:
        return decay
    warm = optax.linear_schedule(config.lr.warmup_init * peak, peak, hp.warmup_steps)
    return optax.join_schedules([warm, decay], [hp.warmup_steps])


def decay_mask(params) -> dict:
    """True for weights that take weight decay and the LARS/LAMB trust ratio: kernels (ndim > 1).

    BatchNorm scales and biases and every bias vector (ndim <= 1) are excluded, as in Goyal et al. and the
    MLPerf LARS recipes (optax applies both to every parameter unless masked).
    """
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_optimizer(config, schedule: optax.Schedule) -> optax.GradientTransformation:
    """The optimizer named by ``config.optimizer.name`` with the learning-rate `schedule`.

    Raises:
      ConfigError: as :func:`validate_config` (called first).
    """
    validate_config(config)
    o = config.optimizer
    if o.name in ("sgd", "nesterov"):
        return optax.chain(
            optax.add_decayed_weights(o.weight_decay, mask=decay_mask),
            optax.sgd(schedule, momentum=o.momentum or None, nesterov=(o.name == "nesterov")),
        )
    if o.name == "lars":
        return optax.lars(schedule, weight_decay=o.weight_decay, weight_decay_mask=decay_mask,
                          trust_coefficient=o.lars_trust_coefficient, eps=o.lars_eps,
                          trust_ratio_mask=decay_mask, momentum=o.momentum, nesterov=o.lars_nesterov)
    return optax.lamb(schedule, b1=o.lamb_b1, b2=o.lamb_b2, eps=o.lamb_eps, weight_decay=o.weight_decay,
                      mask=decay_mask)


def smoothed_cross_entropy(logits: jax.Array, labels: jax.Array, num_classes: int,
                           smoothing: float) -> jax.Array:
    """Per-example cross-entropy against one-hot labels smoothed as (1 - s) * onehot + s / num_classes."""
    targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), smoothing)
    return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)


Schedule = Callable[[int], float]
