"""experiments/calibrate_runtime.py: calibration.fit_only on stored measurements (a synthetic set) writes the
preset (the fit, every figure of the machine and its host, their sources and standard errors); bad config values
exit 2 before anything is measured."""
import json
import os
import re
import subprocess
import sys

import pytest
from launcher_util import launcher

pytestmark = pytest.mark.slow  # subprocesses that start JAX and build the network's cost table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "calibrate_runtime.py")


def _run(*args):
    return subprocess.run([sys.executable, LAUNCHER, "--config.model=tiny", *args], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"), cwd=ROOT)


def test_fit_only_refits_stored_measurements(tmp_path):
    runs = [dict(learners_per_host=n, hosts=1, sub_batch=32, network_time_s=nt, t_compute_s=0.01 * max(1, n / 2) ** 1.2,
                 t_compute_cv=0.3, t_update_s=nt + 1e-3 * max(1, n / 2), t_update_cv=0.5,
                 t_update_empty_s=nt + 1e-3 * max(1, n / 2), t_update_applying_s=nt + 1e-3 * max(1, n / 2),
                 empty_cycles=100, applying_cycles=100)
            for n in (1, 2, 4, 8) for nt in (0.0, 0.02)]
    meas = dict(gradient_steps=[dict(sub_batch=b, measured_s=1e-3 + 1e-4 * b) for b in (8, 16, 32, 64)], runs=runs,
                step_cores=[dict(sub_batch=b, cores=c) for b, c in ((8, 2.6), (16, 2.8), (32, 3.0))],
                allreduces=[dict(bytes=1e4, ranks=2, measured_s=5e-4), dict(bytes=1e6, ranks=2, measured_s=2e-3)])
    cal, out = tmp_path / "cal.json", tmp_path / "preset.json"
    cal.write_text(json.dumps({"format": "jaxsprint-runtime-calibration-1", "measurements": meas}))
    r = _run(f"--config.calibration.measurements={cal}", f"--out={out}", "--config.calibration.fit_only=True")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learner_step_cores" in r.stdout and "relative standard error" in r.stdout
    data = json.loads(out.read_text())
    assert json.loads(cal.read_text())["measurements"] == meas and data["fit"]["compute"]["n"] == len(runs)
    # The lone step's measured cores (their median) are kept and start stage 3, which fits the busy-core figure.
    assert data["fit"]["stages"]["step_cores"] == pytest.approx(2.8)
    fitted = data["fit"]["stages"]["runtime"]["fitted"]
    assert data["host"]["figures"]["learner_step_cores"] == pytest.approx(fitted["learner_step_cores"], rel=1e-3)
    assert 1.0 <= fitted["learner_step_cores"] <= 4.0 and fitted["learner_step_cores"] != pytest.approx(2.8, rel=1e-4)
    # The updater's cycle, empty or applying alike, grows by 0.5 ms per learner beyond 2 (1 ms x n / 2): a cost
    # per learner of every cycle, not the applying cycles' wait for a core (held at 0, undetermined).
    assert 2e-4 < data["host"]["figures"]["updater_per_learner_s"] < 8e-4
    assert "updater_apply_core_wait_s" not in fitted and data["host"]["figures"]["updater_apply_core_wait_s"] == 0.0
    # The updater's lock-wait term is off in every default calibration (host_fit.ALWAYS_FIXED), its reason the source.
    assert data["host"]["figures"]["updater_lock_waits"] == 0.0 and "updater_lock_waits" not in fitted
    assert data["host"]["sources"]["updater_lock_waits"].startswith("fixed at 0 (the lock-wait term off)")
    assert data["command"].endswith("--config.calibration.fit_only=True")  # the command that made it
    # The input draws: their slope over the sub-batches is the learner's host work per sample, held by stage 3.
    meas["input_draws"] = [dict(sub_batch=b, samples=[5e-5 + 2e-5 * b] * 4) for b in (8, 32, 128)]
    cal.write_text(json.dumps({"format": "jaxsprint-runtime-calibration-1", "measurements": meas}))
    r = _run(f"--config.calibration.measurements={cal}", f"--out={out}", "--config.calibration.fit_only=True")
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["host"]["figures"]["learner_input_per_sample_s"] == pytest.approx(2e-5, rel=1e-3)
    assert "learner_input_per_sample_s" not in data["fit"]["stages"]["runtime"]["fitted"]
    meas["input_draws"] = [dict(sub_batch=8)]  # no samples: a clean error, the preset left as it was
    cal.write_text(json.dumps({"format": "jaxsprint-runtime-calibration-1", "measurements": meas}))
    before = out.read_text()
    r = _run(f"--config.calibration.measurements={cal}", f"--out={out}", "--config.calibration.fit_only=True")
    assert r.returncode == 2 and "error: invalid config.calibration.measurements='input_draws'" in r.stderr
    assert "Traceback" not in r.stderr and out.read_text() == before


def test_bad_config_values_exit_2(tmp_path):
    k = "--config.calibration."
    r = _run(f"--out={tmp_path / 'x.json'}", k + "learners=0")
    assert r.returncode == 2 and "error: invalid config.calibration.learners=0" in r.stderr
    assert not os.path.exists(tmp_path / "x.json")
    r = _run(f"--out={tmp_path / 'x.json'}", k + "step_time_s=0")
    assert r.returncode == 2 and "error: invalid config.calibration.step_time_s=0" in r.stderr
    assert "Traceback" not in r.stderr and not os.path.exists(tmp_path / "x.json")
    for bad in ("rounds_after=-1", "run_min_measure_s=19"):
        r = _run(f"--out={tmp_path / 'x.json'}", k + bad)
        assert r.returncode == 2 and f"error: invalid config.calibration.{bad}" in r.stderr
        assert "Traceback" not in r.stderr and not os.path.exists(tmp_path / "x.json")
    r = _run(f"{k}measurements={tmp_path / 'missing.json'}", k + "fit_only=True")
    assert r.returncode == 2 and "error: invalid config.calibration.measurements=" in r.stderr
    r = _run(f"--out={tmp_path / 'x.json'}", k + "no_such=1")
    assert r.returncode == 2 and "error: invalid config.calibration.no_such='1'" in r.stderr
    assert "Traceback" not in r.stderr


def test_runs_from_a_validation_results_file_replace_the_stored_runs(tmp_path):
    """config.calibration.runs_from: the fit's runtime runs come from validate_runtime.py's results.json (two hosts
    among them), are stored in place of the old ones with their placements, and constrain a two-host figure; a file without runs exits 2,
    unchanged."""
    def run(name, hosts, lph, b, net, tc, tu):
        return dict(name=name, hosts=hosts, learners_per_host=lph, sub_batch=b, measured=dict(
            network_time_s=net, t_compute_s=tc, t_compute_cv=0.3, t_update_s=tu, t_update_cv=0.4,
            images_per_s=hosts * lph * b / tc,
            gradients=2000, updates=500, mean_staleness=1.0))
    results = {"runs": [run(f"r{i}", h, n, 32, nt, 0.01 * max(1, h * n / 2) ** 1.1, nt + 1e-3 * n * (2 if h > 1 else 1))
                        for i, (h, n, nt) in enumerate([(1, 1, 0.0), (1, 2, 0.02), (1, 4, 0.0), (1, 8, 0.02),
                                                        (2, 1, 0.0), (2, 2, 0.02), (2, 4, 0.0)])]}
    results["runs"][1]["updater_device"] = "shared"  # kept; a run without the field had its updater on its own
    (tmp_path / "results.json").write_text(json.dumps(results))
    meas = dict(gradient_steps=[dict(sub_batch=b, measured_s=1e-3 + 1e-4 * b) for b in (8, 16, 32, 64)],
                step_cores=[dict(sub_batch=8, cores=1.1)], runs=[],
                allreduces=[dict(bytes=1e4, ranks=2, measured_s=5e-4), dict(bytes=1e6, ranks=2, measured_s=2e-3)])
    out, preset = tmp_path / "cal.json", tmp_path / "preset.json"
    out.write_text(json.dumps({"format": "jaxsprint-runtime-calibration-1", "measurements": meas}))
    k = "--config.calibration."
    r = _run(f"{k}measurements={out}", f"--out={preset}", k + "fit_only=True",
             f"{k}runs_from={tmp_path / 'results.json'}")
    assert r.returncode == 0, r.stderr[-3000:]
    data = {**json.loads(preset.read_text()), **json.loads(out.read_text())}
    stored = data["measurements"]["runs"]
    assert [s["label"] for s in stored] == [f"r{i}" for i in range(7)] and [s["hosts"] for s in stored][-3:] == [2] * 3
    assert stored[1]["network_time_s"] == 0.02 and data["fit"]["compute"]["n"] == 7
    assert [s["updater_device"] for s in stored[:3]] == ["own", "shared", "own"]
    # Two-host runs constrain a figure only they see (the stretch or the all-reduce's wait per learner).
    assert {"updater_hosts_stretch", "updater_sync_per_learner_s"} & set(data["fit"]["fitted"])
    before = out.read_text()
    for i, bad in enumerate(({"runs": []}, {"runs": [{k: v for k, v in results["runs"][0].items() if k != "hosts"}]})):
        (tmp_path / f"bad{i}.json").write_text(json.dumps(bad))
        r = _run(f"{k}measurements={out}", f"--out={preset}", k + "fit_only=True",
                 f"{k}runs_from={tmp_path / f'bad{i}.json'}")
        assert r.returncode == 2 and "error: invalid config.calibration.runs_from=" in r.stderr
        assert "Traceback" not in r.stderr
        assert out.read_text() == before


def test_the_designed_calibration_measures_its_runs_and_fits_them(tmp_path):
    """The default path, at tiny sizes: lone steps, all-reduces, the design's runs (in series of one process
    layout, one and two hosts; a series that fails is reported and left out) and the fit; the measurement file keeps the design and every run with its placement,
    and the preset is a --machine_file every figure of which has a source."""
    cal, out = tmp_path / "cal.json", tmp_path / "preset.json"
    k = "--config.calibration."
    r = _run("--config.image_size=8", f"{k}measurements={cal}", f"--out={out}", f"{k}budget_s=60",
             f"{k}run_max_duration_s=4", f"{k}warmup_s=1", f"{k}rounds=1", f"{k}step_time_s=0.3",
             f"{k}run_startup_s=6", f"{k}run_min_measure_s=2", f"{k}rounds_after=1")
    assert r.returncode == 0, r.stderr[-3000:]
    # The lone steps ran under the runs' host allocator policy, applied before JAX started (run_sprint.py's).
    first = r.stdout.splitlines()[0]
    assert first.startswith("host allocator:") and "already started" not in first, first
    meas = json.loads(cal.read_text())["measurements"]
    # The lone steps were timed again after the runs: each record keeps both timings and their drift.
    assert "lone step after the runs" in r.stdout
    for g in meas["gradient_steps"]:
        assert g["drift"] == pytest.approx(g["after_s"] / g["before_s"] - 1) and g["after_s"] > 0
    # Every run measures at least run_min_measure_s after its warm-up, or (60 s cannot cover every regime with
    # runs that long) the design's share of it, at least run_scale_min.
    design = meas["design"]
    assert 0.6 <= design["scale"] < 1 and all(s >= 1 + 2 * design["scale"] - 1e-9 for s in design["planned_s"])
    # The runs of one process layout (hosts, learners, placement) run in a row in the same processes: every
    # chosen run is in one series, and every run is measured, series by series, but for those of a series that
    # failed (reported on a line and left out) and those dropped to keep budget_s at the pace measured (logged).
    series = design["series"]
    assert sorted(c for s in series for c in s) == sorted(design["chosen"])
    for s in series:
        assert len({c.split("_b")[0] + c.rpartition("_")[2] for c in s}) == 1, s  # cal_h2_l4_..._own
    failed = {c for ln in r.stdout.splitlines() if ": FAILED" in ln
              for c in ln.partition(": FAILED")[0].removeprefix("series of ").split(", ")}
    assert len(design["chosen"]) >= 2 and len(meas["runs"]) >= 1
    dropped = design["dropped"]
    assert set(dropped) <= set(design["chosen"]) and set(dropped).isdisjoint(failed)
    # Runs shortened at an overrun measured less than the design's share, at least run_scale_floor of their plan.
    assert all(0.3 <= s < design["scale"] for s in design["shortened"].values())
    assert set(design["shortened"]) <= {x["label"] for x in meas["runs"]}
    assert all(c in r.stdout.partition("runs dropped to stay within budget_s=")[2] for c in dropped), r.stdout[-2000:]
    assert [x["label"] for x in meas["runs"]] == [c for s in series for c in s if c not in failed | set(dropped)], \
        r.stdout[-2000:]
    # The lone step (probe_sub_batch) was probed before the first series and after each one measured; every
    # run's probe_s is the geometric mean of the two probes around its series.
    probes = [p["seconds"] for p in design["probes"]]
    ran = [ln for ln in r.stdout.splitlines() if ln.startswith("series ") and "; lone step probe " in ln]
    assert len(probes) == 1 + len(ran) >= 2 and all(p > 0 for p in probes)
    assert all(min(probes) <= x["probe_s"] <= max(probes) for x in meas["runs"])
    assert {x["updater_device"] for x in meas["runs"]} <= {"shared", "own"} and len(meas["allreduces"]) == 4
    assert {x["hosts"] for x in meas["runs"]} <= {1, 2} and all(x["t_compute_s"] > 0 for x in meas["runs"])
    # Each run keeps its empty and applying updater cycles (None where it had none of a kind), which the fit uses.
    assert all(x["empty_cycles"] + x["applying_cycles"] >= 1 and "t_update_empty_s" in x for x in meas["runs"])
    data = json.loads(out.read_text())
    assert data["measurements"] == str(cal) and data["fit"]["compute"]["n"] == len(meas["runs"])
    assert set(data["host"]["figures"]) == set(data["host"]["sources"])
    assert [d["sub_batch"] for d in meas["input_draws"]] == [d["sub_batch"] for d in meas["gradient_steps"]]
    assert data["host"]["figures"]["learner_input_per_sample_s"] == pytest.approx(
        data["fit"]["stages"]["input_per_sample_s"], rel=1e-3)


@pytest.mark.parametrize("quiet_after", [1, None])
def test_a_disturbed_lone_step_is_measured_again(monkeypatch, quiet_after):
    """A sub-batch whose lone steps average more than 1.15 x their best round's median is timed again (only
    that one), twice at most, and the quieter timing is kept; one still disturbed after that is reported."""
    cr = launcher("calibrate_runtime")
    from experiments.configs import calibrate_runtime as cfg
    from jaxsprint.calibration import timing

    calls = []

    def steps(config, batches, **kw):
        calls.append(list(batches))
        busy = quiet_after is None or len(calls) <= quiet_after
        # Disturbed: 3 steps in 10 twice as long (the trimmed mean 1.375 x the median).
        slow = {b: 2.0 if b == 32 and busy else 1.0 for b in batches}
        return [(1e-3 * b, [1e-3 * b] * 7 + [1e-3 * b * slow[b]] * 3) for b in batches]

    monkeypatch.setattr(timing, "measure_gradient_steps", steps)
    monkeypatch.setattr(timing, "measure_gradient_cores", lambda config, batches, **kw: [1.0] * len(batches))
    monkeypatch.setattr(timing, "measure_input_draws", lambda config, batches, **kw: [[1e-5 * b] for b in batches])
    config = cfg.get_config()
    config.calibration.allreduce = False
    lines = []
    meas = cr.measure(config, [8, 32], [], [], log=lines.append, runs=[])
    assert calls == [[8, 32]] + [[32]] * (cr._RETRIES if quiet_after is None else quiet_after)
    kept = {g["sub_batch"]: g for g in meas["gradient_steps"]}
    assert kept[8]["mean_s"] == pytest.approx(8e-3)
    assert kept[32]["mean_s"] == pytest.approx(32e-3 * (1.0 if quiet_after else 1.3))
    assert any("measuring them again" in ln for ln in lines)
    assert any(ln.startswith("WARNING") for ln in lines) == (quiet_after is None)


def test_check_speed_times_the_lone_steps_again_and_writes_nothing(tmp_path):
    """check_speed: a measurement file's lone steps timed again (tiny model), each change and the median printed;
    against steps of 1 s (a far slower machine) the speed has moved; nothing is written; bad input exits 2."""
    import re

    cal, k = tmp_path / "cal.json", "--config.calibration."
    steps = [dict(sub_batch=b, measured_s=1.0, samples=[1.0] * 5) for b in (8, 16)]
    cal.write_text(json.dumps({"format": "jaxsprint-runtime-calibration-1",
                               "measurements": {"gradient_steps": steps, "runs": []}}))
    before = cal.read_text()
    args = (f"{k}measurements={cal}", k + "check_speed=True", k + "step_time_s=0.2", k + "rounds_after=1",
            f"--out={tmp_path / 'preset.json'}")
    r = _run(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"b8 +1000\.000 ms", r.stdout) and re.search(r"b16 +1000\.000 ms", r.stdout)
    change = float(re.search(r"take ([-+0-9.]+)% \(median\)", r.stdout).group(1))
    assert -100 < change < -90 and "WARNING: this machine's speed has moved" in r.stdout  # a tiny step: ms
    assert cal.read_text() == before and os.listdir(tmp_path) == ["cal.json"]
    r = _run(*args, k + "fit_only=True")
    assert r.returncode == 2 and "error: invalid config.calibration.check_speed=True" in r.stderr
    cal.write_text(json.dumps({"format": "jaxsprint-runtime-calibration-1", "measurements": {"runs": []}}))
    r = _run(*args)
    assert r.returncode == 2 and "error: invalid config.calibration.measurements=" in r.stderr
    assert "Traceback" not in r.stderr and os.listdir(tmp_path) == ["cal.json"]


def test_the_runs_end_by_the_calibrations_wall_clock(monkeypatch):
    """With a deadline (``total_s``), the design spends at most what is left of the wall clock; a stall during the
    first series fits the runs left to what is left (logged): a short stall drops the runs that are not their
    regime's last and shortens the rest, so that every regime the design covered is still measured; a long one
    drops regimes' last runs too; either way the runs end by the deadline. A deadline that leaves no run is an
    error naming ``total_s``. (The series are faked: each takes the seconds it was planned, the first one also
    ``stall`` more, on a fake clock.)"""
    import types

    from experiments import design_runs, runtime_runs
    from experiments.configs import calibrate_runtime as cfg
    from jaxsprint.errors import ConfigError

    with open(os.path.join(ROOT, "docs", "runtime-calibration-design.json")) as f:
        measured = json.load(f)["measurements"]
    clock = [1000.0]
    monkeypatch.setattr(design_runs, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    config = cfg.get_config()
    for stall in (0.0, 15.0, 100.0):
        calls = []

        def series(entries, durations_s, workdir, **kw):
            clock[0] += sum(durations_s) + config.calibration.run_segment_s * len(entries) + (stall if not calls else 0)
            calls.append([e.name for e in entries])
            return [dict(measured={**{k: 1e-3 for k in runtime_runs.RECORD}, "gradients": 100, "updates": 100})
                    for _ in entries]

        monkeypatch.setattr(runtime_runs, "run_series", series)
        lines = []
        deadline = clock[0] + 200.0
        records, design = design_runs.measure(config, measured, config_file="config.py", log=lines.append,
                                              deadline=deadline)
        assert any(" s of 200 (each run measuring 60% of its plan); predicted" in ln for ln in lines), lines[:3]
        assert design["scale"] == 0.6  # 200 s cannot cover every regime with longer runs
        assert clock[0] <= deadline and len(records) == sum(len(c) for c in calls) >= 2
        regimes = {r for s in design["series"] for r in s}
        ran = {c for s in calls for c in s}
        assert set(design["shortened"]) <= ran and all(0.3 <= v < 0.6 for v in design["shortened"].values())
        assert bool(design["shortened"]) == (stall > 0), lines
        assert any(ln.startswith("runs left shortened to measure") for ln in lines) == (stall > 0)
        if stall == 15.0:  # every regime chosen still has a run
            from jaxsprint.calibration import design as dz
            pool = {e.name: e for e in dz.candidates()}
            strata = dict(zip(pool, dz.strata(list(pool.values()))))
            assert {strata[c] for c in ran} == {strata[c] for c in regimes}, design["dropped"]
        if stall == 100.0:
            assert any(ln.startswith("runs dropped to stay within budget_s=430 s and total_s=590 s") for ln in lines)
    # With a probe of the lone step (1.5 s on the clock each), the plan reads what is left after the first probe
    # less a probe for every series a design may have: the probes after each series push no run past the
    # deadline, and none is dropped or shortened for them.
    def probe():
        clock[0] += 1.5
        return 0.01

    from jaxsprint.calibration import design as dz
    layouts = len({runtime_runs.same_processes(e) for e in dz.candidates()})
    stall, calls, lines = 0.0, [], []
    deadline = clock[0] + 200.0
    records, design = design_runs.measure(config, measured, config_file="config.py", log=lines.append,
                                          deadline=deadline, probe=probe)
    budget = [float(m[1]) for ln in lines if (m := re.search(r" s of ([0-9.]+) \(each run", ln))]
    assert budget and abs(budget[0] - (200.0 - 1.5 - 1.5 * layouts)) <= 0.5, lines[:3]
    assert clock[0] <= deadline and not design["dropped"] and not design["shortened"]
    assert len(design["probes"]) == 1 + len(calls) and all(r["probe_s"] == pytest.approx(0.01) for r in records)
    with pytest.raises(ConfigError, match="config.calibration.total_s"):
        design_runs.measure(config, measured, config_file="config.py", log=lines.append, deadline=clock[0] + 1.0)
