"""scripts/gpu_check.sh on the CPU (GPU_CHECK_ALLOW_CPU=1) at tiny sizes: every part runs, a failed part is
recorded with its exit status and log while the later parts still run, and the JSON is standard JSON; the parts
that judge the SPRINT model (model, polish, sprint) record finite figures; a spent budget skips what is left."""
import json
import math
import os
import subprocess
import sys
import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")


def _finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _run(tmp_path, **settings):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, GPU_CHECK_ALLOW_CPU="1",
               GPU_CHECK_SITE=str(tmp_path / "site"), TMPDIR=str(tmp_path), **settings)
    env.pop("JAX_PLATFORMS", None)
    r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=1200, env=env, cwd=tmp_path)
    text = (tmp_path / "gpu_check.json").read_text()
    out = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # no NaN/Infinity
    return r, out


@pytest.mark.slow  # an end-to-end run of the script: CI's second step (scripts/test.sh -m slow)
def test_cpu_run_records_every_part_and_survives_a_failed_one(tmp_path):
    r, out = _run(tmp_path, GPU_CHECK_DEMO_STEPS="0",  # a part that fails: recorded, and the next part still runs
                  GPU_CHECK_SPRINT_ARGS="--learners=1,2,4 --duration_s=2 --warmup_s=0.5 --sync_steps=2",
                  GPU_CHECK_TESTS="tests/test_models.py -k bfloat16", GPU_CHECK_TEST_WORKERS="1")
    assert r.returncode == 1, r.stderr[-3000:]  # not all parts ok
    assert out["mode"] == "cpu" and out["ok"] is False and out["elapsed_s"] > 0
    parts = out["parts"]
    assert list(parts) == ["environment", "install", "bench", "model", "polish", "sprint", "demo", "tests"]
    for name in ("environment", "install", "bench", "model", "polish", "sprint", "tests"):
        assert parts[name]["status"] == "ok", (name, parts[name].get("log_tail"))
        assert parts[name]["seconds"] >= 0 and parts[name]["limit_s"] > 0
    assert parts["environment"]["figures"]["backend"] == "cpu"
    install = parts["install"]["figures"]
    assert install["wheels_found"] == len(install["installed"]) + len(install["image_has"])
    assert parts["demo"]["status"] == "failed" and parts["demo"]["rc"] == 2
    assert "invalid config.num_train_steps=0" in parts["demo"]["log_tail"]
    tests = parts["tests"]["figures"]
    assert tests["passed"] >= 1 and tests["failed"] == tests["errors"] == 0
    assert sorted(os.listdir(tmp_path / "gpu_check_logs")) == [f"{n}.log" for n in sorted(parts)]

    bench = parts["bench"]["figures"]
    assert (bench["model"], bench["image_size"], bench["num_classes"]) == ("resnet20", 32, 10)
    # The specs model for what the bench ran (ResNet-20's zoo table, the cpu preset), beside the measured step.
    model = parts["model"]["figures"]
    assert (model["network"], model["machine"], model["batch"]) == ("resnet20", "cpu", bench["batch"])
    for key in ("predicted_step_s", "predicted_compute_s", "measured_step_s", "model_flops_per_step"):
        assert _finite(model[key]) and model[key] > 0, key
    assert model["measured_step_s"] == bench["step_s"]
    assert model["predicted_compute_s"] > model["predicted_step_s"]  # T_c adds the input and the copies
    assert math.isclose(model["relative_error"], model["predicted_step_s"] / model["measured_step_s"] - 1)
    assert model["predicted_step_s_at_preset_peak"] == model["predicted_step_s"]  # --peak=preset on the CPU
    # The polishing pass over the demo's model.
    polish = parts["polish"]["figures"]
    assert polish["model"] == "resnet20" and polish["polish_passes"] >= 1
    for key in ("train_step_s", "moments_s", "polish_s", "polish_compile_s", "epoch_s", "polish_over_epoch"):
        assert _finite(polish[key]) and polish[key] > 0, key
    # The runtime with 1, 2 and 4 learner threads on one device, against the synchronous step.
    sprint = parts["sprint"]["figures"]
    assert sprint["devices"] == 1 and sprint["synchronous"]["rc"] == 0
    assert sprint["synchronous"]["batch"] == sprint["sub_batch"] and sprint["synchronous"]["channels"] == 1
    assert _finite(sprint["synchronous"]["images_per_s"]) and sprint["synchronous"]["images_per_s"] > 0
    assert [run["learners"] for run in sprint["runs"]] == [1, 2, 4]
    for run in sprint["runs"]:
        assert run["rc"] == 0, run.get("error")
        assert run["measured"]["learners"] == run["learners"] and run["measured"]["gradients"] > 0
        for key in ("images_per_s", "epoch_time_s", "mean_staleness"):
            assert _finite(run["measured"][key]), key
            assert _finite(run["predicted_from_timings"][key]), key
        for key in ("epoch_time_rel_error", "mean_minibatch_rel_error", "mean_staleness_rel_error"):
            assert _finite(run["errors_from_timings"][key]), key
        assert math.isclose(run["images_per_s_over_sync"],
                            run["measured"]["images_per_s"] / sprint["synchronous"]["images_per_s"])


def test_a_spent_budget_skips_the_remaining_parts(tmp_path):  # a few seconds: only the first two parts run
    r, out = _run(tmp_path, GPU_CHECK_BUDGET_S="1")
    assert r.returncode == 1, r.stderr[-3000:]
    parts = out["parts"]
    assert parts["environment"]["status"] == "ok"  # the first two parts have fixed limits
    for name in ("bench", "model", "polish", "sprint", "demo", "tests"):
        assert parts[name]["status"] == "skipped" and parts[name]["limit_s"] == 0, name
        assert "no time left" in parts[name]["log_tail"]
    assert not list(tmp_path.glob("gpu_check.??????"))  # the scratch directory (mktemp gpu_check.XXXXXX) is gone
