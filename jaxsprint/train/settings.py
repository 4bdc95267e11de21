"""Settings of a training run: each module checks its own part; this composes them.

Nothing here reads data or writes files, so a launcher can call :func:`validate_run` before it touches the
workdir: :func:`validate_config` (every field, and the combinations that span modules) and
:func:`check_memory` (an estimate of the run's peak memory against this machine's).
"""
from __future__ import annotations

import math

from jaxsprint import cli
from jaxsprint.emulation import adapter
from jaxsprint.train import checkpoint, cpu, memory, models, noise, optim, parallel, polish, run_config
from jaxsprint.train import data as data_lib
from jaxsprint.errors import check, is_int, is_real


def validate_config(config, num_devices: int) -> None:
    """Raises a ConfigError naming the first bad field of a training config."""
    data_lib.validate_config(config)
    models.validate_config(config)
    cpu.validate_config(config)
    parallel.validate_config(config, num_devices)
    optim.validate_config(config)
    polish.validate_config(config, num_devices)
    adapter.validate_config(config)
    noise.validate_config(config, num_devices)
    checkpoint.validate_config(config)
    run_config.validate_config(config)
    validate_loop_config(config)
    validate_combinations(config)


def validate_run(config, num_devices: int) -> None:
    """:func:`validate_config`, then :func:`check_memory`: everything a launcher checks before it writes."""
    validate_config(config, num_devices)
    check_memory(config)


def check_memory(config, limit_bytes: int | None = None) -> memory.Estimate:
    """Refuses a run whose estimated peak memory exceeds this machine's (:func:`jaxsprint.train.memory.check_fits`),
    naming the setting behind the largest part (a batch size, ``adapter.max_staleness``)."""
    num_classes, channels = data_lib.expected_shape(config.dataset)
    return memory.check_fits(config, channels=channels, num_classes=num_classes, limit_bytes=limit_bytes)


def validate_combinations(config) -> None:
    """Settings that are valid one by one but not together (each module checks only its own fields)."""
    if config.polish.mode in ("recompute", "both"):
        check(models.has_batchnorm(config.model), "config.polish.mode", config.polish.mode,
              f"'none' or 'no_augment_epochs' for config.model={config.model!r}, which has no BatchNorm "
              "statistics to recompute")


def validate_loop_config(config) -> None:
    """The loop's own settings: seed, length, and the eval / checkpoint / log intervals."""
    check(is_int(config.seed) and 0 <= config.seed < 2**31, "config.seed", config.seed,
          "allowed: an integer 0 <= seed < 2^31")
    check(is_real(config.num_epochs) and math.isfinite(config.num_epochs) and config.num_epochs > 0,
          "config.num_epochs", config.num_epochs, "allowed: a finite number > 0")
    check(is_int(config.num_train_steps) and (config.num_train_steps == -1 or config.num_train_steps > 0),
          "config.num_train_steps", config.num_train_steps, "allowed: -1 (from num_epochs) or a positive count")
    for name in ("eval_every_epochs", "checkpoint_every_epochs"):
        value = config[name]
        check(is_real(value) and math.isfinite(value), f"config.{name}", value,
              "allowed: a finite number (<= 0: only at the end)")
    check(is_int(config.log_every_steps) and config.log_every_steps >= 0, "config.log_every_steps",
          config.log_every_steps, "allowed: an integer >= 0 (0: only at the end)")
    check(is_int(config.keep_checkpoints) and config.keep_checkpoints >= 1, "config.keep_checkpoints",
          config.keep_checkpoints, "allowed: an integer >= 1")
    stop = config.get("stop_at_accuracy", 0.0)
    check(is_real(stop) and 0 <= stop <= 1, "config.stop_at_accuracy", stop,
          "allowed: a fraction in [0, 1] (0: train the whole schedule)")
    k = config.get("stop_evals", 1)
    check(is_int(k) and k >= 1, "config.stop_evals", k, "allowed: an integer >= 1")
    check(isinstance(config.progress_bar, bool), "config.progress_bar", config.progress_bar, "True or False")
    steps = config.num_train_steps if is_int(config.num_train_steps) and config.num_train_steps > 0 else None
    profile_range(config, steps)


def profile_range(config, total_steps: int | None = None) -> tuple[int, int] | None:
    """``config.profile_steps`` as ``(a, b)``: the updates a, a+1, ..., b-1 (counted from 0; the ones logged as
    steps a+1..b) are traced by ``jax.profiler``; None when the field is absent or empty (no trace).

    Raises:
      ConfigError: not two integers 0 <= a < b, or b beyond `total_steps` (the run's updates, when known).
    """
    value = config.get("profile_steps", ())
    items = cli.text_list("config.profile_steps", value)
    if not items:
        return None
    allowed = ("two integers a,b with 0 <= a < b: the updates a..b-1 (counted from 0) are traced "
               "(empty: no trace)")
    whole = [v for v in items if is_int(v) or (isinstance(v, str) and v.lstrip("-").isdigit())]
    check(len(items) == len(whole) == 2, "config.profile_steps", value, allowed)
    a, b = (int(v) for v in whole)
    check(0 <= a < b, "config.profile_steps", value, allowed)
    if total_steps is not None:
        check(b <= total_steps, "config.profile_steps", value, f"{allowed}, within the run's {total_steps} updates")
    return a, b
