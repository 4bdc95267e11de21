"""What one host can start: a SPRINT run's threads, memory and times, checked before anything starts.

`validate_config` checks each field alone; `check_host` checks what they ask of this host together, so that
a run the host cannot hold is a `ConfigError` naming the field, the value and the bound, not a crash after
the compilation (``can't start new thread``, the OOM killer) or a run that never ends.

  * Learner threads (`learner_thread_limit`): one Python thread per learner, besides the updater, the caller
    and the threads JAX already runs. The OS refuses a thread past the first of: ``RLIMIT_NPROC`` (the user's
    processes and threads), ``kernel.threads-max`` and ``kernel.pid_max`` (the whole system; every thread
    takes a pid), the cgroup's ``pids.max`` (containers) and ``RLIMIT_AS`` over the thread stack size
    (address space). Those bound from above only (other processes' threads count too), so the limit is also
    capped at `MAX_LEARNERS_PER_HOST`: the learners time-share the host's devices round-robin and one GIL,
    and the updater gathers every learner's gradient each cycle, so far past that many a run measures the
    host's thread scheduling, not SPRINT, while every thread adds a pid and a stack.
  * Devices: ``sprint.devices`` at most the local devices (in `validate_config`).
  * Memory (`footprint_bytes`): the updater's state (parameters, optimizer slots, the published and the
    gathered copies) and, for every learner at once, its sub-batch's activations kept for the backward pass,
    its gradient and its host batch; plus the evaluation the caller runs meanwhile, or after the run the
    polishing pass. Coarse and high, as :mod:`jaxsprint.train.memory` (whose model sizes it uses).
    Against the host's memory on the CPU backend (every device shares it), else per device: the busiest
    device's learners (and the updater's state where it shares a device) against the smallest device limit.
  * Times: the run keeps every event in memory until it ends, so every time field is at most `MAX_SECONDS`;
    the warm-up and one cycle's emulated network time must be shorter than ``duration_s`` when it is set.
"""
from __future__ import annotations

import functools
import math
import os
import resource
import threading

from jaxsprint.errors import ConfigError
from jaxsprint.train import data as data_lib
from jaxsprint.train import memory

__all__ = ["MAX_LEARNERS_PER_HOST", "MAX_SECONDS", "check_host", "footprint_bytes", "learner_thread_limit"]

MAX_LEARNERS_PER_HOST = 1024
MAX_SECONDS = 7 * 24 * 3600.0  # a week of wall time
RESERVED_THREADS = 16  # the updater, the caller's evaluation, orbax's and the interpreter's helper threads
_F32 = 4
_STATE_COPIES = 6  # parameters, two optimizer slots, the update's donated copy, the published weights, the buffer


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_pids_left() -> int | None:
    """``pids.max - pids.current`` of this process's cgroup (v2 or v1), or None where unknown or unlimited."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and not controllers:
            base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        elif "pids" in controllers.split(","):
            base = os.path.join("/sys/fs/cgroup/pids", path.lstrip("/"))
        else:
            continue
        most, now = _read_int(os.path.join(base, "pids.max")), _read_int(os.path.join(base, "pids.current"))
        if most is not None and now is not None:
            return most - now
    return None


def _running_threads() -> int:
    """Threads of this process (XLA's pools included, where /proc says), else those Python knows."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return threading.active_count()


def learner_thread_limit() -> tuple[int, str]:
    """``(most learner threads this process may start, what sets that)`` (module docstring)."""
    running = _running_threads() + RESERVED_THREADS
    limits = [(MAX_LEARNERS_PER_HOST, "jaxsprint.runtime.bounds.MAX_LEARNERS_PER_HOST: past that many the "
                                      "learners measure the host's thread scheduling, not SPRINT")]
    nproc, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if nproc != resource.RLIM_INFINITY:
        limits.append((nproc - running, f"RLIMIT_NPROC={nproc} processes and threads of this user"))
    for name in ("threads-max", "pid_max"):
        value = _read_int(f"/proc/sys/kernel/{name}")
        if value is not None:
            limits.append((value - running, f"kernel.{name}={value}"))
    left = _cgroup_pids_left()
    if left is not None:
        limits.append((left - RESERVED_THREADS, f"the cgroup's pids.max ({left} pids left)"))
    address, _ = resource.getrlimit(resource.RLIMIT_AS)
    if address != resource.RLIM_INFINITY:
        stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
        stack = threading.stack_size() or (stack if stack != resource.RLIM_INFINITY else 8 * 2**20)
        limits.append((address // stack - running, f"RLIMIT_AS={address} bytes / a thread stack of {stack} bytes"))
    most, why = min(limits, key=lambda t: t[0])
    return max(0, most), why


@functools.lru_cache(maxsize=32)
def _model_sizes(model: str, image_size: int, channels: int, num_classes: int) -> tuple[int, int]:
    return memory.model_sizes(model, image_size=image_size, channels=channels, num_classes=num_classes)


def footprint_bytes(config, learners: int, devices: int = 1) -> dict[str, int]:
    """Bytes a SPRINT run of a (field-checked) config holds at its peak, by part (module docstring).

    Args:
      config: a SPRINT config whose fields `validate_config` accepted.
      learners: learner threads on this host.
      devices: devices they are spread over (round-robin); ``learners_busiest_device`` counts the learners of
        the device that has most.

    Returns:
      ``state`` (the updater's), ``learner`` (one learner: activations, gradient, host batch),
      ``learner_activations`` (of that, its sub-batch's activations), ``learners`` (all of them),
      ``learners_busiest_device``, ``eval`` (the caller's evaluation, while the learners run) and ``polish``
      (the polishing pass, after them).
    """
    num_classes, channels = data_lib.expected_shape(config.dataset)
    p, a = _model_sizes(config.model, int(config.image_size), channels, num_classes)
    pixels = int(config.image_size) ** 2 * channels
    b = int(config.sprint.sub_batch)
    acts = _F32 * a * b
    learner = acts + 2 * _F32 * p + b * pixels * (1 + _F32)  # activations, gradient and weights, host batch

    def forward(batch: int) -> int:
        return _F32 * a * batch + batch * pixels * (1 + _F32)

    polish = 0
    if config.polish.mode == "recompute":
        polish = forward(int(config.polish.batch_size or config.eval_batch_size))
    return dict(state=_STATE_COPIES * _F32 * p, learner=learner, learner_activations=acts,
                learners=learners * learner, learners_busiest_device=math.ceil(learners / devices) * learner,
                eval=forward(int(config.eval_batch_size)), polish=polish)


def _memory_limit(num_devices: int) -> tuple[int | None, bool]:
    """``(bytes, shared)``: the host's memory (shared by every device: the CPU backend), or the smallest
    device limit; None where unknown."""
    import jax

    devices = jax.local_devices()
    if devices[0].platform == "cpu":
        return memory.host_memory_bytes(), True
    limits = []
    for d in devices[:num_devices]:
        stats = d.memory_stats() if hasattr(d, "memory_stats") else None
        if not stats or "bytes_limit" not in stats:
            return None, False
        limits.append(int(stats["bytes_limit"]))
    return min(limits), False


def _check_memory(config, learners: int, devices: int, limit: int | None, shared: bool) -> None:
    if limit is None:
        return
    f = footprint_bytes(config, learners, devices)
    during = f["learners" if shared else "learners_busiest_device"] + f["eval"]
    peak = f["state"] + max(during, f["polish"])
    if peak <= limit:
        return
    s = config.sprint
    where = "this host has" if shared else "the smallest device has"
    if f["polish"] > during and f["polish"] > f["state"]:
        field, value, why = "config.polish.batch_size", config.polish.batch_size, "the polishing pass"
    elif f["eval"] > f["learners"] and f["eval"] > f["state"]:
        field, value, why = "config.eval_batch_size", config.eval_batch_size, "the evaluation"
    elif f["learners"] > f["state"]:
        n = learners if shared else math.ceil(learners / devices)
        why = (f"{n} learners x {f['learner'] / 2**20:,.1f} MiB (the activations of sub_batch={s.sub_batch} "
               "examples kept for the backward pass, a gradient, the host batch)")
        field, value = (("config.sprint.sub_batch", s.sub_batch) if 2 * f["learner_activations"] > f["learner"]
                        else ("config.sprint.learners_per_host", s.learners_per_host))
    else:
        field, value, why = "config.model", config.model, "its parameters and optimizer state"
    raise ConfigError(field, value, f"a value for which the run fits in memory: {why}, about "
                                    f"{peak / 2**30:,.2f} GiB in all, and {where} {limit / 2**30:,.2f} GiB")


def _check_times(s) -> None:
    for name in ("duration_s", "warmup_s", "network_time_s", "join_timeout_s", "init_timeout_s"):
        value = s.get(name)
        if value is not None and value > MAX_SECONDS:
            raise ConfigError(f"config.sprint.{name}", value, f"at most {MAX_SECONDS:g} s (a week: the run keeps "
                                                              "every event in memory until it ends)")
    if s.duration_s > 0:
        for name, what in (("warmup_s", "the whole run would be warm-up"),
                           ("network_time_s", "one updater cycle would outlast the run")):
            if s[name] >= s.duration_s:
                raise ConfigError(f"config.sprint.{name}", s[name], f"less than config.sprint.duration_s="
                                                                    f"{s.duration_s} ({what})")


def check_host(config, num_local_devices: int, *, memory_limit_bytes: int | None = None) -> None:
    """Checks that this host can start and hold the run of a SPRINT config whose fields are valid one by one.

    Args:
      config: a SPRINT config (``experiments/configs/sprint.py``) that passed the field checks.
      num_local_devices: the devices the run's process will have.
      memory_limit_bytes: memory the run may use (default: this process's devices, see `_memory_limit`);
        the CPU backend's limit is the host's, shared by all devices.

    Raises:
      ConfigError: naming the field, the value and the bound (module docstring).
    """
    s = config.sprint
    _check_times(s)
    learners = int(s.learners_per_host or num_local_devices)
    most, why = learner_thread_limit()
    if learners > most:
        raise ConfigError("config.sprint.learners_per_host", s.learners_per_host,
                          f"at most {most} learner threads on this host ({why})")
    devices = int(s.get("devices") or num_local_devices)
    if memory_limit_bytes is None:
        limit, shared = _memory_limit(devices)
    else:
        limit, shared = memory_limit_bytes, True
    _check_memory(config, learners, devices, limit, shared)
