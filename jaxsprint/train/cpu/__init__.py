"""The optional CPU acceleration, behind one switch.

jaxsprint's research code (models, training, polishing) is plain JAX. On XLA:CPU a few of its operations are
slow enough to matter for a laptop demo, the test suite and small studies, so this package offers faster
versions of them, all decided by ONE setting:

  * ``config.cpu_kernels`` (training configs) or the ``cpu_kernels`` argument: "auto" | "off" | "require";
  * the environment variable ``JAXSPRINT_CPU_KERNELS``, same values, which decides wherever the setting is
    "auto" (CI sets it to "require" so that no kernel test can skip silently).

  ======== ===================================================================================================
  "off"     nothing of this package is used: XLA's convolution, the plain BatchNorm, glibc's allocator defaults.
  "auto"    on the CPU backend: the custom-VJP convolution (:mod:`.conv`), the fused BatchNorm blocks
            (:mod:`.fused`), the native kernels (:mod:`.kernels`, compiled on first use where a C++ compiler
            exists and the CPU has AVX-512; XLA's paths where not) and the allocator policy (:mod:`.hostmem`).
            On a GPU or TPU backend nothing here is traced.
  "require" as "auto", but uses the native kernels on any CPU (without AVX-512 too, where they are slower)
            and fails with a clear error when they cannot be built or the backend is not CPU.
  ======== ===================================================================================================

Values equal XLA's up to float summation order (tested). Usage::

    from jaxsprint.train import cpu, models
    accel = cpu.acceleration(config.cpu_kernels)
    model = models.create_model("resnet20", num_classes=10, **accel.model_kwargs())
    step = jax.jit(train_step, compiler_options=accel.compiler_options)

Launchers call :func:`configure_host_memory` first, before JAX runs anything.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxsprint.errors import ConfigError
from jaxsprint.train.cpu.switch import ENV_VAR, MODES, env_mode

__all__ = ["ENV_VAR", "MODES", "Acceleration", "acceleration", "configure_host_memory", "env_mode", "resolve",
           "validate_config"]

def resolve(mode: str, field: str = "config.cpu_kernels") -> str:
    """The effective mode: `mode` itself, except that "auto" defers to ``JAXSPRINT_CPU_KERNELS`` when set.

    Raises:
      ConfigError: `mode` (named `field`) or the environment variable is not one of `MODES`.
    """
    if mode not in MODES:
        raise ConfigError(field, mode, f"allowed: {', '.join(MODES)}")
    if mode == "auto":
        return env_mode() or "auto"
    return mode


def validate_config(config) -> None:
    """Checks ``config.cpu_kernels`` (and the environment variable it may defer to)."""
    resolve(config.cpu_kernels)


@dataclasses.dataclass(frozen=True)
class Acceleration:
    """What the switch decided for this process: the pieces a model and its jitted functions take.

    Attributes:
      mode: the effective mode ("auto", "off" or "require").
      active: whether the custom-VJP convolution and the fused BatchNorm are used (CPU backend, not "off").
      kernels: whether the native kernels are built and registered (used where shapes allow).
      reason: why the seam or the kernels are not in use ("" when both are).
      conv_general_dilated: the convolution for ``flax.linen.Conv``; None for XLA's.
      compiler_options: XLA options for ``jax.jit`` of functions that run the model; None for XLA's defaults.
    """

    mode: str
    active: bool
    kernels: bool
    reason: str
    conv_general_dilated: Callable | None = None
    compiler_options: dict[str, str] | None = None

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`jaxsprint.train.models.create_model`: the convolution, and the fused
        BatchNorm and residual blocks (same parameter names as the plain ones), when active."""
        if not self.active:
            return {}
        from jaxsprint.train.cpu import fused

        return {"conv_general_dilated": self.conv_general_dilated, "norm_cls": fused.BatchNorm,
                "block_overrides": fused.BLOCKS}

    def describe(self) -> str:
        """One line for logs."""
        if not self.active:
            return f"CPU kernels: off ({self.reason})"
        if not self.kernels:
            return f"CPU kernels: custom-VJP convolution with XLA's kernels ({self.reason})"
        return "CPU kernels: native convolutions and BatchNorm"


def acceleration(mode: str = "auto", *, field: str = "config.cpu_kernels") -> Acceleration:
    """Decides the CPU acceleration for this process (initialises the JAX backend; builds the kernels on
    the first call with the CPU backend, a few seconds, cached per user and CPU).

    Args:
      mode: "auto", "off" or "require" (see the module docstring).
      field: the setting's name in error messages.

    Raises:
      ConfigError: an unknown mode, or "require" where the kernels cannot be built or the backend is not CPU.
    """
    mode = resolve(mode, field)
    if mode == "off":
        return Acceleration(mode, False, False, "cpu_kernels=off")
    import jax

    backend = jax.default_backend()
    if backend != "cpu":
        if mode == "require":
            raise ConfigError(field, mode, f"the CPU kernels run on the CPU backend only; this one is {backend!r}")
        return Acceleration(mode, False, False, f"{backend} backend")
    from jaxsprint.train.cpu import conv, kernels

    suited, why_not = kernels.suits_this_cpu()
    if mode == "auto" and not suited:
        # XLA's paths: the seam without the native kernels measured as fast as "off" there (ResNet-20, batch
        # 128, 8 fake devices: 751 against 799 ms), and the kernels, which the seam would call where built,
        # four times slower (kernels.suits_this_cpu).
        return Acceleration(mode, False, False, why_not)
    built = kernels.available()
    reason = "" if built else kernels.unavailable_reason()
    if mode == "require" and not built:
        raise ConfigError(field, mode, f"the native CPU kernels cannot be built here: {reason}")
    return Acceleration(mode, True, built, reason, conv_general_dilated=conv.make_conv("fast"),
                        compiler_options=conv.compiler_options("fast"))


def configure_host_memory(mode: str = "auto") -> str:
    """Applies the host allocator policy of :mod:`.hostmem` unless the effective mode is "off"; returns
    what was done, in words. Call it before JAX runs anything (the settings apply to new threads only).
    """
    from jaxsprint.train.cpu import hostmem

    if resolve(mode) == "off":
        return "host allocator: system defaults (cpu_kernels=off)"
    return hostmem.configure("auto")
