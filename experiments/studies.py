"""Helpers shared by the study scripts: run one cell, aggregate, write a Markdown table and a plot."""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from typing import Any, Callable, Sequence

import numpy as np

from jaxsprint import train
from jaxsprint.errors import NonFiniteError


def run_cell(config) -> dict[str, Any]:
    """Trains one configuration in a scratch directory; returns the JSON-able summary.

    A run that produces NaN/Inf is reported with ``diverged=True`` and the step, not raised.
    """
    workdir = tempfile.mkdtemp(prefix="jaxsprint-study-")
    try:
        s = train.train_and_evaluate(config, workdir)
        out = {k: v for k, v in s.items() if k not in ("state", "experiment", "polished_batch_stats")}
        out["diverged"] = False
        out["loss_curve"] = _loss_curve(os.path.join(workdir, "metrics.jsonl"))
        return out
    except NonFiniteError as e:
        return {"diverged": True, "diverged_step": e.step, "eval_accuracy": float("nan"),
                "eval_polished_accuracy": float("nan"), "final_train_loss": float("nan"),
                "loss_curve": _loss_curve(os.path.join(workdir, "metrics.jsonl"))}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _loss_curve(path: str) -> list[tuple[int, float]]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "train_loss" in rec:
                out.append((rec["step"], rec["train_loss"]))
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean and sample standard deviation over the finite values, and how many were not finite."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
    bad = len(values) - len(v)
    if len(v) == 0:
        return float("nan"), float("nan"), bad
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, bad


def fmt_cell(values: Sequence[float], scale: float = 100.0) -> str:
    m, s, bad = mean_std(values)
    if math.isnan(m):
        return f"diverged ({bad}/{len(values)})"
    text = f"{scale * m:.2f} ± {scale * s:.2f}"
    return text + (f" ({bad} diverged)" if bad else "")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def save_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)  # never leaves a half-written results file


def load_json(path: str, default: Callable[[], Any]) -> Any:
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return default()


def write_report_text(path: str, text: str):
    """Writes the Markdown report, prints it, and returns matplotlib's pyplot (Agg) or None if not installed."""
    with open(path, "w") as f:
        f.write(text)
    print(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[plot]'): no plot written")
        return None
    return plt
