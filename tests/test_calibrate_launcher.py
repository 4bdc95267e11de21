"""experiments/calibrate.py refitting saved measurements (no timing here): outputs, held-out protocols, bad input."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxsprint.calibration import model_fit
from jaxsprint.perf import machines, presets, zoo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "calibrate.py")


def _measurements(path, scale=1.3):
    """Steps made by the cpu preset's model with its efficiencies divided by `scale` (so a fit must move them)."""
    truth = machines.get("cpu")
    truth = truth.replace(efficiency_fwd=truth.efficiency_fwd / scale, efficiency_bwd_data=truth.efficiency_bwd_data
                          / scale, efficiency_bwd_weight=truth.efficiency_bwd_weight / scale)
    tables = {"resnet8": zoo.resnet_cifar(1), "resnet20": zoo.resnet_cifar(3)}
    configs = [(m, b) for m in tables for b in (4, 8, 16, 32)]
    timings = [model_fit.StepTiming(tables[m], b, 1.0, 5.0) for m, b in configs]
    pred, _ = model_fit.predict_timings(truth, timings)
    steps = [dict(model=m, batch=b, measured_s=float(t), samples=[float(t)] * 3) for (m, b), t in zip(configs, pred)]
    with open(path, "w") as fh:
        json.dump({"measurements": {"steps": steps, "allreduces": []}}, fh)


def _run(*args, env=None):
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(os.environ, **(env or {})))


def test_refit_reports_both_held_out_protocols_and_saves_the_preset(tmp_path):
    meas, out = tmp_path / "m.json", tmp_path / "preset.json"
    _measurements(meas)
    r = _run(f"--config.measurements={meas}", f"--out={out}",
             "--config.fit_fields=efficiency_fwd,efficiency_bwd_weight", "--config.holdout_batches=8")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "steps held_out: n=2" in r.stdout and "steps leave-one-model-out: n=8" in r.stdout
    saved = json.loads(out.read_text())
    summary = saved["calibration"]
    # Data made by the model itself: both protocols predict it (nearly) exactly.
    assert summary["steps_held_out"]["median_abs_error"] < 0.01
    assert summary["steps_leave_one_model_out"]["median_abs_error"] < 0.01
    fitted = summary["compute_fit"]["fitted"]
    np.testing.assert_allclose(fitted["efficiency_fwd"], machines.get("cpu").efficiency_fwd / 1.3, rtol=0.02)
    machine, saved = presets.load_preset(str(out))
    assert machine.name == "this_machine"
    sources = dict(machine.sources)
    assert sources["efficiency_fwd"].startswith(f"fitted by `{saved['command']}` on {meas} (relative standard error")
    assert saved["command"].startswith("python experiments/calibrate.py --config.measurements=")
    assert saved["fitted"] == ["efficiency_bwd_data", "efficiency_bwd_weight", "efficiency_fwd"]  # one tied
    assert saved["fixed"] == {} and 0 < saved["rel_std_error"]["efficiency_fwd"] < 0.01
    assert sources["peak_flops_per_s"] == dict(machines.get("cpu").sources)["peak_flops_per_s"]
    # The preset keeps the resolved config that made it: the file's values with the overrides applied.
    assert saved["config"]["holdout_batches"] == [8] and saved["config"]["base"] == "cpu"
    assert saved["config"]["fit_fields"] == ["efficiency_fwd", "efficiency_bwd_weight"]  # the text, resolved


def test_refit_of_the_small_cnn_set_with_a_random_held_out_share(tmp_path):
    # Twelve records of the cpu preset's calibration set, a third held out at random, a robust loss and bounds.
    data = json.load(open(os.path.join(ROOT, "docs", "perf-calibration.json")))
    meas, out = tmp_path / "small.json", tmp_path / "preset.json"
    meas.write_text(json.dumps({"records": data["records"][:12]}))
    c = "--config."
    r = _run(f"{c}measurements={meas}", f"--out={out}", c + "holdout_batches=", c + "holdout_fraction=0.34",
             c + "holdout_seed=1", c + "fit_fields=efficiency_fwd,norm_memory_efficiency", c + "loss=soft_l1",
             c + "bounds=efficiency_fwd=0.01:1", c + "starts=2", c + "fixed=maxpool_backward_memory_efficiency",
             "--config.name=cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    saved = json.loads(out.read_text())
    summary = saved["calibration"]
    # A refit of the cpu preset itself (its name and description), one figure held at its FIXED value.
    assert saved["name"] == "cpu" and saved["description"] == machines.get("cpu").description
    assert saved["fixed"] == {"maxpool_backward_memory_efficiency": 1.0}
    assert saved["figures"]["maxpool_backward_memory_efficiency"] == 1.0
    assert saved["sources"]["maxpool_backward_memory_efficiency"].startswith("fixed at 1")
    assert set(saved["rel_std_error"]) == {"efficiency_fwd", "efficiency_bwd_data", "norm_memory_efficiency"}
    assert summary["steps_fit"]["n"] == 8 and summary["steps_held_out"]["n"] == 4
    assert 0.01 <= summary["compute_fit"]["fitted"]["efficiency_fwd"] <= 1.0
    assert "steps_leave_one_model_out" not in summary  # one family: nothing to leave out


# Slow (11 launches, 33 s): test_bad_inputs.py's calibrate.py cases cover the same flags in the main suite.
@pytest.mark.slow
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path):
    meas, out = tmp_path / "m.json", tmp_path / "preset.json"
    _measurements(meas)
    for args, env, words in (
            (["--config.starts=0"], None, "invalid config.starts=0: an integer >= 1"),
            (["--config.fit_fields=efficiency_fwd,network_latency_s"], None,
             "invalid config.fit_fields='network_latency_s': compute figures"),
            (["--config.bounds=efficiency_fwd=0.5"], None,
             "invalid config.bounds='efficiency_fwd=0.5': entries name=lo:hi"),
            (["--config.bounds=speed=1:2"], None,
             "invalid config.bounds='speed=1:2': entries name=lo:hi naming machine figures"),
            (["--config.bounds=efficiency_fwd=0.5:0.1"], None,
             "invalid config.bounds='efficiency_fwd=0.5:0.1': entries name=lo:hi with numbers 0 < lo < hi"),
            (["--config.holdout_fraction=1"], None, "invalid config.holdout_fraction=1.0: a number >= 0 and < 1"),
            (["--config.fixed=per_layer_overhead_s"], None,
             "invalid config.fixed='per_layer_overhead_s': figures of FIXED"),
            (["--config.fixed=efficiency_fwd"], None,
             "invalid config.fixed='efficiency_fwd': figures not also in config.fit_fields"),
            (["--config.batches=4,x"], None, "invalid config.batches='x': integers >= 1"),
            (["extra"], None, "invalid arguments=['extra']: none besides --flags"),
            ([], {"JAXSPRINT_CPU_KERNELS": "fast"},
             "invalid JAXSPRINT_CPU_KERNELS='fast': allowed: auto, off, require"),
            (["--config.cpu_kernels=fast"], None, "cpu_kernels"),
            (["--config.measurements=" + str(tmp_path / "missing.json")], None,
             f"invalid config.measurements={str(tmp_path / 'missing.json')!r}: an existing measurement file")):
        r = _run(f"--config.measurements={meas}", f"--out={out}", *args, env=env)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert words in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not out.exists()
