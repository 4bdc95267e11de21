"""What a training run reports: JSON lines, TensorBoard event files, a jax.profiler trace, the summary table.

`MetricWriter` writes ``metrics.jsonl`` and TensorBoard files (tensorboardX; the resolved config once as the
hyper-parameters of the hparams plugin); `Window` gathers the metrics of the steps between two log lines,
checks them for NaN/Inf and writes them with the steps/s and images/s of the window; `Trace` records a
``jax.profiler`` trace of chosen updates. Paths go through ``etils.epath`` (`jaxsprint.paths.as_path`), so a
workdir may be any path or URI that epath supports.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable

import jax
import numpy as np

from jaxsprint import paths
from jaxsprint.train import noise
from jaxsprint.errors import NonFiniteError

__all__ = ["HPARAM_METRICS", "MetricWriter", "Progress", "Trace", "Window", "add_histogram", "format_summary",
           "hparams", "summary_table"]

# The scalars the hparams plugin shows beside the hyper-parameters (tags written by the run).
HPARAM_METRICS = ("eval_accuracy", "eval_loss", "eval_polished_accuracy", "train_loss", "images_per_s")


def hparams(flat: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """`flat` (dotted config fields, JSON values) as hyper-parameters: numbers, booleans and text kept, a list
    as comma-separated text, None (an unset placeholder) left out."""
    out: dict[str, bool | int | float | str] = {}
    for name, value in flat.items():
        if isinstance(value, (list, tuple)):
            out[name] = ",".join(str(v) for v in value)
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif value is not None:
            out[name] = str(value)
    return out


class MetricWriter:
    """Metrics as JSON lines (``metrics.jsonl``) and TensorBoard event files (tensorboardX, no TensorFlow).

    Only process 0 writes; elsewhere every method does nothing.
    """

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled and jax.process_index() == 0
        self._tb = None
        if self.enabled:
            folder = paths.as_path(workdir)
            folder.mkdir(parents=True, exist_ok=True)
            self._path = folder / "metrics.jsonl"
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.fspath(folder / "tensorboard"))

    def _append(self, record: dict) -> None:
        with self._path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._append({"step": step, **{k: float(v) for k, v in scalars.items()}})
        for k, v in scalars.items():
            self._tb.add_scalar(k, float(v), step)

    def write_hparams(self, values: dict[str, bool | int | float | str],
                      metric_tags: tuple[str, ...] = HPARAM_METRICS) -> None:
        """The run's hyper-parameters (see :func:`hparams`) for TensorBoard's hparams plugin, in this run's
        own event file (the plugin reads `metric_tags` from the run's scalars); call it once at the start."""
        if not self.enabled:
            return
        from tensorboardX.summary import hparams as hparams_summaries

        experiment, start, _ = hparams_summaries(values, {tag: 0.0 for tag in metric_tags})
        writer = self._tb._get_file_writer()  # noqa: SLF001 (add_hparams would write into a new sub-run)
        writer.add_summary(experiment)
        writer.add_summary(start)

    def write_histograms(self, step: int, hists: dict[str, np.ndarray]) -> None:
        """Counts per value (index = value) as JSON lists, and TensorBoard histograms."""
        if not self.enabled or not hists:
            return
        self._append({"step": step, **{k: np.asarray(v).tolist() for k, v in hists.items()}})
        for k, counts in hists.items():
            counts = np.asarray(counts)
            values = np.repeat(np.arange(len(counts)), counts.astype(np.int64))
            if len(values):
                self._tb.add_histogram(k, values, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


class Window:
    """Metrics of the steps since the last log line: fetched together, checked for NaN/Inf, written with
    the window's ``steps_per_s`` and ``images_per_s`` (from the second window on: the first one compiles).

    Args:
      writer: where the lines go.
      names: the names of the entries of the step's ``guard`` vector (`trainer.guard_names`).
      schedule: the learning rate of an update (0-based), written as ``lr``.
      global_batch: images per update.
      hist_sizes: ``{metric: (histogram name, number of values)}`` of the integer metrics to count.
      noise: collects every step's noise-scale estimates and writes their moving averages (`noise.Tracker`).
    """

    def __init__(self, writer: MetricWriter, names: list[str], *, schedule: Callable, global_batch: int,
                 hist_sizes: dict[str, tuple[str, int]], noise=None):
        self.writer, self.names, self.schedule, self.global_batch = writer, names, schedule, global_batch
        self.hist_sizes = hist_sizes
        self.noise = noise
        self.pending: list[tuple[int, dict]] = []
        self.checked = 0  # pending entries whose guard has been checked
        self.last: dict[str, float] = {}
        self.hists: dict[str, np.ndarray] = {}
        self.seconds, self.timed = 0.0, 0
        self._t = None

    def check(self) -> None:
        """Raises NonFiniteError at the first pending step whose guard is not finite (a small fetch; call it
        before a checkpoint so that none holds a state after a non-finite step)."""
        new = self.pending[self.checked:]
        for s, guard in jax.device_get([(s, m["guard"]) for s, m in new]):
            bad = np.flatnonzero(~np.isfinite(guard))
            if len(bad):
                raise NonFiniteError(s, self.names[bad[0]], float(guard[bad[0]]))
        self.checked = len(self.pending)

    def flush(self) -> None:
        self.check()
        fetched, self.pending, self.checked = jax.device_get(self.pending), [], 0
        for s, m in fetched:
            del m["guard"]
            for name, value in m.items():
                if not np.isfinite(value):
                    raise NonFiniteError(s, name, float(value))
        for metric, (key, size) in self.hist_sizes.items():
            if metric in fetched[0][1]:
                self.hists[key] = add_histogram(self.hists.get(key), [m[metric] for _, m in fetched], size)
        if self.noise is not None:
            for s, m in fetched:
                self.noise.add(s, m["noise_g2"], m["noise_trace"], m["accuracy"])
        now, speed = time.time(), {}
        if self._t is not None and now > self._t:
            self.seconds, self.timed = self.seconds + now - self._t, self.timed + len(fetched)
            speed = {"steps_per_s": len(fetched) / (now - self._t),
                     "images_per_s": len(fetched) * self.global_batch / (now - self._t)}
        self._t = now
        s, m = fetched[-1]
        self.last = {f"train_{k}": float(v) for k, v in m.items()}
        self.last["lr"] = float(self.schedule(s - 1))
        if self.noise is not None:
            self.last.update(self.noise.logged())
        self.writer.write(s, {**self.last, **speed})
        self.writer.write_histograms(s, self.hists)

    def pause(self) -> None:
        """Time from now on until the next flush is not step time (evaluation ran)."""
        self._t = time.time()


class Progress:
    """tqdm's bar on process 0 when `enabled`; log lines go above it."""

    def __init__(self, enabled: bool, total: int, initial: int):
        self.bar = None
        if enabled and jax.process_index() == 0:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def update(self, last: dict[str, float]) -> None:
        if self.bar is not None:
            if last:
                self.bar.set_postfix(loss=f"{last['train_loss']:.3f}", acc=f"{last['train_accuracy']:.3f}",
                                     refresh=False)
            self.bar.update(1)

    def say(self, msg: str) -> None:
        if jax.process_index() == 0:
            (self.bar.write if self.bar is not None else print)(msg)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Trace:
    """A ``jax.profiler`` trace of the updates a..b-1 (counted from 0) into ``WORKDIR/profile`` (per process
    ``profile/process_<i>`` in a multi-process run): ``plugins/profile/<time>/<host>.xplane.pb`` for
    TensorBoard's profile plugin (``tensorboard-plugin-profile``) or xprof, and ``<host>.trace.json.gz`` for
    Perfetto. Writing needs nothing beyond jax. A resumed run traces the part of the range it runs.

    Args:
      steps: ``(a, b)`` (`jaxsprint.train.settings.profile_range`), or None: no trace.
      workdir: the run's directory.
    """

    def __init__(self, steps: tuple[int, int] | None, workdir: str):
        self.steps, self.active = steps, False
        folder = paths.as_path(workdir) / "profile"
        self.folder = folder / f"process_{jax.process_index()}" if jax.process_count() > 1 else folder

    def before(self, index: int, state) -> None:
        """Starts the trace before update `index` (from 0) when it is in the range (after the work before it)."""
        if self.steps and not self.active and self.steps[0] <= index < self.steps[1]:
            jax.block_until_ready(state)
            jax.profiler.start_trace(os.fspath(self.folder))
            self.active = True

    def after(self, steps_done: int, state) -> None:
        """Stops the trace once `steps_done` updates reach the range's end (and their work is done)."""
        if self.active and steps_done >= self.steps[1]:
            self.stop(state)

    def stop(self, state) -> None:
        """Stops a running trace (at the end of the range, or when the loop ends early)."""
        if self.active:
            self.active = False
            try:
                jax.block_until_ready(state)
            finally:
                jax.profiler.stop_trace()


def add_histogram(counts: np.ndarray | None, values, size: int) -> np.ndarray:
    """``counts`` (None: zeros) plus the counts of the non-negative integers ``values`` below ``size``."""
    h = np.bincount(np.asarray(values, np.int64).ravel(), minlength=size)
    return h[:size] if counts is None else counts + h[:len(counts)]


def summary_table(rows: list[tuple[str, str]]) -> str:
    """A two-column text table."""
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * (vwidth + 2) + "+"
    out = [line] + [f"| {k.ljust(width)} | {v.rjust(vwidth)} |" for k, v in rows] + [line]
    return "\n".join(out)


def _hist_mean(counts) -> float:
    h = np.asarray(counts, np.float64)
    return float((h * np.arange(len(h))).sum() / max(h.sum(), 1))


def format_summary(summary: dict[str, Any]) -> str:
    """The final summary table of `jaxsprint.train.trainer.train_and_evaluate`, as the launcher prints it."""
    rows = [
        ("dataset / model", f"{summary['dataset']} / {summary['model']}"),
        ("devices", str(summary["devices"])),
        ("global batch", str(summary["global_batch"])),
        ("steps (epochs)", f"{summary['steps']} ({summary['epochs']:.1f})"),
        ("peak learning rate", f"{summary['peak_lr']:.4g}"),
        ("final train loss", f"{summary['final_train_loss']:.4f}"),
        ("eval top-1 accuracy", f"{100 * summary['eval_accuracy']:.2f}%"),
        ("eval loss", f"{summary['eval_loss']:.4f}"),
    ]
    if summary["polish_mode"] != "none":
        rows.append(("polish mode", summary["polish_mode"]))
    if not math.isnan(summary["eval_polished_accuracy"]):
        rows += [("eval top-1, polished BN", f"{100 * summary['eval_polished_accuracy']:.2f}%"),
                 ("eval loss, polished BN", f"{summary['eval_polished_loss']:.4f}"),
                 ("polishing pass time", f"{summary['polish_time_s']:.1f} s")]
    if "staleness_hist" in summary:
        rows.append(("mean realised staleness", f"{_hist_mean(summary['staleness_hist']):.2f}"))
    if "minibatch_hist" in summary:
        rows.append(("mean sub-batches / update", f"{_hist_mean(summary['minibatch_hist']):.2f}"))
    if summary.get("noise_scale"):
        run = summary["noise_scale"]["run"]
        rows.append(("noise scale B_simple", f"{run['b_simple']:.4g} +- {run['b_simple_se']:.2g} (whole run)"))
    rows += [
        ("train step time", f"{1000 * summary['step_time_s']:.1f} ms"),
        ("throughput", f"{summary['images_per_s']:.1f} img/s"),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
    ]
    if summary.get("noise_scale"):
        return summary_table(rows) + "\n\n" + noise.format_report(summary["noise_scale"])
    return summary_table(rows)
