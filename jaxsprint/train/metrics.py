"""Metric output of a training run (I/O only): JSON lines, TensorBoard event files, the summary table."""
from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import numpy as np

__all__ = ["MetricWriter", "add_histogram", "format_summary", "summary_table"]


class MetricWriter:
    """Metrics as JSON lines (``metrics.jsonl``) and TensorBoard event files (tensorboardX, no TensorFlow).

    Only process 0 writes; elsewhere every method does nothing.
    """

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled and jax.process_index() == 0
        self._tb = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            self._path = os.path.join(workdir, "metrics.jsonl")
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        with open(self._path, "a") as f:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in scalars.items()}}) + "\n")
        for k, v in scalars.items():
            self._tb.add_scalar(k, float(v), step)

    def write_histograms(self, step: int, hists: dict[str, np.ndarray]) -> None:
        """Counts per value (index = value) as JSON lists, and TensorBoard histograms."""
        if not self.enabled or not hists:
            return
        with open(self._path, "a") as f:
            f.write(json.dumps({"step": step, **{k: np.asarray(v).tolist() for k, v in hists.items()}}) + "\n")
        for k, counts in hists.items():
            counts = np.asarray(counts)
            values = np.repeat(np.arange(len(counts)), counts.astype(np.int64))
            if len(values):
                self._tb.add_histogram(k, values, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


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
    rows += [
        ("train step time", f"{1000 * summary['step_time_s']:.1f} ms"),
        ("throughput", f"{summary['images_per_s']:.1f} img/s"),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
    ]
    return summary_table(rows)
