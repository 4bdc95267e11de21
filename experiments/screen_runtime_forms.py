r"""Screen a bottleneck form of the runtime's cycle times, leave one out, on the saved validation grid.

A screening tool, not the library's model: it reads the measured cycle means of the saved grid
(``docs/runtime-validation/results.json``) and the single-learner step times of the calibration
(``docs/runtime-calibration.json``; each the mean of its samples, as the calibration takes it), fits the form
below to every run but one (scipy ``least_squares`` on the log errors of ``T_c`` and ``T_u``) and predicts the
one left out, as
:func:`jaxsprint.calibration.host_fit.cross_validate` does for :mod:`jaxsprint.perf.times`. The errors it
prints are those of the cycle means; the epoch time's error is ``T_c``'s and the mean mini-batch's is
``(1 + e_u) / (1 + e_c) - 1`` (mean mini-batch = sub-batch x learners x ``T_u / T_c``). On the saved grid
these match the errors ``validate_runtime.py`` reports from the full model (which also depend on the cycles'
cvs) within 3.2 points, 0.4 in the median.

The form (``N`` learners on the machine, ``N_h`` per host, ``H`` hosts as processes, ``C`` cores, ``t_s(b)``
the measured lone step, ``t_net`` the emulated network time):

.. math::
    T_c = \big(t_{lone}^{k} + t_{gil}^{k} + t_{cpu}^{k}\big)^{1/k}, \quad
    t_{lone} = t_s + g, \quad t_{gil} = \frac{N_h\,g}{1 - \beta/2}, \quad
    t_{cpu} = \frac{N\,p(b)\,t_s}{C - H\beta\,c_u}, \quad p(b) = 1 + k_p \frac{b}{b + b_0}, \\
    T_u = t_{own} + t_{net}, \quad
    t_{own} = \big(a + c\,N_h + q\,t_s\,\mathrm{clip}(N - C + 1, 0, 1)\big)(1 + s_H [H > 1]), \quad
    \beta = t_{own} / T_u

a smooth maximum of three bounds of a closed network: a lone learner (its step and its host work ``g``), the
host's interpreter lock (one per process: ``N_h`` learners' host work serialised, less what the updater holds)
and the shared cores (a lone step uses ``p(b)`` cores; the updaters take ``c_u`` of a core while busy).

Example::

    python experiments/screen_runtime_forms.py
"""
from __future__ import annotations

import json
import os

import numpy as np
from absl import flags

from jaxsprint import cli
from jaxsprint.errors import check
from jaxsprint.calibration import host_fit

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_RESULTS = flags.DEFINE_string("results", os.path.join(_ROOT, "docs", "runtime-validation", "results.json"),
                               "results.json of a saved validate_runtime.py grid.")
_CALIBRATION = flags.DEFINE_string("calibration", os.path.join(_ROOT, "docs", "runtime-calibration.json"),
                                   "calibrate_runtime.py output holding the single-learner step times.")
_SHARPNESS = flags.DEFINE_float("sharpness", 8.0, "Exponent k of the smooth maximum (> 1).")
_CORES = flags.DEFINE_float("cores", 2.0, "Cores of the machine the grid ran on.")

NAMES = ("g", "k_p", "b_0", "a", "c", "q", "s_H", "c_u")
START = (2e-3, 0.5, 32.0, 1e-3, 1e-3, 0.5, 1.0, 0.5)
LOWER = (0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)
UPPER = (0.02, 1.0, 1000.0, 0.05, 0.05, 5.0, 10.0, 1.0)


def cycle_times(theta, run: dict, cores: float, sharpness: float) -> tuple[float, float]:
    """``(T_c, T_u)`` of one run under the form of the module docstring."""
    g, k_p, b_0, a, c, q, s_h, c_u = theta
    n, h, n_h, b, t_s = run["L"] * run["H"], run["H"], run["L"], run["b"], run["t_step"]
    own = (a + c * n_h + q * t_s * min(1.0, max(0.0, n - cores + 1))) * (1.0 + (s_h if h > 1 else 0.0))
    t_u = own + run["net"]
    beta = own / t_u
    lone = t_s + g
    gil = n_h * g / max(1e-3, 1.0 - 0.5 * beta)
    cpu = n * (1.0 + k_p * b / (b + b_0)) * t_s / max(1e-3, cores - h * beta * c_u)
    t_c = (lone ** sharpness + gil ** sharpness + cpu ** sharpness) ** (1.0 / sharpness)
    return t_c, t_u


def fit(runs: list[dict], cores: float, sharpness: float) -> np.ndarray:
    """Least squares on the log errors of both cycle means of ``runs``."""
    from scipy.optimize import least_squares

    def residuals(theta):
        out = []
        for r in runs:
            t_c, t_u = cycle_times(theta, r, cores, sharpness)
            out += [np.log(t_c / r["Tc"]), np.log(t_u / r["Tu"])]
        return np.asarray(out)

    return least_squares(residuals, START, bounds=(LOWER, UPPER), method="trf").x


def load_runs(results: str, calibration: str) -> list[dict]:
    """The grid's runs with their measured cycle means and the calibration's lone step at their sub-batch."""
    for name, path in (("--results", results), ("--calibration", calibration)):
        check(os.path.isfile(path), name, path, "an existing JSON file")
    with open(calibration) as fh:
        steps = {int(s["sub_batch"]): host_fit.gradient_step_seconds(s)
                 for s in json.load(fh)["measurements"]["gradient_steps"]}
    with open(results) as fh:
        grid = json.load(fh)["runs"]
    runs = []
    for r in grid:
        m = r["measured"]
        check(r["sub_batch"] in steps, "sub_batch", r["sub_batch"],
              f"a sub-batch with a calibrated step time: one of {sorted(steps)}")
        runs.append(dict(name=r["name"], H=r["hosts"], L=r["learners_per_host"], b=r["sub_batch"],
                         net=m["network_time_s"], Tc=m["t_compute_s"], Tu=m["t_update_s"],
                         t_step=steps[r["sub_batch"]]))
    check(len(runs) >= 3, "--results", results, "a grid of at least 3 runs")
    return runs


def main(argv):
    check(len(argv) == 1, "arguments", argv[1:], "none besides flags")
    check(_SHARPNESS.value > 1, "--sharpness", _SHARPNESS.value, "a number > 1")
    check(_CORES.value > 0, "--cores", _CORES.value, "a number > 0")
    runs = load_runs(_RESULTS.value, _CALIBRATION.value)
    k, cores = _SHARPNESS.value, _CORES.value
    print("| run | T_c error | T_u error | epoch error | mean mini-batch error |\n|---|---|---|---|---|")
    errs = []
    for i, r in enumerate(runs):
        theta = fit(runs[:i] + runs[i + 1:], cores, k)
        t_c, t_u = cycle_times(theta, r, cores, k)
        e_c, e_u = t_c / r["Tc"] - 1.0, t_u / r["Tu"] - 1.0
        e_mb = (1.0 + e_u) / (1.0 + e_c) - 1.0
        errs.append((e_c, e_u, e_c, e_mb))
        print(f"| {r['name']} | {100 * e_c:+.1f}% | {100 * e_u:+.1f}% | {100 * e_c:+.1f}% | {100 * e_mb:+.1f}% |")
    a = np.abs(np.asarray(errs))
    for label, stat in (("median", np.median(a, axis=0)), ("p90", np.percentile(a, 90, axis=0))):
        print(f"| **{label} of the absolute values** | " + " | ".join(f"{100 * v:.1f}%" for v in stat) + " |")
    theta = fit(runs, cores, k)
    print("\nfitted to every run: " + ", ".join(f"{n}={v:.4g}" for n, v in zip(NAMES, theta)))


if __name__ == "__main__":
    cli.run(main)
