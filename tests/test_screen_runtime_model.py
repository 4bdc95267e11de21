"""experiments/screen_runtime_model.py: its variants of the runtime form, and the launcher on real files (a grid
made by the shipped form itself, so that the library's form predicts it exactly and the earlier one does not)."""
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from experiments import screen_runtime_model as srm
from jaxsprint.perf import machines as mc, presets
from jaxsprint.calibration import host_fit as rc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALIBRATION = os.path.join(ROOT, "docs", "runtime-calibration.json")


def test_variants_switch_the_new_terms_off_and_fit_what_they_name():
    m = mc.with_figures(mc.get("cpu_runtime"), updater_apply_s=2e-3, learner_step_cores_half_batch=20.0,
                        learner_step_cores=1.4)
    fields, same = srm.variant("library", m, 1.1)
    assert fields == rc.RUNTIME_FIELDS and same is m
    fields, earlier = srm.variant("earlier", m, 1.1)
    assert "updater_apply_s" not in fields and "learner_step_cores" not in fields and len(fields) == 6
    assert float(earlier.updater_apply_s) == 0.0 and float(earlier.learner_step_cores_half_batch) == 0.0
    assert float(earlier.learner_step_cores) == pytest.approx(1.1)  # the measured lone step's cores
    fields, cores = srm.variant("cores", m, 1.1)
    assert fields[-2:] == ("updater_apply_s", "learner_step_cores")
    assert float(cores.learner_step_cores_half_batch) == 0.0


def _grid(tmp_path):
    """Six runs whose cycle means are the shipped form's own prediction with the calibration's machine."""
    machine, _ = presets.load_preset(CALIBRATION)
    from experiments.configs import sprint
    from jaxsprint.calibration import compare
    net = compare.network_cost(sprint.get_config())
    configs = [(1, 1, 8, 0.02), (4, 1, 32, 0.0), (8, 1, 16, 0.05), (2, 2, 64, 0.0), (4, 2, 16, 0.02),
               (2, 1, 128, 0.01)]
    t = rc.predict_runs(machine, net, [rc.RuntimeRun(*c, 1.0, 1.0) for c in configs])
    runs = [dict(name=f"h{h}_l{n}_b{b}", learners_per_host=n, hosts=h, sub_batch=b,
                 measured=dict(network_time_s=nt, t_compute_s=float(tc), t_update_s=float(tu)))
            for (n, h, b, nt), tc, tu in zip(configs, t.t_compute_s, t.t_update_s)]
    path = tmp_path / "grid" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"runs": runs}))
    return path


def _launch(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "screen_runtime_model.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_launcher_screens_the_variants_and_rejects_bad_input(tmp_path):
    grid = f"{_grid(tmp_path)},{CALIBRATION}"
    out = _launch(f"--grid={grid}", "--variant=library", "--variant=earlier", "--exponent=4")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split(" | ")[0][2:]: line for line in out.stdout.splitlines() if line.startswith("| ") and
            " | 4 | " in line}
    assert set(rows) == {"library", "earlier"}

    def medians(row):
        cell = row.split(" | ")[2]
        return [float(v) for v in cell.split(" (")[0].replace("%", "").split(", ")]

    assert max(medians(rows["library"])) < 0.5  # the data's own form: exact up to the fit's tolerance
    assert max(medians(rows["earlier"])) > 0.5  # without the terms that made the data, it misses
    for bad, name in (([f"--grid={tmp_path / 'missing.json'},{CALIBRATION}"], "--grid"),
                      ([f"--grid={grid}", "--exponent=1"], "--exponent"),
                      ([f"--grid={grid}", "--variant=nope"], "variant")):
        r = _launch(*bad)
        assert r.returncode == 2 and name in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
