r"""Screen variants of ``perf.times``' runtime form, leave one out, on saved validation grids of several machines.

Each ``--grid`` is a saved ``validate_runtime.py`` grid (its ``results.json``: the measured cycle means of every
run) with the ``calibrate_runtime.py`` output of the machine it ran on (compute figures, the measured cores of a
lone step). For every variant of the form (which runtime figures stage 3 fits, and which terms are on) and every
smooth-maximum exponent ``k`` (:data:`jaxsprint.perf.times.RUNTIME_SHARPNESS`), each run of a grid is predicted
by the machine refitted to the grid's OTHER runs (:func:`jaxsprint.calibration.host_fit.cross_validate`, as
``validate_runtime.py --specs=loo`` does). The errors printed are those of the cycle means: the epoch time's
error is ``T_c``'s, the mean mini-batch's ``(1 + e_u) / (1 + e_c) - 1`` (mean mini-batch = sub-batch x
learners x ``T_u / T_c``); the full model's (``validate_runtime.py --reanalyse``, which also depend on the
cycles' cvs) are close to these.

Variants (each adds to the one above it, ``library`` is the form :mod:`jaxsprint.perf.times` ships):

* ``earlier``: the six figures of the form before 2026-12-03 (host work, the updater's overhead, per learner,
  cores while busy, stretch on co-located hosts, queue), a step's cores the measured lone value, every cycle
  paying for an update;
* ``apply``: + ``updater_apply_s`` (an empty cycle skips the optimizer);
* ``cores``: + ``learner_step_cores`` fitted (from the measured value) at every sub-batch;
* ``library``: + ``learner_step_cores_half_batch`` (a step's cores grow with the sub-batch).

Example::

    python experiments/screen_runtime_model.py --exponent=8 --exponent=4 --exponent=2
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import check  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_DEFAULT_GRIDS = [
    f"{os.path.join(_ROOT, 'docs', 'runtime-validation', 'results.json')},"
    f"{os.path.join(_ROOT, 'docs', 'runtime-calibration.json')}",
    f"{os.path.join(_ROOT, 'docs', 'runtime-second-cpu', 'validation', 'results.json')},"
    f"{os.path.join(_ROOT, 'docs', 'runtime-second-cpu', 'runtime-calibration.json')}"]
VARIANTS = ("earlier", "apply", "cores", "library")

_GRID = flags.DEFINE_multi_string("grid", _DEFAULT_GRIDS, "RESULTS_JSON,CALIBRATION_JSON: a saved validate_runtime.py "
                                  "grid and the calibrate_runtime.py output of its machine (repeat for several).")
_VARIANT = flags.DEFINE_multi_enum("variant", list(VARIANTS), list(VARIANTS), "Variants of the form to screen.")
_EXPONENT = flags.DEFINE_multi_float("exponent", [8.0, 4.0], "Smooth-maximum exponents k to screen (> 1; "
                                     "perf.times.RUNTIME_SHARPNESS).")


def load_grid(spec: str):
    """``(label, machine, measured lone-step cores, runs)`` of one ``RESULTS_JSON,CALIBRATION_JSON`` spec."""
    from jaxsprint.perf import presets
    from jaxsprint.calibration import host_fit as rc

    parts = spec.split(",")
    check(len(parts) == 2, "--grid", spec, "RESULTS_JSON,CALIBRATION_JSON")
    results, calibration = parts
    for path in parts:
        check(os.path.isfile(path), "--grid", path, "an existing JSON file")
    machine, _ = presets.load_preset(calibration)
    with open(calibration) as fh:
        cores = [float(c["cores"]) for c in json.load(fh).get("measurements", {}).get("step_cores", [])]
    with open(results) as fh:
        grid = json.load(fh).get("runs", [])
    runs = [rc.RuntimeRun(int(r["learners_per_host"]), int(r["hosts"]), int(r["sub_batch"]),
                          float(r["measured"]["network_time_s"]), float(r["measured"]["t_compute_s"]),
                          float(r["measured"]["t_update_s"]), float(r["measured"].get("t_compute_cv", 0.0)),
                          float(r["measured"].get("t_update_cv", 0.0)), str(r["name"])) for r in grid]
    check(len(runs) >= 3, "--grid", results, "a grid of at least 3 runs")
    folder = os.path.dirname(os.path.abspath(results))
    label = os.path.relpath(folder, os.path.join(_ROOT, "docs")) if folder.startswith(_ROOT) else folder
    measured = float(np.median(cores)) if cores else float(machine.learner_step_cores)
    return label, machine, measured, runs


def variant(name: str, machine, measured_step_cores: float):
    """``(fields, machine)`` of a variant (module docstring)."""
    import jax.numpy as jnp

    from jaxsprint.calibration import host_fit as rc

    earlier = ("learner_overhead_s", "updater_overhead_s", "updater_per_learner_s", "updater_cores",
               "updater_hosts_stretch", "updater_queue")
    if name == "library":
        return rc.RUNTIME_FIELDS, machine
    f32 = jnp.float32
    m = machine.replace(updater_apply_s=f32(0.0), learner_step_cores_half_batch=f32(0.0),
                        learner_step_cores=f32(measured_step_cores))
    fields = {"earlier": earlier, "apply": earlier + ("updater_apply_s",),
              "cores": earlier + ("updater_apply_s", "learner_step_cores")}[name]
    return fields, m


def loo_errors(machine, network, runs, fields) -> np.ndarray:
    """``[runs, 2]``: each run's epoch-time and mean-mini-batch errors, predicted from the other runs' fit."""
    from jaxsprint.calibration import host_fit as rc

    out = []
    for m, r in zip(rc.cross_validate(machine, network, runs, fields=fields), runs):
        t = rc.predict_runs(m, network, [r])
        e_c = float(t.t_compute_s[0]) / r.t_compute_s - 1.0
        e_u = float(t.t_update_s[0]) / r.t_update_s - 1.0
        out.append((e_c, (1.0 + e_u) / (1.0 + e_c) - 1.0))
    return np.asarray(out)


def main(argv):
    check(len(argv) == 1, "arguments", argv[1:], "none besides flags")
    for k in _EXPONENT.value:
        check(k > 1, "--exponent", k, "numbers > 1")
    import jax

    from experiments.configs import sprint
    from jaxsprint.perf import times
    from jaxsprint.calibration import compare

    grids = [load_grid(spec) for spec in _GRID.value]
    network = compare.network_cost(sprint.get_config())
    head = " | ".join(f"{g[0]}: epoch, mini-batch (p90)" for g in grids)
    print(f"| variant | k | {head} |\n|---|---|" + "---|" * len(grids), flush=True)
    for k in _EXPONENT.value:
        times.RUNTIME_SHARPNESS = float(k)
        jax.clear_caches()  # the form is traced with the exponent: retrace the fits' compiled functions
        for name in _VARIANT.value:
            cells = []
            for _, machine, measured, runs in grids:
                fields, m = variant(name, machine, measured)
                a = np.abs(loo_errors(m, network, runs, fields))
                med, p90 = np.median(a, axis=0), np.percentile(a, 90, axis=0)
                cells.append(f"{100 * med[0]:.1f}%, {100 * med[1]:.1f}% ({100 * p90[0]:.1f}%, {100 * p90[1]:.1f}%)")
            print(f"| {name} | {k:g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    cli.run(main)
