r"""Several held-out draws of ``validate_runtime.py --config.validation.grid=random`` against one preset, pooled.

A draw of 24 holds 12 configurations per updater placement, and its 90th percentile is about its second-largest
error: two or more draws against the same preset (other ``random_seed``\ s) judge the preset on more. This reads
each ``<out>/results.json`` and ``<out>/config.json``, refuses draws against different presets, and prints per
placement the median and 90th percentile of the absolute errors (epoch time, mean mini-batch, mean staleness)
from specs and from timings over all their runs (and each draw's learner cycle from specs against the measured
one, geometric mean: a machine faster or slower than at its calibration moves a whole draw), then whether the
bar holds: from specs every median within
``--median_bar`` and every 90th percentile within ``--p90_bar``, for each placement.

  .venv/bin/python scripts/pool_draws.py --out=runs/val_r26,runs/val_r27

docs/calibration.md ("cal29 on seeds 26 and 27, held out") has such a table.
"""
from __future__ import annotations

import json
import os

from absl import flags

import benchlib  # noqa: F401  (puts the repository root on sys.path)
from jaxsprint import cli
from jaxsprint.errors import check

_OUT = flags.DEFINE_list("out", None, "validate_runtime.py output directories of one preset (comma-separated).")
_MEDIAN_BAR = flags.DEFINE_float("median_bar", 0.10, "The bar of each median from specs (a fraction).")
_P90_BAR = flags.DEFINE_float("p90_bar", 0.25, "The bar of each 90th percentile from specs (a fraction).")

KEYS = (("epoch time", "epoch_time_rel_error"), ("mean mini-batch", "mean_minibatch_rel_error"),
        ("mean staleness", "mean_staleness_rel_error"))
PLACEMENTS = ("own", "shared")
SOURCES = ("specs", "timings")


def read_draw(out: str) -> tuple[str, list[dict]]:
    """``(preset file, runs)`` of one ``validate_runtime.py`` output directory.

    Raises:
      ConfigError: a directory without a readable results.json and config.json, or without runs.
    """
    what = "a validate_runtime.py output directory (results.json with runs, config.json)"
    try:
        with open(os.path.join(out, "results.json")) as fh:
            runs = json.load(fh)["runs"]
        with open(os.path.join(out, "config.json")) as fh:
            validation = json.load(fh)["validation"]
    except (OSError, ValueError, KeyError, TypeError):
        check(False, "--out", out, what)
    check(isinstance(runs, list) and bool(runs), "--out", out, what)
    return str(validation.get("machine_file") or validation.get("machine")), runs


def pool(runs: list[dict]) -> dict:
    """``{placement: {"n": runs, source: {key: {"median", "p90"}}}}`` over ``runs`` (NaN-free errors only)."""
    from jaxsprint.calibration import compare

    out = {}
    for where in PLACEMENTS:
        part = [r for r in runs if r.get("updater_device") == where]
        if part:
            out[where] = {"n": len(part), **{s: compare.summarize_errors([r.get(f"errors_from_{s}") for r in part])
                                            for s in SOURCES}}
    return out


def verdict(pooled: dict, median_bar: float, p90_bar: float) -> dict[str, list[str]]:
    """Per placement, what misses the bar from specs (empty: met)."""
    misses = {}
    for where, part in pooled.items():
        misses[where] = [f"{label} {stat} {100 * part['specs'][key][stat]:.1f}%" for label, key in KEYS
                         for stat, bar in (("median", median_bar), ("p90", p90_bar))
                         if not part["specs"][key][stat] <= bar]
    return misses


def main(argv: list[str]) -> None:
    check(len(argv) == 1, "arguments", argv[1:], "none besides --flags")
    check(bool(_OUT.value), "--out", _OUT.value, "validate_runtime.py output directories, comma-separated")
    for flag in (_MEDIAN_BAR, _P90_BAR):
        check(0 < flag.value < 10, f"--{flag.name}", flag.value, "a fraction > 0 (0.10 is 10%)")
    draws = [(out, *read_draw(out)) for out in _OUT.value]
    presets = sorted({p for _, p, _ in draws})
    check(len(presets) == 1, "--out", ",".join(_OUT.value), f"draws against one preset (these used {presets})")
    runs = [r for _, _, rs in draws for r in rs]
    pooled = pool(runs)
    print(f"{len(draws)} draws against {presets[0]}, {len(runs)} runs")
    from jaxsprint.calibration import compare
    for out, _, rs in draws:  # a speed change between calibration and draw moves every run of that draw alike
        shift, n = compare.cycle_shift(rs)
        if n:
            print(f"{out}: the learner cycle from specs {100 * shift:+.1f}% over its {n} runs (geometric mean)")
    print("| placement (runs) | source | statistic | " + " | ".join(label for label, _ in KEYS) + " |")
    print("|---|---|---|" + "---|" * len(KEYS))
    for where, part in pooled.items():
        for source in SOURCES:
            for stat in ("median", "p90"):
                cells = " | ".join(f"{100 * part[source][key][stat]:.1f}%" for _, key in KEYS)
                print(f"| {where} ({part['n']}) | {source} | {stat} | {cells} |")
    misses = verdict(pooled, _MEDIAN_BAR.value, _P90_BAR.value)
    print(f"bar from specs (medians within {100 * _MEDIAN_BAR.value:g}%, 90th percentiles within "
          f"{100 * _P90_BAR.value:g}%): " + "; ".join(f"{w}: " + (f"missed ({', '.join(m)})" if m else "met")
                                                    for w, m in misses.items()))


if __name__ == "__main__":
    cli.run(main)
