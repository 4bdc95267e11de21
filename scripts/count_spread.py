r"""The spread of the gradients per update: measured against the model from timings, over saved runtime runs.

For each run of ``validate_runtime.py`` output directories (``<out>/runs/<name>/events.npz``): the measured
count standard deviation over the model's from the run's timings (:func:`jaxsprint.calibration.compare.
predict_from_timings`), the mini-batch TV, and the learners' compute-time lag-1 autocorrelation ``rho``
(:func:`jaxsprint.runtime.events.count_coupling`). Then the same prediction with the compute cv widened to the
renewal process with the same long-window count variance as learners whose slowness persists,
``cv sqrt((1 + rho) / (1 - rho))``: the TV and the means' errors, per run, median and 90th percentile.

  .venv/bin/python scripts/count_spread.py --out=runs/val_r0,runs/val_r1 [--json=spread.json]

docs/calibration.md ("The mini-batch pmf where learners are not independent") has the figures.
"""
from __future__ import annotations

import glob
import json
import math
import os

from absl import flags

import benchlib  # noqa: F401  (puts the repository root on sys.path)
from jaxsprint import cli
from jaxsprint.errors import check

_OUT = flags.DEFINE_list("out", None, "validate_runtime.py output directories (their runs/*/events.npz).")
_JSON = flags.DEFINE_string("json", None, "Write the rows here as JSON.")


def spread(path: str) -> dict:
    """One run's row (module docstring)."""
    from jaxsprint.calibration import compare
    from jaxsprint.runtime import events

    ev = events.load(path)
    st = events.statistics(ev)
    rho = events.count_coupling(ev)["compute_lag1"]
    row = {"run": os.path.relpath(os.path.dirname(path)), "learners_per_host": int(ev["learners_per_host"]),
           "rho": rho}
    r = max(rho, 0.0) if math.isfinite(rho) else 0.0
    for tag, k in (("model", 1.0), ("persistent", math.sqrt((1 + r) / (1 - r)))):
        pr = compare.predict_from_timings(dict(st, t_compute_cv=st["t_compute_cv"] * k))
        row[tag] = {"std_ratio": st["std_count"] / pr["std_count"],
                    "minibatch_tv": compare.tv_distance(st["minibatch_pmf"], pr["minibatch_pmf"]),
                    "mean_minibatch_error": pr["mean_minibatch"] / st["mean_minibatch"] - 1.0,
                    "mean_staleness_error": pr["mean_staleness"] / st["mean_staleness"] - 1.0}
    return row


def main(argv: list[str]) -> None:
    import numpy as np

    check(len(argv) == 1, "arguments", argv[1:], "none besides --flags")
    check(bool(_OUT.value), "--out", _OUT.value, "validate_runtime.py output directories, comma-separated")
    paths = []
    for d in _OUT.value:
        found = sorted(glob.glob(os.path.join(d, "runs", "*", "events.npz")))
        check(bool(found), "--out", d, "a validate_runtime.py output directory with runs/*/events.npz")
        paths += found
    if _JSON.value:
        cli.check_output_file("--json", _JSON.value)
    rows = [spread(p) for p in paths]
    print(f"{'run':44s} {'N/host':>6s} {'rho':>6s} | model: {'std':>5s} {'TV':>6s} | persistent: {'std':>5s} "
          f"{'TV':>6s} {'mb err':>7s} {'stale err':>9s}")
    for r in rows:
        m, p = r["model"], r["persistent"]
        print(f"{r['run'][-44:]:44s} {r['learners_per_host']:6d} {r['rho']:+6.2f} | {m['std_ratio']:12.2f} "
              f"{m['minibatch_tv']:6.3f} | {p['std_ratio']:17.2f} {p['minibatch_tv']:6.3f} "
              f"{p['mean_minibatch_error']:+7.3f} {p['mean_staleness_error']:+9.3f}")
    for tag in ("model", "persistent"):
        stats = {k: np.abs([r[tag][k] for r in rows]) for k in ("minibatch_tv", "mean_minibatch_error",
                                                                 "mean_staleness_error")}
        print(f"{tag:10s} " + "; ".join(f"{k}: median {np.median(v):.3f}, p90 {np.percentile(v, 90):.3f}"
                                        for k, v in stats.items())
              + f"; count std below the model's in {sum(r[tag]['std_ratio'] < 0.99 for r in rows)} of {len(rows)}")
    if _JSON.value:
        with open(_JSON.value, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    cli.run(main)
