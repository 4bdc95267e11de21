"""Host memory allocator settings for XLA:CPU processes (glibc malloc), applied before JAX starts.

Why: XLA:CPU allocates a train step's large temporary buffers with ``malloc`` on every execution. glibc
serves such blocks with ``mmap`` (above its mmap threshold, and whatever does not fit a per-thread arena's
heap) and gives them back with ``munmap`` when freed, so the next step touches fresh pages that the kernel
zero-fills: a fifth of a small ResNet step went to page faults. With every allocation in the main ``sbrk``
heap (one arena, no ``mmap``) and freed memory kept (trimming off), the steps after the first reuse the same
pages. With several (fake) CPU devices one shared arena is slower (lock contention), so there every thread
keeps its own arena and only ``mmap`` and trimming are switched off. Freed memory stays with the process,
which is what a training loop that allocates the same buffers every step wants. The measured page faults and
step times are in ``docs/cpu-speed.md``; ``scripts/bench_step.py`` reports both.

The settings only take effect for threads that have not allocated yet, so they must be applied before the
JAX backend starts its thread pools (importing jax is fine, running anything is not): :func:`configure` is
the first thing the launchers do, and only in a process that runs on CPU devices alone (an accelerator process
keeps glibc's defaults).

It is part of the CPU acceleration: :func:`jaxsprint.train.cpu.configure_host_memory` applies the rule above
unless ``cpu_kernels`` (or ``JAXSPRINT_CPU_KERNELS``) is "off". :func:`configure` itself also takes "retain"
(force the one-arena settings) and "system" (leave the allocator alone).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import re
import sys

from jaxsprint.errors import ConfigError

__all__ = ["MODES", "configure", "cpu_only_expected", "retain_freed_memory", "single_cpu_device_expected"]

MODES = ("auto", "retain", "system")

# mallopt(3) parameter numbers (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# -1 switches trimming off (mallopt(3)): glibc reads the int as a size_t, the largest there is. The largest
# positive int (2 GiB) was the value before; a ResNet-50 step at batch 32 (224x224) frees more than that at the
# top of the heap, so glibc gave it back to the system every step (see the module docstring).
_TRIM_THRESHOLD_BYTES = -1


_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin",
                        "libtpu")


def _backend_started() -> bool:
    """Whether JAX has already created a backend in this process (then the settings come too late)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge  # private: there is no public "is initialised" query
    except ImportError:
        return False
    return bool(getattr(xla_bridge, "_backends", None))


def cpu_only_expected(environ: dict[str, str] | None = None) -> bool:
    """Whether a JAX process started with this environment will run on CPU devices only.

    True when ``JAX_PLATFORMS`` is unset, empty or "cpu" and no accelerator plugin is installed (unless
    ``JAX_PLATFORMS`` is "cpu").
    """
    env = os.environ if environ is None else environ
    platforms = env.get("JAX_PLATFORMS", "").strip().lower()
    if platforms not in ("", "cpu"):
        return False
    return not (platforms == "" and any(importlib.util.find_spec(p) is not None for p in _ACCELERATOR_PLUGINS))


def single_cpu_device_expected(environ: dict[str, str] | None = None) -> bool:
    """Whether a JAX process started with this environment will run on exactly one CPU device.

    True when :func:`cpu_only_expected` and ``XLA_FLAGS`` does not force more than one host device.
    """
    env = os.environ if environ is None else environ
    if not cpu_only_expected(env):
        return False
    counts = re.findall(r"--xla_force_host_platform_device_count=(\d+)", env.get("XLA_FLAGS", ""))
    return not counts or int(counts[-1]) <= 1


def retain_freed_memory(single_arena: bool = True) -> bool:
    """Applies the glibc settings (no mmap, no trimming; one arena when `single_arena`).

    Returns False where impossible (not Linux, not glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = True
    settings = [(_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)]
    if single_arena:
        settings.insert(0, (_M_ARENA_MAX, 1))
    for param, value in settings:
        ok = bool(mallopt(param, value)) and ok
    return ok


def configure(mode: str = "auto") -> str:
    """Applies the host allocator policy for this process; returns what was done, in words.

    Args:
      mode: "auto" (the rule of the module docstring), "retain" (one arena, no mmap, no trimming, on any
        CPU-only process) or "system" (glibc's defaults).

    Raises:
      ConfigError: an unknown mode.
    """
    if mode not in MODES:
        raise ConfigError("host allocator mode", mode, f"allowed: {', '.join(MODES)}")
    if mode == "system":
        return "host allocator: system defaults"
    if mode == "auto" and not cpu_only_expected():
        return "host allocator: system defaults (not a CPU-only process)"
    single_arena = mode == "retain" or single_cpu_device_expected()
    if _backend_started():
        return "host allocator: system defaults (the JAX backend had already started)"
    if not retain_freed_memory(single_arena):
        return "host allocator: system defaults (glibc mallopt not available)"
    if single_arena:
        return "host allocator: freed memory retained (one arena, no mmap)"
    return "host allocator: freed memory retained (an arena per thread, no mmap)"
