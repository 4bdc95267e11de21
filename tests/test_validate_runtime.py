"""experiments/validate_runtime.py: the --quick grid end to end (slow: real runs, two of them on two processes),
and bad config values (exit 2, one line, nothing written)."""
import csv
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "validate_runtime.py")


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.slow
def test_quick_grid_writes_the_tables_and_the_plot(tmp_path):
    out = tmp_path / "vr"
    r = _run(f"--out={out}", "--quick", timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert [run["name"] for run in data["runs"]] == ["quick_h1_l2", "quick_h2_l1"]
    assert data["failures"] == []
    for run in data["runs"]:
        assert run["measured"]["gradients"] > 0 and run["measured"]["num_hosts"] == run["hosts"]
        for source in ("timings", "specs"):
            assert set(run[f"errors_from_{source}"]) >= {"epoch_time_rel_error", "minibatch_tv", "staleness_tv"}
    for source in ("timings", "specs"):
        s = data["summary"][f"{source}.mean_staleness_rel_error"]
        assert s["n"] == 2 and 0 <= s["median"] <= s["p90"]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 and "timings_minibatch_tv" in rows[0]
    assert "| timings | median" in (out / "summary.md").read_text()
    assert (out / "errors.png").stat().st_size > 0
    written = json.loads((out / "config.json").read_text())  # the resolved config of the grid
    assert written["validation"]["grid"] == "validation" and written["sprint"]["sub_batch"] > 0


@pytest.mark.parametrize("args,message", [
    ([], "error: invalid --out=None"),
    (["--config.validation.only=nope"], "error: invalid config.validation.only='nope'"),
    (["--config.validation.min_gradients=0"], "error: invalid config.validation.min_gradients=0"),
    (["--config.validation.machine=nope"], "error: invalid config.validation.machine='nope'"),
    (["--config.validation.grid=all"], "error: invalid config.validation.grid='all'"),
    (["--config.validation.no_such=1"], "error: invalid config.validation.no_such='1'"),
    (["--min_gradients=0"], "error: invalid --min_gradients="),  # a setting of the config, not a flag
    (["--config.validation.repeat_of=/no/such/dir"], "error: invalid config.validation.repeat_of='/no/such/dir'"),
])
def test_bad_config_values_exit_2_with_one_line(tmp_path, args, message):
    out = tmp_path / "vr"
    r = _run(*([f"--out={out}"] if args else []), "--quick", *args)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not out.exists()


def test_reanalyse_rewrites_the_tables_from_saved_logs(tmp_path):
    from jaxsprint.runtime import events

    out = tmp_path / "vr"
    for i, (lph, tu, shift) in enumerate(((2, 0.5, 0.2), (4, 1.5, 0.0))):
        d = out / "runs" / f"fake{i}"
        d.mkdir(parents=True)
        events.save(str(d / "events.npz"), events.simulate_log(lph, 1.0, tu, 0.3, 0.5, duration_s=3000.0, warmup_s=5.0,
                                                               sub_batch=8, network_time_s=0.01, seed=i,
                                                               update_shift_s=shift))
    (out / "results.json").write_text(json.dumps({"runs": [], "failures": [], "overrides": [
        "--config.model=tiny", "--config.image_size=8"]}))
    r = _run(f"--out={out}", "--reanalyse")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert [run["name"] for run in data["runs"]] == ["fake0", "fake1"] and data["failures"] == []
    assert data["runs"][0]["predicted_from_timings"]["t_update_shift_s"] > 0.15
    for run in data["runs"]:
        e = run["errors_from_timings"]
        assert e["minibatch_tv"] < 0.1
        # The logs follow the model's protocol, so what remains is the finite run's sampling noise.
        assert 0 < e["minibatch_tv_floor"] and e["minibatch_tv"] < 2.5 * e["minibatch_tv_floor"] + 0.01
        assert run["errors_from_specs"] is not None
        c = run["count_coupling"]  # independent learners: the count follows the cycle, any window alike
        assert c["slope_ratio"] == pytest.approx(1.0, abs=0.2) and c["variance_ratio"] == pytest.approx(1.0, abs=0.2)
    assert "random windows" in (out / "summary.md").read_text()
    shift = data["specs_learner_cycle_shift"]  # the learner cycles from specs against the logs' (1.0 s)
    ratios = [run["predicted_from_specs"]["t_compute_s"] / run["measured"]["t_compute_s"] for run in data["runs"]]
    assert shift == pytest.approx(math.sqrt(ratios[0] * ratios[1]) - 1, rel=1e-6)
    assert f"From specs, the learner cycle over all runs: {100 * shift:+.1f}%" in (out / "summary.md").read_text()
    assert len(list(csv.DictReader((out / "results.csv").open()))) == 2
    assert (out / "errors.png").stat().st_size > 0
    assert data["overrides"] == ["--config.model=tiny", "--config.image_size=8"]
    # The same logs against themselves as an earlier draw: the repeat source, with nothing between them.
    again = tmp_path / "again"
    shutil.copytree(out, again)
    r = _run(f"--out={again}", "--reanalyse", f"--config.validation.repeat_of={out}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads((again / "results.json").read_text())
    for run in data["runs"]:
        e = run["errors_from_repeat"]
        assert e["epoch_time_rel_error"] == 0 and e["mean_minibatch_rel_error"] == 0 and e["minibatch_tv"] == 0
    assert data["summary"]["repeat.mean_staleness_rel_error"]["n"] == 2
    assert "| repeat | median" in (again / "summary.md").read_text()
    assert "repeat_epoch_time_rel_error" in next(csv.DictReader((again / "results.csv").open()))


def test_the_calibration_grid_is_planned_apart_from_the_validation_grid(tmp_path):
    """validation.grid=calibration plans 10 runs, 1 and 2 hosts, none of them a configuration of the validation
    grid (the preset fitted to them predicts the validation grid out of sample); validation.only names that
    grid's runs."""
    def plan(*args):
        r = _run(f"--out={tmp_path / 'vr'}", "--dry_run", *args)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("  ") and "hosts" in ln]
        # "  NAME hosts H x learners L, sub-batch B, network N ms: ..."
        return {(int(w[2]), int(w[5].rstrip(",")), int(w[7].rstrip(",")), int(w[9])) for w in rows}, rows

    validation, _ = plan()
    calibration, rows = plan("--config.validation.grid=calibration")
    assert len(validation) == 20 and len(calibration) == 10 and not validation & calibration
    assert {h for h, _, _, _ in calibration} == {1, 2} and all(w[0].startswith("cal_") for w in rows)
    r = _run(f"--out={tmp_path / 'vr'}", "--dry_run", "--config.validation.grid=calibration",
             "--config.validation.only=h1_l1_b8_n20")
    assert r.returncode == 2 and "names of the calibration grid" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "vr").exists()
