"""Runs of the real runtime as their own processes, for the launchers that measure many configurations.

``experiments/validate_runtime.py`` (the grids and the random held-out draw) and
``experiments/calibrate_runtime.py`` (the designed calibration runs) start every configuration the same way:
``experiments/run_sprint.py --json`` with the entry's learners, sub-batch, network time and updater placement,
one process per host on loopback (``jax.distributed`` through the three flags), bounded by a timeout, every
process killed at the end. With ``compile_cache_dir`` the runs share JAX's persistent compilation cache: a
run whose programs an earlier run compiled starts in about 7 s instead of 15-25 s (the programs, so the
timings, are the same); the caller owns the folder and removes it (it is this machine's code, keep it local).
`run_series` runs several configurations of one process layout (hosts, learners, updater placement) in a row
in the same processes (``run_sprint.py --series``): each after the first saves the start-up, 8-15 s here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Sequence

from jaxsprint import subprocs
from jaxsprint.calibration import grids

__all__ = ["RECORD", "SET_BY_ENTRY", "SPLIT", "plan_duration", "record", "run_entry", "run_series", "same_processes"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# The config fields run_entry sets for every run (an override of them would be ignored).
SET_BY_ENTRY = tuple(f"config.sprint.{f}" for f in ("learners_per_host", "sub_batch", "network_time_s", "duration_s",
                                                     "num_updates", "num_epochs", "warmup_s", "checkpoint",
                                                     "eval_every_updates"))
# What a calibration's record of a run keeps of its measured statistics (the fit reads the cycle means and cvs),
# and, where measured (the logs of before these statistics lack them), the updater's empty and applying cycles.
RECORD = ("network_time_s", "t_compute_s", "t_compute_cv", "t_update_s", "t_update_cv", "images_per_s", "gradients",
          "updates", "mean_staleness")
SPLIT = ("t_update_empty_s", "t_update_applying_s", "empty_cycles", "applying_cycles")


def record(measured: dict) -> dict:
    """What a calibration keeps of a run's measured statistics (a run's JSON ``measured``)."""
    return {**{k: measured[k] for k in RECORD}, **{k: measured[k] for k in SPLIT if k in measured}}


def plan_duration(tc: float, tu: float, n: int, *, min_gradients: int, min_updates: int, warmup_s: float,
                  max_duration_s: float, margin: float = 1.3, min_measure_s: float = 0.0, scale: float = 1.0) -> float:
    """Run length for ``min_gradients`` gradients (``N / T_c`` per second) and ``min_updates`` updates
    (``1 / T_u`` per second) after the warm-up, with a margin, and at least ``min_measure_s`` after the
    warm-up (a mean over a few seconds carries the machine's second-to-second changes of speed); at most
    ``max_duration_s``. ``scale``: the share of all that measuring to plan (the warm-up is whole)."""
    need = max(min_gradients * tc / n, min_updates * tu)
    measure = min(max_duration_s - warmup_s, max(margin * need + 1.0, min_measure_s))
    return float(warmup_s + scale * measure)


def run_entry(entry: grids.Entry, workdir: str, *, config_file: str, overrides: Sequence[str],
              machine_args: Sequence[str], duration_s: float, warmup_s: float, timeout_s: float,
              specs: bool = True, compile_cache_dir: str | None = None) -> dict:
    """One run of ``experiments/run_sprint.py --json`` for ``entry`` (two processes for two hosts), its updater
    where the entry places it (``own``: one more device per process, the updater's; None: as ``overrides`` say).

    Args:
      entry: The configuration.
      workdir: The run's workdir; each process's stdout and stderr go there too.
      config_file: The SPRINT config file; ``overrides`` its ``--config.*`` flags.
      machine_args: ``--machine=...`` or ``--machine_file=...`` (the run's specs prediction).
      duration_s, warmup_s: The run's length and warm-up cut.
      timeout_s: Every process is killed after this long.
      specs: Let the run predict (from timings and specs; False: ``--nospecs --nopredict``, the measured
        statistics alone, which saves the network's cost table and the model's compilations, seconds).
      compile_cache_dir: JAX's persistent compilation cache for the run's processes (None: none).

    Returns:
      Process 0's JSON.

    Raises:
      RuntimeError: a process failed (with its last stderr line), outlived ``timeout_s`` or printed no JSON.
    """
    return run_series([entry], [duration_s], workdir, config_file=config_file, overrides=overrides,
                      machine_args=machine_args, warmup_s=warmup_s, timeout_s=timeout_s, specs=specs,
                      compile_cache_dir=compile_cache_dir)[0]


def same_processes(entry: grids.Entry) -> tuple:
    """What entries must share to run in one series: hosts, learners per host, updater placement."""
    return entry.hosts, entry.learners_per_host, entry.updater_device


def run_series(entries: Sequence[grids.Entry], durations_s: Sequence[float], workdir: str, *, config_file: str,
               overrides: Sequence[str], machine_args: Sequence[str], warmup_s: float, timeout_s: float,
               specs: bool = True, compile_cache_dir: str | None = None) -> list[dict]:
    """:func:`run_entry` for several entries of one process layout (:func:`same_processes`) in a row in the
    same processes, each ``durations_s`` long; ``timeout_s`` bounds the whole series. Returns process 0's JSON
    of each entry, in order.

    Raises:
      ValueError: entries of different process layouts, or not one duration per entry.
      RuntimeError: as :func:`run_entry` (a failure ends the series; none of its results is returned).
    """
    if not entries or len(durations_s) != len(entries) or len({same_processes(e) for e in entries}) != 1:
        raise ValueError("run_series needs entries of one process layout (hosts, learners per host, updater "
                         "placement) and one duration each")
    name = entries[0].name if len(entries) == 1 else f"{entries[0].name} (+{len(entries) - 1} in series)"
    _, hosts, lph, b, net_ms, where = entries[0]
    duration_s = durations_s[0]
    os.makedirs(workdir, exist_ok=True)
    args = [sys.executable, os.path.join(_HERE, "run_sprint.py"), "--json", f"--config={config_file}",
            *overrides, f"--config.sprint.learners_per_host={lph}", f"--config.sprint.sub_batch={b}",
            f"--config.sprint.network_time_s={net_ms / 1e3}", f"--config.sprint.duration_s={duration_s}",
            "--config.sprint.num_updates=0", "--config.sprint.num_epochs=0.0",
            f"--config.sprint.warmup_s={warmup_s}", "--config.sprint.checkpoint=False",
            "--config.sprint.eval_every_updates=0", *machine_args]
    if len(entries) > 1:
        args.append("--series=" + ",".join(f"{e.sub_batch}:{e.network_ms / 1e3}:{d}"
                                           for e, d in zip(entries, durations_s)))
    if not specs:  # nor from timings: the measured statistics alone
        args += ["--nospecs", "--nopredict"]
    set_where = next((a.partition("=")[2] for a in overrides if a.startswith("--config.sprint.updater_device=")), None)
    if where is not None and set_where is None:
        args.append(f"--config.sprint.updater_device={where}")
    own = (where or set_where) == "own"
    if own:
        args.append(f"--config.sprint.devices={lph}")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={lph + 1 if own else lph}")
    if compile_cache_dir:
        env.update(JAX_COMPILATION_CACHE_DIR=compile_cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    port = subprocs.coordinator_port() if hosts > 1 else None
    procs, files = [], []
    try:
        for p in range(hosts):
            extra = [] if hosts == 1 else [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={hosts}",
                                           f"--process_id={p}"]
            out = open(os.path.join(workdir, f"stdout{p}.txt"), "w")
            err = open(os.path.join(workdir, f"stderr{p}.txt"), "w")
            files += [out, err]
            procs.append(subprocess.Popen(args + [f"--workdir={workdir}"] + extra, stdout=out, stderr=err, env=env))
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"run {name} did not finish within {timeout_s:g} s (stopped)") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for f in files:
            f.close()
    for p, proc in enumerate(procs):
        if proc.returncode != 0:
            with open(os.path.join(workdir, f"stderr{p}.txt")) as fh:
                lines = [ln for ln in fh.read().strip().splitlines() if ln.strip()]
            raise RuntimeError(f"run {name} process {p} failed (exit {proc.returncode}): "
                               f"{lines[-1] if lines else 'no message'}")
    with open(os.path.join(workdir, "stdout0.txt")) as fh:
        lines = [ln for ln in fh.read().splitlines() if ln.startswith("{")]
    if len(lines) != len(entries):
        raise RuntimeError(f"run {name} printed {len(lines)} JSON reports, not {len(entries)} "
                           f"(see {workdir}/stdout0.txt)")
    return [json.loads(ln) for ln in lines]
