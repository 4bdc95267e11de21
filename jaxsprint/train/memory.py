"""Will a training run fit in memory? An up-front estimate, so that a huge setting is a clear error, not an OOM.

The estimate is deliberately coarse (within a small factor) and errs high; it only has to tell a run that
cannot fit from one that may. Parts, in bytes, for float32 state (``4 B`` a value):

  * state, replicated on every local device: parameters, their gradient and up to two optimizer slots
    (momentum / LAMB moments), plus the donated copy XLA may hold while the step runs: ``5 x 4P`` a device.
  * delay buffer of the asynchronous emulation (:func:`jaxsprint.emulation.staleness.delayed_gradients`), part of the
    replicated optimizer state: ``(max_staleness + 1) x 4P`` a device (twice that with DC-ASGD's weights).
  * training activations: every module output of one example (``A`` values, found by tracing the model
    abstractly with :func:`jax.eval_shape`; nothing runs) is kept for the backward pass: ``4A`` for each
    example of this process's share of the micro-batch, plus the uint8 host batch and its float copy.
  * evaluation and the polishing pass: no backward pass, but XLA may keep several layer outputs alive; counted
    as the whole forward pass, ``4A`` an example of this process's share of the batch (padded batches
    included), plus the host batch.

Evaluation and polishing run after or between training steps, so the peak is the state, the buffer and the
largest of the three passes. It is compared with the memory a run can use: the host's physical memory on the
CPU backend (every fake CPU device shares it), else the smallest per-device limit times the local devices.
"""
from __future__ import annotations

import dataclasses
import math
import os

from jaxsprint.errors import ConfigError

__all__ = ["Estimate", "available_bytes", "check_fits", "estimate", "model_sizes"]

_F32 = 4
_STATE_COPIES = 5


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes of each part of a run (see the module docstring) and what they are charged to."""

    params: int                 # P
    activations_per_example: int  # A, values
    state_bytes: int
    buffer_bytes: int
    train_bytes: int
    eval_bytes: int
    polish_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.state_bytes + self.buffer_bytes + max(self.train_bytes, self.eval_bytes, self.polish_bytes)


def host_memory_bytes() -> int | None:
    """Physical memory of this host (``os.sysconf``), or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def available_bytes() -> int | None:
    """Memory a run on this process's devices can use in all, or None when unknown.

    CPU backend: the host's physical memory. Accelerators: the smallest ``bytes_limit`` of the local
    devices (``Device.memory_stats``) times their number.
    """
    import jax

    devices = jax.local_devices()
    if devices[0].platform == "cpu":
        return host_memory_bytes()
    limits = []
    for d in devices:
        stats = d.memory_stats() if hasattr(d, "memory_stats") else None
        if not stats or "bytes_limit" not in stats:
            return None
        limits.append(int(stats["bytes_limit"]))
    return min(limits) * len(limits)


def model_sizes(model_name: str, *, image_size: int, channels: int, num_classes: int) -> tuple[int, int]:
    """``(P, A)``: parameters, and values of all module outputs for one example, by abstract tracing."""
    import jax
    import jax.numpy as jnp

    from jaxsprint.train import models

    model = models.create_model(model_name, num_classes=num_classes)
    x = jax.ShapeDtypeStruct((1, image_size, image_size, channels), jnp.float32)
    variables = jax.eval_shape(lambda a: model.init(jax.random.key(0), a, train=False), x)
    params = sum(math.prod(v.shape) for v in jax.tree.leaves(variables.get("params", {})))

    def forward(v, a):
        _, state = model.apply(v, a, train=False, capture_intermediates=True, mutable=["intermediates"])
        return state["intermediates"]

    inter = jax.eval_shape(forward, variables, x)
    acts = sum(math.prod(v.shape) for v in jax.tree.leaves(inter)) + math.prod(x.shape)
    return int(params), int(acts)


def estimate(config, *, channels: int, num_classes: int, local_devices: int = 1,
             processes: int = 1) -> Estimate:
    """The parts of :class:`Estimate` for a (validated) training config, for one of `processes` processes
    with `local_devices` devices each."""
    p_count, acts = model_sizes(config.model, image_size=config.image_size, channels=channels,
                                num_classes=num_classes)
    p_bytes = _F32 * p_count
    a = config.async_emulation
    buffer = 0
    if a.enabled:
        copies = 2 if "dc_asgd" in str(a.mitigation) else 1
        buffer = (int(a.max_staleness) + 1) * p_bytes * copies * local_devices
    pixels = config.image_size ** 2 * channels

    def forward(batch: int, micro: int) -> int:  # this process's share: activations and the host batch
        return (_F32 * acts * micro + batch * pixels * (1 + _F32)) // processes

    train = forward(config.batch_size, config.batch_size // max(1, config.grad_accum_steps))
    eval_b = forward(config.eval_batch_size, config.eval_batch_size)
    polish = 0
    if config.polish.mode in ("recompute", "both"):
        pb = config.polish.batch_size or config.eval_batch_size
        polish = forward(pb, pb)
    return Estimate(params=p_count, activations_per_example=acts,
                    state_bytes=_STATE_COPIES * p_bytes * local_devices, buffer_bytes=buffer, train_bytes=train,
                    eval_bytes=eval_b, polish_bytes=polish)


def check_fits(config, *, channels: int, num_classes: int, limit_bytes: int | None = None) -> Estimate:
    """Raises ConfigError naming the setting that makes the run too large for `limit_bytes`.

    Args:
      config: a training config whose fields are already valid one by one.
      channels, num_classes: of the dataset (`jaxsprint.train.data.expected_shape` before any data is read).
      limit_bytes: memory the run may use (default: :func:`available_bytes`; None there skips the check).

    Returns:
      The estimate.

    Raises:
      ConfigError: the peak exceeds the limit; the field is the one behind the largest part (the delay
        buffer's ``async_emulation.max_staleness``, or the batch of the largest pass).
    """
    import jax

    est = estimate(config, channels=channels, num_classes=num_classes, local_devices=jax.local_device_count(),
                   processes=jax.process_count())
    limit = available_bytes() if limit_bytes is None else limit_bytes
    if limit is None or est.peak_bytes <= limit:
        return est
    parts = [(est.buffer_bytes, "config.async_emulation.max_staleness", config.async_emulation.max_staleness,
              f"the delay buffer holds (max_staleness + 1) x {est.params:,} gradients"),
             (est.train_bytes, "config.batch_size", config.batch_size,
              f"training keeps {est.activations_per_example:,} activation values per example at "
              f"image_size={config.image_size} for the backward pass"),
             (est.eval_bytes, "config.eval_batch_size", config.eval_batch_size,
              f"evaluation holds {est.activations_per_example:,} activation values per example"),
             (est.polish_bytes, "config.polish.batch_size", config.polish.batch_size,
              f"the polishing pass holds {est.activations_per_example:,} activation values per example")]
    size, field, value, why = max(parts, key=lambda t: t[0])
    if size < est.state_bytes:
        field, value, why = "config.model", config.model, f"its {est.params:,} parameters and optimizer state"
    raise ConfigError(field, value, f"a value for which the run fits in memory: {why}, about "
                                    f"{est.peak_bytes / 2**30:,.1f} GiB in all, and this machine has "
                                    f"{limit / 2**30:,.1f} GiB")
