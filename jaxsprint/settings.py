"""Settings of a training run: each module checks its own part; this composes them.

Nothing here reads data or writes files, so a launcher can call :func:`validate_config` before it
touches the workdir.
"""
from __future__ import annotations

import math

from jaxsprint import async_emulation, cpu, models, optim, parallel, polish
from jaxsprint import data as data_lib
from jaxsprint.errors import check



def validate_config(config, num_devices: int) -> None:
    """Raises a ConfigError naming the first bad field of a training config."""
    data_lib.validate_config(config)
    models.validate_config(config)
    cpu.validate_config(config)
    parallel.validate_config(config, num_devices)
    optim.validate_config(config)
    polish.validate_config(config, num_devices)
    async_emulation.validate_config(config)
    validate_loop_config(config)


def validate_loop_config(config) -> None:
    """The loop's own settings: seed, length, and the eval / checkpoint / log intervals."""
    check(isinstance(config.seed, int) and 0 <= config.seed < 2**31, "config.seed", config.seed,
          "allowed: an integer 0 <= seed < 2^31")
    check(math.isfinite(config.num_epochs) and config.num_epochs > 0, "config.num_epochs", config.num_epochs,
          "allowed: a finite number > 0")
    check(config.num_train_steps == -1 or config.num_train_steps > 0, "config.num_train_steps",
          config.num_train_steps, "allowed: -1 (from num_epochs) or a positive count")
    for name in ("eval_every_epochs", "checkpoint_every_epochs"):
        value = config[name]
        check(math.isfinite(value), f"config.{name}", value, "allowed: a finite number (<= 0: only at the end)")
    check(config.log_every_steps >= 0, "config.log_every_steps", config.log_every_steps,
          "allowed: an integer >= 0 (0: only at the end)")
    check(config.keep_checkpoints >= 1, "config.keep_checkpoints", config.keep_checkpoints,
          "allowed: an integer >= 1")
