"""scripts/gpu_check.sh on the CPU (GPU_CHECK_ALLOW_CPU=1) at tiny sizes: every part runs, a failed part is
recorded with its exit status and log while the later parts still run, and the JSON is standard JSON."""
import json
import os
import subprocess
import sys
import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a script: CI's second step (scripts/test.sh -m slow)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")


def test_cpu_run_records_every_part_and_survives_a_failed_one(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, GPU_CHECK_ALLOW_CPU="1",
               GPU_CHECK_SITE=str(tmp_path / "site"), GPU_CHECK_DEMO_STEPS="1",
               GPU_CHECK_BENCH_ARGS="--batch=0",  # a part that fails: recorded, and the next parts still run
               GPU_CHECK_TESTS="tests/test_models.py -k bfloat16", GPU_CHECK_TEST_WORKERS="1")
    env.pop("JAX_PLATFORMS", None)
    r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]  # not all parts ok
    text = (tmp_path / "gpu_check.json").read_text()
    out = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # no NaN/Infinity
    assert out["mode"] == "cpu" and out["ok"] is False and out["elapsed_s"] > 0
    parts = out["parts"]
    assert list(parts) == ["environment", "install", "bench", "demo", "tests"]
    for name in ("environment", "install", "demo", "tests"):
        assert parts[name]["status"] == "ok", (name, parts[name].get("log_tail"))
        assert parts[name]["seconds"] >= 0 and parts[name]["limit_s"] > 0
    assert parts["environment"]["figures"]["backend"] == "cpu"
    install = parts["install"]["figures"]
    assert install["wheels_found"] == len(install["installed"]) + len(install["image_has"])
    assert parts["bench"]["status"] == "failed" and parts["bench"]["rc"] == 2
    assert "invalid --batch=0" in parts["bench"]["log_tail"]
    demo = parts["demo"]["figures"]
    assert demo["steps"] == 1 and 0.0 <= demo["eval_accuracy"] <= 1.0
    tests = parts["tests"]["figures"]
    assert tests["passed"] >= 1 and tests["failed"] == tests["errors"] == 0
    assert sorted(os.listdir(tmp_path / "gpu_check_logs")) == [f"{n}.log" for n in sorted(parts)]
