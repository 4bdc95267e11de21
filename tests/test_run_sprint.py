"""End-to-end tests of experiments/run_sprint.py: a real run of a tiny model, a saved log, bad flags."""
import json
import os
import subprocess
import sys

import pytest

from jaxsprint.runtime import events

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "run_sprint.py")
CONFIG = os.path.join(ROOT, "experiments", "configs", "sprint.py")
TINY = ["--config.model=tiny", "--config.image_size=8", "--config.sprint.sub_batch=8",
        "--config.sprint.network_time_s=0.005", "--config.sprint.checkpoint=False"]
COMMON = ("epoch_time_s", "mean_minibatch", "mean_staleness", "minibatch_pmf", "staleness_pmf")
MEASURED = COMMON + ("t_compute_s", "t_compute_cv", "t_update_s", "t_update_cv", "images_per_s", "gradients",
                     "updates")


def _run(args, timeout=600, devices=2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def _check_report(out, *, specs):
    for part in ("measured", "predicted_from_timings") + (("predicted_from_specs",) if specs else ()):
        for key in MEASURED if part == "measured" else COMMON:
            assert key in out[part], (part, key)
        for key, scale in (("minibatch_pmf", None), ("staleness_pmf", 1)):
            pmf = out[part][key]
            assert all(isinstance(k, str) and k.lstrip("-").isdigit() for k in pmf)
            assert sum(pmf.values()) == pytest.approx(1.0, abs=1e-6)
    assert "eval_accuracy" in out


@pytest.mark.slow
def test_a_real_run_prints_the_json_report_and_draws_the_plot(tmp_path):
    workdir, plot = tmp_path / "run", tmp_path / "pmfs.png"
    r = _run([f"--config={CONFIG}", f"--workdir={workdir}", *TINY, "--config.sprint.duration_s=3",
              "--config.sprint.warmup_s=0.5", "--json", f"--plot={plot}"])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    _check_report(out, specs=True)
    m = out["measured"]
    assert m["gradients"] > 0 and m["updates"] > 0
    assert 0.0 <= out["eval_accuracy"] <= 1.0
    assert plot.stat().st_size > 0
    stats = events.statistics(events.load(str(workdir / "events.npz")))  # the log on disk is consistent
    assert stats["gradients"] == m["gradients"]
    written = json.loads((workdir / "config.json").read_text())  # the resolved config, overrides applied
    assert written["sprint"]["duration_s"] == 3 and written["sprint"]["warmup_s"] == 0.5


def test_a_saved_log_is_analysed_without_running(tmp_path):
    path = str(tmp_path / "events.npz")
    events.save(path, events.simulate_log(2, 0.01, 0.02, 0.3, 0.2, duration_s=5.0, warmup_s=0.5, sub_batch=8,
                                          dataset_size=1500))
    r = _run([f"--events={path}", "--json"], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    _check_report(out, specs=False)
    assert out["predicted_from_specs"] is None and out["eval_accuracy"] is None


@pytest.mark.parametrize("args,message", [
    ([f"--config={CONFIG}", "--config.sprint.sub_batch=0"], "error: invalid config.sprint.sub_batch=0"),
    ([f"--config={CONFIG}", "--config.sprint.duration_s=-1"], "error: invalid config.sprint.duration_s=-1"),
    ([f"--config={CONFIG}", "--config.optimizer.name=adamw"], "error: invalid config.optimizer.name="),
    ([f"--config={CONFIG}", "--config.sprint.updater_device=own"], "error: invalid config.sprint.devices="),
    ([f"--config={CONFIG}", "--plot=out.txt"], "error: invalid --plot="),
    ([f"--config={CONFIG}", "--machine=nope"], "error: invalid machine="),
    ([f"--config={CONFIG}", "--no_such_flag"], "error:"),
    (["--config.sprint.sub_batch=8"], "error:"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, args, message):
    workdir = tmp_path / "run"
    r = _run([f"--workdir={workdir}", *args], timeout=300)
    assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not workdir.exists()


def test_a_missing_workdir_is_refused():
    r = _run([f"--config={CONFIG}"], timeout=300)
    assert r.returncode == 2 and "error: invalid --workdir=None" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_series_runs_its_configurations_in_a_row_in_the_same_processes(tmp_path):
    """Two hosts (jax.distributed on 127.0.0.1), two configurations in one series: one report each, in order,
    each with its own sub-batch and network time, and each run's log in its own workdir."""
    sys.path.insert(0, ROOT)
    from experiments import runtime_runs
    from jaxsprint.calibration.grids import Entry

    entries = [Entry("a", 2, 1, 8, 5, "own"), Entry("b", 2, 1, 16, 0, "own")]
    with pytest.raises(ValueError, match="one process layout"):
        runtime_runs.run_series([entries[0], Entry("c", 2, 2, 8, 5, "own")], [2.0, 2.0], str(tmp_path / "no"),
                                config_file=CONFIG, overrides=[], machine_args=[], warmup_s=0.5, timeout_s=60)
    assert not (tmp_path / "no").exists()
    out = runtime_runs.run_series(entries, [2.5, 3.0], str(tmp_path / "s"), config_file=CONFIG,
                                  overrides=["--config.model=tiny", "--config.image_size=8"], machine_args=[],
                                  warmup_s=0.5, timeout_s=300, specs=False)
    assert [o["series_index"] for o in out] == [0, 1]
    for o, e, run in zip(out, entries, ("run0", "run1")):
        m = o["measured"]
        assert m["gradients"] > 0 and m["updates"] > 0 and m["num_hosts"] == 2
        config = json.loads((tmp_path / "s" / run / "config.json").read_text())
        assert config["sprint"]["sub_batch"] == e.sub_batch
        assert config["sprint"]["network_time_s"] == pytest.approx(e.network_ms / 1e3)
        log = events.statistics(events.load(str(tmp_path / "s" / run / "events.npz")))
        assert log["gradients"] == m["gradients"] and log["sub_batch"] == e.sub_batch
        assert log["network_time_s"] == pytest.approx(e.network_ms / 1e3)  # what the updater slept, as logged
    assert out[0]["measured"]["t_update_s"] > 0.005  # every cycle of the first run sleeps its 5 ms
