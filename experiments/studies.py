"""What the study launchers share: validate every cell first, run one cell, aggregate over seeds, write the
results (JSON, resumable), a Markdown table and a plot.

Lives beside the launchers, not in the library: it writes files and draws figures, and it runs the trainer
(``jaxsprint.train.trainer.train_and_evaluate``) as a black box through its public API.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from jaxsprint import cli
from jaxsprint.train import parallel, settings, trainer
from jaxsprint.errors import ConfigError, NonFiniteError, check

__all__ = ["fmt_cell", "load_json", "loss_curve", "markdown_table", "mean_std", "pyplot", "require_study",
           "run_cell", "run_cells", "save_json", "validate_cells", "write_config", "write_markdown", "check_out"]


def require_study(base, fields: Sequence[str], flag: str = "--config") -> None:
    """Checks that the study config exists and has a ``study`` block with non-empty `fields`.

    Raises:
      ConfigError: no config was given, or a study field is missing or empty.
    """
    check(base is not None, flag, None, "required: a study config file (experiments/configs/*_study.py)")
    check("study" in base, "config.study", None, "required: the study block of a study config")
    for name in fields:
        value = base.study.get(name)
        check(value is not None and len(value) > 0, f"config.study.{name}", value, "required: a non-empty tuple")


def validate_cells(configs: Iterable[tuple[str, Any]]) -> int:
    """Validates every cell's training config before any runs, so that a bad value stops the study at once
    (exit status 2 through ``jaxsprint.cli.run``) and not hours in. Returns the number of cells.

    Raises:
      ConfigError: the first bad field of the first bad cell (the trainer's own message).
    """
    n = 0
    for _, config in configs:
        settings.validate_run(config, parallel.make_mesh(config.num_devices).size)
        n += 1
    return n


def check_out(prefix: str, flag: str = "--out") -> None:
    """Checks that the study can write ``prefix.json``, ``.md``, ``.png`` and ``.config.json`` (nothing is
    created).

    Raises:
      ConfigError: named `flag`: an empty prefix, or a path whose directory is a file or cannot be created.
    """
    check(bool(prefix), flag, prefix, "an output prefix such as docs/polish-study")
    for ext in (".json", ".md", ".png", ".config.json"):
        try:
            cli.check_output_file(flag, prefix + ext)
        except ConfigError as e:
            raise ConfigError(flag, prefix, e.allowed) from None


def write_config(prefix: str, config) -> str:
    """Writes the study's resolved config (the file's values with every override) to ``prefix.config.json``,
    beside the results it produces; returns the path."""
    directory = os.path.dirname(os.path.abspath(prefix))
    return cli.write_config(directory, config, name=os.path.basename(prefix) + ".config.json")


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def run_cell(config) -> dict[str, Any]:
    """Trains one configuration in a scratch directory; returns the JSON-able part of its summary.

    Adds ``diverged`` (False), ``loss_curve`` ([(step, train loss)]) and ``eval_curve`` ([(step, top-1)]).
    A run that produces NaN/Inf
    (``NonFiniteError``) is reported with ``diverged=True``, the step, and NaN accuracies, not raised; any
    other error (a bad config) propagates.
    """
    workdir = tempfile.mkdtemp(prefix="jaxsprint-study-")
    try:
        try:
            summary = trainer.train_and_evaluate(config, workdir)
        except NonFiniteError as e:
            return {"diverged": True, "diverged_step": e.step, "eval_accuracy": float("nan"),
                    "eval_polished_accuracy": float("nan"), "final_train_loss": float("nan"),
                    "loss_curve": loss_curve(os.path.join(workdir, "metrics.jsonl"))}
        out = {k: v for k, v in summary.items() if _jsonable(v)}
        out["diverged"] = False
        out["loss_curve"] = loss_curve(os.path.join(workdir, "metrics.jsonl"))
        out["eval_curve"] = loss_curve(os.path.join(workdir, "metrics.jsonl"), "eval_accuracy")
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_cells(prefix: str, base, todo: Sequence[tuple[str, Any]], describe: Callable[[str, dict], str],
              finish: Callable[[Any, dict], None] | None = None) -> dict[str, dict]:
    """The loop every study shares: checks every cell and the outputs first, then runs each cell not yet in
    ``prefix.json`` (:func:`run_cell`, timed as ``seconds``), saving the results after each and printing
    ``describe(key, result)``; ``finish(config, result)`` may add fields before the save. Returns the results.

    Raises:
      ConfigError: the first bad cell or output (before anything is written).
    """
    validate_cells(todo)
    check_out(prefix)
    path = prefix + ".json"
    results = load_json(path, dict)
    write_config(prefix, base)
    for key, config in todo:
        if key in results:
            continue
        t = time.time()
        r = run_cell(config)
        r["seconds"] = time.time() - t
        if finish is not None:
            finish(config, r)
        results[key] = r
        save_json(path, results)
        print(describe(key, r), flush=True)
    return results


def loss_curve(path: str, key: str = "train_loss") -> list[tuple[int, float]]:
    """(step, value of `key`) of every record of a metrics.jsonl file that has one; [] if the file is missing."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if key in rec:
                out.append((rec["step"], rec[key]))
    return out


def mean_std(values: Sequence[float | None]) -> tuple[float, float, int]:
    """Mean and sample standard deviation (ddof 1; 0 for one value) over the finite values, and how many
    values were not finite (diverged runs). NaN, NaN when none is finite."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
    bad = len(values) - len(v)
    if len(v) == 0:
        return float("nan"), float("nan"), bad
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, bad


def fmt_cell(values: Sequence[float | None], scale: float = 100.0) -> str:
    """``"mean ± std"`` of the finite values times `scale`, noting diverged runs; ``"diverged (k/n)"`` if all."""
    m, s, bad = mean_std(values)
    if math.isnan(m):
        return f"diverged ({bad}/{len(values)})"
    text = f"{scale * m:.2f} ± {scale * s:.2f}"
    return text + (f" ({bad} diverged)" if bad else "")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def save_json(path: str, obj: Any) -> None:
    """Writes `obj` as JSON atomically: an interrupted study never leaves a half-written results file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def load_json(path: str, default: Callable[[], Any]) -> Any:
    """The JSON in `path`, or ``default()`` when there is no such file (a study starting afresh).

    Raises:
      ConfigError: the file exists but is not JSON (names the path; delete it or choose another --out).
    """
    if not os.path.exists(path):
        return default()
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError("--out", path, f"the results file is not JSON ({e}); move it away or pick "
                              "another prefix") from None


def write_markdown(path: str, text: str) -> None:
    """Writes the Markdown report and prints it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(text)


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (with a note) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[plot]'): no plot written")
        return None
    return plt
