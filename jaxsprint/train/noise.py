"""The gradient noise scale of a training run, from the gradients data parallelism already computes.

McCandlish et al. (2018, "An Empirical Model of Large-Batch Training", App. A.1): the mean gradient G_B of
B independent examples has E|G_B|^2 = |G|^2 + tr(Sigma) / B, so two batch sizes B_s < B_b give the unbiased

    |G|^2     ~ (B_b |G_Bb|^2 - B_s |G_Bs|^2) / (B_b - B_s)
    tr(Sigma) ~ (|G_Bs|^2 - |G_Bb|^2) / (1 / B_s - 1 / B_b)

and the simple noise scale B_simple = tr(Sigma) / |G|^2, which approximates the critical batch B_noise of
``steps = S_min (1 + B_noise / B)``. A ratio of noisy estimates is biased, so, as the paper does, the two are
averaged over steps separately (an exponential moving average for the logged metric, window means for the
summary) before the ratio is taken. B_simple grows as training proceeds: report it against progress.

In a data-parallel step the small batches come free: each device's gradient of each micro-batch is one
(B_s = B / (devices x accumulation steps), |G_Bs|^2 averaged over all of them), their all-reduced sum the
big one (B_b = B). `sharded_step_grads` computes the step's gradients per device with ``jax.shard_map``
(per-device semantics are the subject) and adds one squared norm per micro-batch: no extra backward pass.
Devices must not share BatchNorm statistics (``bn.reduction`` "per_device" or "group", or one device):
synchronised BN couples every device's gradient to the others' examples.

Standard errors: the per-step estimates are autocorrelated (the parameters move slowly), so a window's
B_simple takes its error from batch means: the window is cut into m contiguous blocks and the ratio
estimator's delta-method variance is var_j(S_j - r G_j) / (m Gbar^2) over the blocks' means (S_j, G_j).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import jax
import numpy as np
import optax
from jax.sharding import Mesh, PartitionSpec as P

from jaxsprint.errors import ConfigError, check, is_int, is_real

__all__ = ["Ema", "Estimate", "Tracker", "by_progress", "ema_init", "ema_update", "format_report", "report",
           "sharded_step_grads", "smoothed", "step_metrics", "unbiased", "validate_config", "window_estimate"]


def unbiased(small_sq: jax.Array, big_sq: jax.Array, b_small: float, b_big: float) -> tuple[jax.Array, jax.Array]:
    """Unbiased ``(|G|^2, tr(Sigma))`` from ``E|G_Bs|^2`` and ``|G_Bb|^2`` (McCandlish et al. 2018, A.1).

    Args:
      small_sq: squared norm of a mean gradient over `b_small` examples (or the mean of several such norms).
      big_sq: squared norm of a mean gradient over `b_big` examples.
      b_small, b_big: the two batch sizes, ``b_small < b_big``.
    """
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


def step_metrics(small_sq_sum: jax.Array, grads, *, num_small: int, global_batch: int) -> dict[str, jax.Array]:
    """The step's estimates from its gradients: ``noise_g2`` and ``noise_trace`` (see `unbiased`).

    Args:
      small_sq_sum: sum over the `num_small` micro-batch gradients g_j of |g_j|^2, where g_j is the gradient
        of the micro-batch's share of the step's loss (its examples' loss summed, divided by `global_batch`).
      grads: their sum, the step's gradient of the mean loss over `global_batch` examples.
      num_small: devices x accumulation steps (>= 2).
      global_batch: B_b.

    The mean gradient of micro-batch j is ``num_small * g_j``, so the mean of their squared norms is
    ``num_small * small_sq_sum``.
    """
    b_small = global_batch / num_small
    g2, trace = unbiased(num_small * small_sq_sum, optax.tree.norm(grads, squared=True), b_small, global_batch)
    return {"noise_g2": g2, "noise_trace": trace}


def sharded_step_grads(accumulate: Callable, mesh: Mesh, axis: str) -> Callable:
    """Runs `accumulate` on each device's slice of the batch and all-reduces what it returns.

    Args:
      accumulate: ``(params, batch_stats, images, labels, weights, total_weight) -> (grads, batch_stats,
        loss, correct, count, small_sq_sum)`` over one device's examples; every returned quantity but the
        statistics is a sum over examples or micro-batches.
      mesh: the data-parallel mesh; `axis` its batch axis.

    Returns:
      The same signature over the global batch: sums all-reduced, BN running statistics averaged over devices
      (the per-device EMA updates are linear, so their mean is the update from the mean over groups, as the
      unsharded step computes it).
    """
    def local(params, batch_stats, images, labels, weights, total_weight):
        grads, stats, loss, correct, count, small_sq = accumulate(params, batch_stats, images, labels, weights,
                                                                  total_weight)
        sums = jax.lax.psum((grads, loss, correct, count, small_sq), axis)
        return sums[0], jax.lax.pmean(stats, axis), *sums[1:]

    batch = P(axis)
    # check_vma off: the CPU kernels' custom VJPs (jaxsprint.train.cpu) differentiate without the varying-axes
    # types; every output is all-reduced above, so it is replicated as out_specs says.
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), batch, batch, batch, P()), out_specs=P(),
                         check_vma=False)


# ----------------------------------------------------------------------------------------------------------
# Smoothing and standard errors over steps (host side, numpy).


class Ema(NamedTuple):
    """Bias-corrected exponential moving averages of the two estimates (Adam's correction for the start)."""

    g2: float
    trace: float
    weight: float  # 1 - decay^t: the total weight of the averaged steps


def ema_init() -> Ema:
    return Ema(0.0, 0.0, 0.0)


def ema_update(ema: Ema, g2: float, trace: float, decay: float) -> Ema:
    """One step of both averages; `smoothed` reads them."""
    return Ema(decay * ema.g2 + (1 - decay) * g2, decay * ema.trace + (1 - decay) * trace,
               decay * ema.weight + (1 - decay))


def smoothed(ema: Ema) -> dict[str, float]:
    """``noise_g2_ema``, ``noise_trace_ema`` and their ratio ``noise_b_simple``; {} before the first step, and no
    ratio while the averaged |G|^2 is not positive (the gradient is lost in its noise)."""
    if ema.weight <= 0:
        return {}
    g2, trace = ema.g2 / ema.weight, ema.trace / ema.weight
    return {"noise_g2_ema": g2, "noise_trace_ema": trace, **({"noise_b_simple": trace / g2} if g2 > 0 else {})}


@dataclasses.dataclass(frozen=True)
class Estimate:
    """B_simple over a window of steps, with standard errors from batch means (module docstring).

    ``b_simple`` is inf where the window's mean |G|^2 is not positive (the gradient is lost in its noise).
    """

    first_step: int
    last_step: int
    num_steps: int
    g2: float
    g2_se: float
    trace: float
    trace_se: float
    b_simple: float
    b_simple_se: float

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def window_estimate(steps, g2, trace, num_blocks: int = 10) -> Estimate:
    """B_simple = mean tr(Sigma) / mean |G|^2 over the steps given, with batch-means standard errors.

    Args:
      steps: the steps' numbers (for the record).
      g2, trace: the per-step unbiased estimates (`unbiased`), in step order.
      num_blocks: m contiguous blocks for the errors (fewer when there are fewer than 2 steps per block).
    """
    steps, g2, trace = (np.asarray(a, np.float64) for a in (steps, g2, trace))
    n = len(g2)
    if n == 0:
        raise ValueError("window_estimate needs at least one step")
    m = max(1, min(num_blocks, n // 2))
    blocks = np.array_split(np.arange(n), m)
    gb = np.array([g2[b].mean() for b in blocks])
    sb = np.array([trace[b].mean() for b in blocks])
    gbar, sbar = float(g2.mean()), float(trace.mean())
    ratio = sbar / gbar if gbar > 0 else math.inf
    if m < 2:
        g_se = s_se = r_se = math.nan
    else:
        g_se, s_se = (float(np.std(x, ddof=1) / np.sqrt(m)) for x in (gb, sb))
        r_se = float(np.std(sb - ratio * gb, ddof=1) / (np.sqrt(m) * gbar)) if gbar > 0 else math.nan
    return Estimate(int(steps[0]), int(steps[-1]), n, gbar, g_se, sbar, s_se, ratio, r_se)


def by_progress(steps, g2, trace, num_windows: int, num_blocks: int = 10) -> list[Estimate]:
    """`window_estimate` over `num_windows` consecutive windows of equal numbers of steps (progress order)."""
    idx = np.array_split(np.arange(len(g2)), max(1, min(num_windows, len(g2))))
    steps, g2, trace = (np.asarray(a) for a in (steps, g2, trace))
    return [window_estimate(steps[i], g2[i], trace[i], num_blocks) for i in idx if len(i)]


class Tracker:
    """The per-step estimates of a run, their moving average (the logged metric) and summaries."""

    def __init__(self, decay: float):
        self.decay = decay
        self.ema = ema_init()
        self.steps: list[int] = []
        self.g2: list[float] = []
        self.trace: list[float] = []
        self.accuracy: list[float] = []  # the steps' training accuracy: progress beside the step count

    def add(self, step: int, g2: float, trace: float, accuracy: float = math.nan) -> None:
        self.steps.append(int(step))
        self.g2.append(float(g2))
        self.trace.append(float(trace))
        self.accuracy.append(float(accuracy))
        self.ema = ema_update(self.ema, float(g2), float(trace), self.decay)

    def logged(self) -> dict[str, float]:
        return smoothed(self.ema)


def report(tracker: Tracker, num_windows: int, *, model: str, dataset: str, image_size: int, global_batch: int,
           num_small: int, steps_per_epoch: int) -> dict:
    """What a run measured, for its summary.json: the network and data it describes, the two batch sizes,
    B_simple (with standard errors) over the whole run and over `num_windows` consecutive spans of steps (each
    with its epochs and mean training accuracy), and the final moving averages. Covers the steps this process
    ran (a resumed run's start at its checkpoint); {} when there were none."""
    if not tracker.steps:
        return {}
    acc, first = np.asarray(tracker.accuracy), tracker.steps[0]
    windows = []
    for e in by_progress(tracker.steps, tracker.g2, tracker.trace, num_windows):
        span = acc[e.first_step - first:e.last_step - first + 1]
        windows.append(dict(e.as_dict(), train_accuracy=float(np.mean(span)),
                            first_epoch=(e.first_step - 1) / steps_per_epoch, last_epoch=e.last_step / steps_per_epoch))
    return {"model": model, "dataset": dataset, "image_size": image_size, "global_batch": global_batch,
            "small_batch": global_batch / num_small, "num_small": num_small,
            "run": window_estimate(tracker.steps, tracker.g2, tracker.trace).as_dict(), "windows": windows,
            **tracker.logged()}


def format_report(rep: dict) -> str:
    """`report` as a table: one row per span of steps and one for the whole run."""
    head = (f"gradient noise scale of {rep['model']} on {rep['dataset']} ({rep['image_size']}x{rep['image_size']}): "
            f"batches {rep['small_batch']:g} ({rep['num_small']} per step) and {rep['global_batch']}")
    lines = [head, f"{'steps':>11} {'epochs':>11} {'train acc':>9} {'|G|^2':>19} {'tr(Sigma)':>19} "
                   f"{'B_simple':>17}"]
    for name, e in [(None, w) for w in rep["windows"]] + [("whole run", rep["run"])]:
        steps = name or f"{e['first_step']}-{e['last_step']}"
        epochs = "" if name else f"{e['first_epoch']:.1f}-{e['last_epoch']:.1f}"
        acc = "" if name else f"{100 * e['train_accuracy']:.1f}%"
        lines.append(f"{steps:>11} {epochs:>11} {acc:>9} {e['g2']:>9.4g} +- {e['g2_se']:<7.2g}"
                     f"{e['trace']:>9.4g} +- {e['trace_se']:<7.2g}{e['b_simple']:>8.4g} +- {e['b_simple_se']:<6.2g}")
    return "\n".join(lines)


def validate_config(config, num_devices: int) -> None:
    """``config.noise_scale`` (when present): ``enabled``, ``ema_decay``, ``num_windows``, and what it needs.

    Raises:
      ConfigError: a bad field; or, when enabled: fewer than 2 small gradients (devices x
        ``grad_accum_steps``), synchronised BN over several devices, or the emulated random mini-batch
        (``async_emulation.num_sub_batches`` > 0: its example weights change the batch every step).
    """
    if "noise_scale" not in config:
        return
    ns = config.noise_scale
    check(isinstance(ns.enabled, bool), "config.noise_scale.enabled", ns.enabled, "True or False")
    check(is_real(ns.ema_decay) and 0 <= ns.ema_decay < 1, "config.noise_scale.ema_decay", ns.ema_decay,
          "a number in [0, 1)")
    check(is_int(ns.num_windows) and ns.num_windows >= 1, "config.noise_scale.num_windows", ns.num_windows,
          "an integer >= 1")
    if not ns.enabled:
        return
    k = config.grad_accum_steps
    if is_int(k) and num_devices * k < 2:
        raise ConfigError("config.noise_scale.enabled", True, f"needs 2 or more small gradients: devices "
                          f"({num_devices}) x config.grad_accum_steps ({k}) is {num_devices * k}")
    if num_devices > 1 and config.bn.reduction == "global":
        raise ConfigError("config.noise_scale.enabled", True, "needs config.bn.reduction 'per_device' or 'group' "
                          f"on {num_devices} devices (synchronised BN couples each device's gradient to the "
                          "others' examples)")
    if config.async_emulation.num_sub_batches:
        raise ConfigError("config.noise_scale.enabled", True, "needs config.async_emulation.num_sub_batches=0 "
                          "(the emulated random mini-batch weights the examples of every step differently)")
