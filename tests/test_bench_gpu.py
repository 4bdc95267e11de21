"""scripts/bench_gpu.py on the CPU at a tiny size: the JSON's fields and their consistency, never the speed."""
import json
import math
import os
import subprocess
import sys
import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a script: CI's second step (scripts/test.sh -m slow)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench_gpu.py")


def _run(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600, env=env,
                          cwd=ROOT)


def test_tiny_run_writes_consistent_positive_figures(tmp_path):
    path = tmp_path / "bench.json"
    r = _run("--model=tiny", "--batch=8", "--image_size=8", "--num_classes=10", "--warmup=1", "--steps=2",
             "--rounds=2", "--peak_flops=1e11", f"--json={path}")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(path.read_text())
    assert (out["model"], out["batch"], out["image_size"], out["dtype"]) == ("tiny", 8, 8, "bfloat16")
    assert out["platform"] == "cpu" and out["device_kind"] and out["jax_version"]
    assert out["timed_steps"] == 4 and len(out["round_step_s"]) == 2
    for key in ("compile_s", "step_s", "images_per_s", "flops_per_step", "achieved_flops_per_s", "mfu"):
        assert isinstance(out[key], float) and out[key] > 0 and math.isfinite(out[key]), key
    assert min(out["round_step_s"]) <= out["step_s"] <= max(out["round_step_s"])  # their median
    assert math.isclose(out["images_per_s"], out["batch"] / out["step_s"])
    assert math.isclose(out["flops_per_image"], out["flops_per_step"] / out["batch"])
    assert math.isclose(out["mfu"], out["flops_per_step"] / out["step_s"] / out["peak_flops_per_s"])
    assert out["peak_flops_per_s"] == 1e11
    assert math.isfinite(out["first_loss"]) and math.isfinite(out["last_loss"])
    assert "model" in r.stdout and "MFU" in r.stdout  # the printed table


def test_flops_scale_with_the_batch(tmp_path):
    figures = []
    for batch in (4, 8):
        path = tmp_path / f"b{batch}.json"
        r = _run("--model=tiny", f"--batch={batch}", "--image_size=8", "--num_classes=10", "--warmup=0",
                 "--steps=1", "--rounds=1", f"--json={path}")
        assert r.returncode == 0, r.stderr[-3000:]
        figures.append(json.loads(path.read_text())["flops_per_step"])
    assert 1.8 < figures[1] / figures[0] < 2.2  # XLA's count is per example, up to the batch-free optimizer step


def test_bad_flag_exits_2_without_traceback():
    r = _run("--batch=0")
    assert r.returncode == 2 and "invalid --batch=0" in r.stderr and "Traceback" not in r.stderr
    r = _run("--model=resnet7")
    assert r.returncode == 2 and "invalid --model='resnet7'" in r.stderr
