"""experiments/study_noise.py end to end at a tiny size: every cell to the target, the measured noise scale, the
law from it, a rerun that trains nothing."""
import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a script: CI's second step (scripts/test.sh -m slow)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "study_noise.py")
CONFIG = os.path.join(ROOT, "experiments", "configs", "noise_study.py")
TINY = ["--config.dataset=digits", "--config.image_size=8", "--config.model=tiny", "--config.eval_batch_size=64",
        "--config.study.batch_sizes=16,32,64", "--config.study.reference_batch=32", "--config.study.seeds=0,1",
        "--config.stop_at_accuracy=0.6", "--config.lr.base=0.05"]


def _run(out):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, LAUNCHER, f"--config={CONFIG}", f"--out={out}", *TINY],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)


def test_tiny_study_measures_the_noise_scale_and_predicts_the_steps(tmp_path):
    r = _run(tmp_path / "study")
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((tmp_path / "study.json").read_text())
    assert sorted(results) == ["b16_s0", "b16_s1", "b32_s0", "b32_s1", "b64_s0", "b64_s1"]
    assert all(x["reached"] for x in results.values())
    assert "noise_scale" not in results["b16_s0"]  # one device: nothing to measure
    a = json.loads((tmp_path / "study.analysis.json").read_text())
    ref = [w["windows"][-1]["b_simple"] for k, w in
           ((k, results[k]["noise_scale"]) for k in ("b32_s0", "b32_s1"))]
    assert a["b_noise_measured"] == pytest.approx(sum(ref) / 2)
    # The measurement enters as a prior as wide as its error: the fit stays within two of them.
    rel_se = a["b_noise_measured_se"] / a["b_noise_measured"]
    assert abs(math.log(a["law_measured"]["b_noise"] / a["b_noise_measured"])) <= 2 * max(rel_se, 0.01)
    assert 0 <= a["median_abs_error_measured"] < 1 and 0 <= a["median_abs_error_measured_loo"] < 1
    assert "from measured B_noise" in (tmp_path / "study.md").read_text()
    again = _run(tmp_path / "study")  # every cell is in the results: none runs again
    assert again.returncode == 0 and "reached at step" not in again.stdout
