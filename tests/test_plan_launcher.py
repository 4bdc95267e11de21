"""End-to-end tests of experiments/plan.py: bad input exits 2 with one line before anything is written; a tiny
plan runs (slow)."""
import json
import os
import subprocess
import sys

import pytest
from launcher_util import launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "experiments", "configs", "plan.py")
BASE = [f"--config={CONFIG}", "--config.machine=tsubame_kfc_dl", "--config.network=resnet8",
        "--config.max_nodes=16", "--config.max_sub_batch=32"]


def _run(args, cache, timeout=600):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "experiments/plan.py", *BASE, f"--config.cache_dir={cache}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


_T = "--config.target_accuracy=0.9"
BAD = [
    (["--config.target_accuracy=0"], "config.target_accuracy"),
    (["--config.target_accuracy=1.2"], "config.target_accuracy"),
    (["--config.target_accuracy=nan"], "config.target_accuracy"),
    ([], "config.target_accuracy"),
    ([_T, "--config.data=no_such_data"], "config.data"),
    ([_T, "--config.model=resnet999"], "config.model"),
    ([_T, "--config.staleness_limits=0.5"], "config.staleness_limits"),
    ([_T, "--config.staleness_limits=2,x"], "config.staleness_limits"),
    ([_T, "--config.minibatch_range=64,8"], "config.minibatch_range"),
    ([_T, "--config.minibatch_range=8,16,32"], "config.minibatch_range"),
    ([_T, "--config.budget_runs=0"], "config.budget_runs"),
    ([_T, "--config.lr_rule=cosine"], "config.lr_rule"),
    ([_T, "--config.seeds=0"], "config.seeds"),
    ([_T, "--config.momentum=1.0"], "config.momentum"),
    ([_T, "--config.tolerance=0"], "config.tolerance"),
    ([_T, "--config.machine=no_such_machine"], "config.machine"),
    ([_T, "--config.network=nope"], "config.network"),
    ([_T, "--config.no_such_field=1"], "config.no_such_field"),
    ([_T, "--config.seeds=two"], "config.seeds"),
    ([_T, "--workdir=afile"], "--workdir"),
    ([_T, "--config.runtime_configs=4:16:0.01", "--workdir=w"], "config.runtime_configs"),
    ([_T, "--config.runtime_configs=4:16:0.01,2:8:0"], "--workdir"),
]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    """Every case in one child process (tests/bad_input_driver.py: absl flags reset between cases, as
    jaxsprint.cli.run would run each), in a scratch directory that must not change."""
    cache = tmp_path / "cache"
    work = tmp_path / "work"
    work.mkdir()
    (work / "afile").write_text("a file, not a directory")
    cases = [{"id": str(i), "argv": [*BASE, f"--config.cache_dir={cache}", *args]} for i, (args, _) in enumerate(BAD)]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "bad_input_driver.py"),
                        os.path.join(ROOT, "experiments", "plan.py"), str(tmp_path / "cases.json"),
                        str(tmp_path / "out.json")], capture_output=True, text=True, cwd=work, timeout=300,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    for (args, field), res in zip(BAD, json.loads((tmp_path / "out.json").read_text())):
        assert res["code"] == 2, (args, res["stderr"])
        lines = res["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: invalid") and field in lines[0], (args, res["stderr"])
        assert res["changed"] == [], (args, res["changed"])
    assert not cache.exists()


@pytest.mark.slow
def test_a_tiny_plan_then_the_same_plan_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    c = "--config."
    args = [c + "target_accuracy=0.8", c + "minibatch_range=16,64", c + "ladder=2", c + "staleness_limits=inf",
            c + "budget_runs=2", c + "initial_runs=2", c + "seeds=1", c + "max_updates=100", c + "eval_every=25",
            c + "search_starts=2", "--json", f"--plot={tmp_path / 'plan.png'}"]
    r = _run(args + [f"--workdir={tmp_path / 'work'}"], cache)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    # The run keeps its resolved config and its report beside each other.
    written = json.loads((tmp_path / "work" / "config.json").read_text())
    assert written["target_accuracy"] == 0.8 and written["seeds"] == 1 and written["max_updates"] == 100
    assert written["minibatch_range"] == [16, 64] and written["machine"] == "tsubame_kfc_dl"
    assert written["staleness_limits"] == [float("inf")]  # "inf" as given, read as a number
    assert json.loads((tmp_path / "work" / "plan.json").read_text())["runs"] == out["runs"]
    assert out["runs"]["trained"] == out["runs"]["used"] >= 1
    if out["reached"]:
        assert out["chosen"]["predicted_time_to_accuracy_s"] > 0
        assert (tmp_path / "plan.png").exists()
    else:
        assert 0.0 <= out["best_reached"]["accuracy"] < 0.8
    again = json.loads(_run(args, cache).stdout)
    assert again["runs"]["trained"] == 0 and again["runs"]["cached"] == out["runs"]["used"]
    unreachable = _run([a if not a.startswith(c + "target_accuracy") else c + "target_accuracy=1.0" for a in args],
                       cache)
    assert unreachable.returncode == 0, unreachable.stderr[-3000:]
    u = json.loads(unreachable.stdout)
    assert u["runs"]["trained"] == 0  # the same runs, read back: the target is not part of a run's key
    if not u["reached"]:
        assert u["best_reached"]["accuracy"] < 1.0


@pytest.mark.slow
def test_the_runtime_comparison_with_two_seeds_then_rejudged_from_its_runs(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    c = "--config."
    args = [sys.executable, "experiments/plan.py", c + "target_accuracy=0.3", c + "runtime_configs=1:8:0.01,2:16:0",
            c + "runtime_updates=120", c + "runtime_seeds=2", c + "eval_every=10", c + "max_updates=120",
            c + "seeds=2", c + "base_lr=0.1", c + "momentum=0.5", f"--workdir={tmp_path / 'w'}",
            f"{c}cache_dir={tmp_path / 'cache'}", "--json"]
    r = subprocess.run(args + [f"--plot={tmp_path / 'rt.png'}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert json.loads((tmp_path / "w" / "runtime_comparison.json").read_text())["rows"] == out["rows"]
    assert sorted(os.listdir(tmp_path / "w")) == ["config.json", "n1_b8_t0.01", "n1_b8_t0.01_s1", "n2_b16_t0",
                                                   "n2_b16_t0_s1", "runtime_comparison.json"]
    for row in out["rows"]:
        seeds = row["per_seed"]
        assert len(seeds) == 2 and seeds[0]["mean_staleness"] != seeds[1]["mean_staleness"]  # two real runs
        assert row["mean_staleness"] == pytest.approx((seeds[0]["mean_staleness"] + seeds[1]["mean_staleness"]) / 2)
    chosen = out["rows"][out["choice"]]
    assert not chosen.get("extrapolated", True) or all(r.get("extrapolated", True) for r in out["rows"])
    assert (tmp_path / "rt.png").exists()  # drawn whether or not a run reached the target
    again = subprocess.run(args + [c + "runtime_reuse=True"], cwd=ROOT, capture_output=True, text=True,
                           timeout=600, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    # The same runs and emulated cells, read back (the cache keeps the cells' accuracies to float32).
    for row, before in zip(json.loads(again.stdout)["rows"], out["rows"]):
        assert row["per_seed"] == before["per_seed"] and row["mean_staleness"] == before["mean_staleness"]
        assert row.keys() == before.keys()
        for k, v in before.items():  # the law's fits start from the float32-rounded cells: to 1%
            rel = 1e-2 if k.startswith(("predicted", "relative")) else 1e-4
            assert row[k] == (pytest.approx(v, rel=rel) if isinstance(v, float) else v), k
    table = subprocess.run([a for a in args if a != "--json"] + [c + "runtime_reuse=True"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, env=env)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "median |error|" in table.stdout and "1:8:0.01" in table.stdout and "2:16:0" in table.stdout


@pytest.mark.parametrize("reached", [(None, None), (3.0, None), (None, 2.0)])
def test_the_runtime_plot_is_drawn_when_no_run_has_both_times(tmp_path, reached):
    """A short comparison may leave no configuration with both a measured and a predicted time to the target."""
    plan = launcher("plan")

    row = {"learners": 1, "sub_batch": 8, "network_time_s": 0.0, "mean_staleness": 1.5, "updates_to_target": None,
           "emulated_updates": None, "per_seed": [{"updates_to_target": None}], "time_to_accuracy_s": reached[0]}
    if reached[1]:
        row.update(predicted_updates=40.0, predicted_time_to_accuracy_s=reached[1])
    plan.plot_runtime(str(tmp_path / "rt.png"), {"rows": [row, dict(row, learners=2)], "choice": 0,
                                                "measured_fastest": 0}, 0.3)
    assert (tmp_path / "rt.png").stat().st_size > 0
