"""The CPU seam's switch: its modes and the environment variable that sets them where a config says auto.

Apart from :mod:`jaxsprint.train.cpu` so that the native kernels' loader reads it without importing the seam.
"""
from __future__ import annotations

import os

from jaxsprint.errors import ConfigError

__all__ = ["ENV_VAR", "MODES", "env_mode"]

MODES = ("auto", "off", "require")
ENV_VAR = "JAXSPRINT_CPU_KERNELS"


def env_mode() -> str | None:
    """The mode ``JAXSPRINT_CPU_KERNELS`` asks for; None when it is unset or empty.

    Raises:
      ConfigError: the variable holds a value not in `MODES`.
    """
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if not value:
        return None
    if value not in MODES:
        raise ConfigError(ENV_VAR, value, f"allowed: {', '.join(MODES)}")
    return value
