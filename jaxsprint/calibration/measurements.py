"""Measurement files, the calibration's input: measured step and all-reduce timings and runtime runs
(:class:`RuntimeRun`, as the fit takes them), read and checked.

A measurement file is read by :func:`load_measurements` into plain records, which :func:`step_timings` and
:func:`allreduce_timings` turn into the inputs of :func:`jaxsprint.calibration.model_fit.fit`. Two layouts
are read:

- ``{"measurements": {"steps": [...], "allreduces": [...]}}``: a preset or ``*_measurements.json`` written
  by ``experiments/calibrate.py`` (steps of this project's CIFAR ResNets, by model name and batch; momentum
  SGD, 5 passes over the parameters in the update);
- ``{"records": [{"shape": {...}, "measured_s": ...}]}``: the small-CNN calibration set
  (``docs/perf-calibration.json``; :func:`jaxsprint.perf.zoo.small_cnn` shapes, each with its batch; plain
  SGD, 3 passes).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Sequence

import numpy as np
import scipy.stats

from jaxsprint.calibration.model_fit import AllreduceTiming, StepTiming
from jaxsprint.errors import DataError, check
from jaxsprint.perf import zoo
from jaxsprint.perf.networks import NetworkCost
from jaxsprint.perf.presets import WRITER, read_json

__all__ = ["MIN_SPLIT_CYCLES", "RuntimeRun", "allreduce_timings", "gradient_step_seconds", "input_per_sample",
           "load_measurements", "step_timings"]

# A run's two kinds of updater cycle (empty, applying) enter the fit where each kind has this many cycles.
MIN_SPLIT_CYCLES = 30

# Update passes over the 4P parameter bytes inside a timed step: momentum SGD reads the gradient and reads and
# writes the momentum and the weights (5); plain SGD reads the gradient and reads and writes the weights (3).
_MOMENTUM_SGD_PASSES = 5.0
_PLAIN_SGD_PASSES = 3.0


def _number(value: Any, *, integer: bool = False, minimum: float = 0.0) -> bool:
    """A finite JSON number (not a bool, not a string) > `minimum`, whole when `integer`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and value > minimum and (not integer or float(value).is_integer())


def _check_step(r: Any, i: int, field: str, path: str) -> None:
    where = f"steps[{i}] of {path}"
    if not isinstance(r, dict):
        raise DataError(field, r, f"{where}: an object with model, batch and measured_s")
    missing = [k for k in ("model", "batch", "measured_s") if k not in r]
    if missing:
        raise DataError(field, r, f"{where}: the keys model, batch, measured_s (missing {', '.join(missing)})")
    if r["model"] not in zoo.ZOO:
        raise DataError(field, r["model"], f"{where}: a model of the zoo ({', '.join(sorted(zoo.ZOO))})")
    if not _number(r["batch"], integer=True):
        raise DataError(field, r["batch"], f"{where}: batch, an integer >= 1")
    if not _number(r["measured_s"]):
        raise DataError(field, r["measured_s"], f"{where}: measured_s, a finite time > 0 in seconds")
    samples = r.get("samples")
    if samples is not None and not (isinstance(samples, list) and all(_number(x) for x in samples)):
        raise DataError(field, "samples", f"{where}: samples, a list of finite times > 0")


def _check_allreduce(a: Any, i: int, field: str, path: str) -> None:
    where = f"allreduces[{i}] of {path}"
    if not isinstance(a, dict):
        raise DataError(field, a, f"{where}: an object with bytes, ranks and measured_s")
    missing = [k for k in ("bytes", "ranks", "measured_s") if k not in a]
    if missing:
        raise DataError(field, a, f"{where}: the keys bytes, ranks, measured_s (missing {', '.join(missing)})")
    if not _number(a["bytes"]):
        raise DataError(field, a["bytes"], f"{where}: bytes, a message size > 0")
    if not _number(a["ranks"], integer=True, minimum=1):
        raise DataError(field, a["ranks"], f"{where}: ranks, an integer >= 2 (one rank has nothing to reduce)")
    if not _number(a["measured_s"]):
        raise DataError(field, a["measured_s"], f"{where}: measured_s, a finite time > 0 in seconds")


def _small_cnn_step(r: Any, i: int, field: str, path: str) -> dict[str, Any]:
    where = f"records[{i}] of {path}"
    shape = r.get("shape") if isinstance(r, dict) else None
    keys = ("size", "widths", "pools", "bn", "batch")
    if not isinstance(shape, dict) or any(k not in shape for k in keys) or "measured_s" not in r:
        raise DataError(field, r, f"{where}: an object with measured_s and a shape of {', '.join(keys)}")
    if not _number(shape["batch"], integer=True) or not _number(shape["size"], integer=True):
        raise DataError(field, shape, f"{where}: shape.batch and shape.size, integers >= 1")
    if not _number(r["measured_s"]):
        raise DataError(field, r["measured_s"], f"{where}: measured_s, a finite time > 0 in seconds")
    return dict(model="small_cnn", shape=shape, batch=int(shape["batch"]), measured_s=float(r["measured_s"]),
                update_passes=_PLAIN_SGD_PASSES)


def load_measurements(path: str, field: str = "measurements") -> dict[str, list[dict[str, Any]]]:
    """Measured timings of a file (see the module docstring), as ``{"steps": [...], "allreduces": [...]}``.

    A step record has ``model``, ``batch``, ``measured_s``, ``update_passes`` and, for a small CNN,
    ``shape``; it may carry ``samples`` (every timed step); an all-reduce record has ``bytes``, ``ranks``
    and ``measured_s``. Every record is checked: the keys are there, the model is in the zoo, batches and
    ranks are whole numbers (ranks >= 2), sizes and times finite and positive.

    Raises:
      DataError: an unreadable file, one without measurements or with a bad record (named ``field``; the
        message says which record and key).
    """
    what = f"measurement file ({WRITER}, or a small-CNN calibration set)"
    data = read_json(path, field, what)
    if isinstance(data, dict) and isinstance(data.get("records"), list):
        steps = [_small_cnn_step(r, i, field, path) for i, r in enumerate(data["records"])]
        if not steps:
            raise DataError(field, path, f"a {what}: holds no step timings")
        return {"steps": steps, "allreduces": []}
    meas = data.get("measurements") if isinstance(data, dict) else None
    if not isinstance(meas, dict) or "steps" not in meas or "allreduces" not in meas:
        raise DataError(field, path, f"a {what}: holds no measurements")
    if not isinstance(meas["steps"], list) or not isinstance(meas["allreduces"], list):
        raise DataError(field, path, f"a {what}: measurements.steps and measurements.allreduces are lists")
    if not meas["steps"]:
        raise DataError(field, path, f"a {what}: holds no step timings")
    for i, r in enumerate(meas["steps"]):
        _check_step(r, i, field, path)
    for i, a in enumerate(meas["allreduces"]):
        _check_allreduce(a, i, field, path)
    steps = [{"update_passes": _MOMENTUM_SGD_PASSES, **s} for s in meas["steps"]]
    return {"steps": steps, "allreduces": list(meas["allreduces"])}


def _network(record: dict[str, Any]) -> NetworkCost:
    if record["model"] == "small_cnn":
        s = record["shape"]
        return zoo.small_cnn(int(s["size"]), s["widths"], s["pools"], bool(s["bn"]))
    return zoo.get(record["model"])


def step_timings(records: Sequence[dict[str, Any]]) -> list[StepTiming]:
    """:class:`~jaxsprint.calibration.model_fit.StepTiming` of step records (one cost table per distinct network,
    so that the fit evaluates each network once, vmapped over its batches)."""
    tables: dict[str, NetworkCost] = {}
    out = []
    for r in records:
        key = json.dumps([r["model"], r.get("shape")], sort_keys=True)
        if key not in tables:
            tables[key] = _network(r)
        label = f"{r['model']} b{r['batch']}" if r["model"] != "small_cnn" else (
            f"small_cnn {r['shape']['size']}px bn={int(r['shape']['bn'])} {list(r['shape']['widths'])} b{r['batch']}")
        out.append(StepTiming(tables[key], int(r["batch"]), float(r["measured_s"]),
                              float(r.get("update_passes", _MOMENTUM_SGD_PASSES)), label))
    return out


def allreduce_timings(records: Sequence[dict[str, Any]]) -> list[AllreduceTiming]:
    """:class:`~jaxsprint.calibration.model_fit.AllreduceTiming` of all-reduce records."""
    return [AllreduceTiming(float(a["bytes"]), int(a["ranks"]), float(a["measured_s"]),
                            f"allreduce {int(a['bytes'])} B x {int(a['ranks'])}") for a in records]


def gradient_step_seconds(record: dict[str, Any]) -> float:
    """The lone step time a stored gradient-step record stands for: the 10%-trimmed mean of its ``samples``
    (a burst of other work on the machine during the timing stays out), or its ``measured_s`` when it has no samples."""
    samples = record.get("samples") or []
    return float(scipy.stats.trim_mean(samples, 0.1)) if len(samples) else float(record["measured_s"])


def input_per_sample(draws: Sequence[tuple[int, Sequence[float]]]) -> tuple[float, float]:
    """``(seconds per sample, its relative standard error)`` of a learner's input draw: the least-squares slope
    of the draws' 10%-trimmed mean times over their sub-batches (``[(sub_batch, samples)]``, 2 or more
    sub-batches; a slope below 0 is 0).

    Raises:
      ConfigError: fewer than 2 distinct sub-batches, or a sub-batch without finite samples > 0.
    """
    b = [int(x) for x, _ in draws]
    check(len(set(b)) >= 2, "input_draws", b, "draws at 2 or more distinct sub-batches")
    t = []
    for x, samples in draws:
        v = np.asarray(samples, np.float64)
        check(v.size > 0 and bool(np.all(np.isfinite(v) & (v > 0))), "input_draws", x,
              "a sub-batch with finite draw times > 0")
        t.append(float(scipy.stats.trim_mean(v, 0.1)))
    line = scipy.stats.linregress(b, t)
    slope = max(float(line.slope), 0.0)
    rse = float(line.stderr) / slope if slope > 0 and len(b) > 2 else math.inf
    return slope, rse


@dataclasses.dataclass(frozen=True)
class RuntimeRun:
    """One measured run of the runtime (its statistics after the warm-up).

    Attributes:
      learners_per_host: Learner threads per host.
      hosts: Processes (1: no all-reduce).
      sub_batch: Samples per gradient.
      network_time_s: Emulated network time of every updater cycle.
      t_compute_s: Measured mean learner cycle, start to start (:func:`jaxsprint.runtime.events.statistics`).
      t_update_s: Measured mean updater cycle.
      t_compute_cv, t_update_cv: Their coefficients of variation (0 if not measured).
      label: Name for tables.
      updater_device: ``shared`` (the updater's programs on the first learner's device) or ``own``.
      t_update_empty_s, t_update_applying_s: Measured mean of the updater cycles that gathered no gradient,
        of those that applied an update (0: not measured); ``empty_cycles``, ``applying_cycles``: over how many.
    """

    learners_per_host: int
    hosts: int
    sub_batch: int
    network_time_s: float
    t_compute_s: float
    t_update_s: float
    t_compute_cv: float = 0.0
    t_update_cv: float = 0.0
    label: str = ""
    updater_device: str = "own"
    t_update_empty_s: float = 0.0
    t_update_applying_s: float = 0.0
    empty_cycles: int = 0
    applying_cycles: int = 0

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> "RuntimeRun":
        """From a JSON record with these keys (extra keys ignored; a record without ``updater_device`` is one of
        validate_runtime's fixed grids of before the field, whose runs all had the updater on its own device).
        With ``images_per_s``, ``t_compute_s`` is its mean, ``N b / images_per_s``, from the completions: records
        of before the start-to-start cycle left each gradient's hand-off to the buffer out of ``t_compute_s``."""
        where = str(r.get("updater_device") or "own")
        check(where in ("shared", "own"), "updater_device", where, "shared or own (a runtime run's record)")
        def optional(key, kind):  # absent or None (NaN in the JSON): not measured
            v = r.get(key)
            return kind(v) if v is not None and math.isfinite(float(v)) else kind(0)
        n, h, b, rate = int(r["learners_per_host"]), int(r.get("hosts", 1)), int(r["sub_batch"]), optional(
            "images_per_s", float)
        tc = n * h * b / rate if rate > 0 else float(r["t_compute_s"])
        return cls(n, h, b, float(r.get("network_time_s", 0.0)), tc, float(r["t_update_s"]),
                   float(r.get("t_compute_cv", 0.0)), float(r.get("t_update_cv", 0.0)), str(r.get("label", "")),
                   where, optional("t_update_empty_s", float), optional("t_update_applying_s", float),
                   optional("empty_cycles", int), optional("applying_cycles", int))

    def split_weights(self) -> tuple[float, float]:
        """Whether the fit uses this run's mean empty and mean applying cycle (1) or not (0): both kinds measured,
        each over at least :data:`MIN_SPLIT_CYCLES` cycles (with one kind alone its mean is ``T_u``)."""
        both = (min(self.empty_cycles, self.applying_cycles) >= MIN_SPLIT_CYCLES
                and self.t_update_empty_s > 0 and self.t_update_applying_s > 0)
        return (1.0, 1.0) if both else (0.0, 0.0)
