"""End-to-end tests of experiments/predict.py (subprocesses: absl flags are process-global), and
``--machine_file`` with a preset as experiments/calibrate.py writes it."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "predict.py")
KEYS = ["t_compute_s", "t_update_s", "epoch_time_s", "updates_per_epoch", "mean_minibatch",
        "mean_staleness", "minibatch_pmf", "staleness_pmf"]


def _run(args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_timings_mode_json_has_exactly_the_keys():
    r = _run(["--workers=64", "--sub_batch=32", "--t_compute=0.1", "--t_compute_cv=0.05",
              "--t_update=0.037", "--json"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # exactly one JSON object on stdout
    assert list(out) == KEYS
    assert out["mean_minibatch"] == pytest.approx(32 * 64 * 0.037 / 0.1, rel=1e-5)
    assert out["mean_staleness"] == pytest.approx(0.1 / 0.037 + 1, rel=1e-5)
    for key, scale in (("minibatch_pmf", 32), ("staleness_pmf", 1)):
        pmf = out[key]
        assert sum(pmf.values()) == pytest.approx(1.0, abs=1e-4)
        assert all(int(k) % scale == 0 for k in pmf)
        mean = sum(int(k) * p for k, p in pmf.items())
        assert mean == pytest.approx(out["mean_" + key.split("_")[0]], rel=2e-3)


# Many flag sets in one child process: parse + main exactly as jaxsprint.cli.run does, exit codes recorded.
_DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys
    sys.argv = ["predict.py"]
    sys.path.insert(0, "experiments")
    import predict
    from jaxsprint import cli
    cases = json.loads(sys.stdin.read())
    results = []
    for args in cases:
        predict.FLAGS.unparse_flags()
        err, out = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                argv = cli.parse_flags(["predict.py", *args])
                cli.guarded(predict.main)(argv)
            except SystemExit as e:
                code = e.code
        results.append([code, out.getvalue(), err.getvalue()])
    print(json.dumps(results))
""")


def _drive(cases):
    r = subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(cases), capture_output=True, text=True,
                       cwd=ROOT, timeout=180, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])

CASES = {
    "spec": (["--machine=tsubame_kfc_dl", "--network=resnet50", "--nodes=16", "--gpus_per_node=8",
              "--sub_batch=32", "--json"], 0, None),
    "table": (["--workers=8", "--t_compute=1.0", "--t_update=0.4"], 0, "epoch time"),
    "zero_workers": (["--workers=0", "--t_compute=0.1", "--t_update=0.04"], 2,
                     "invalid workers=0: an integer >= 1"),
    "negative_workers": (["--workers=-3", "--t_compute=0.1", "--t_update=0.04"], 2,
                         "invalid workers=-3: an integer >= 1"),
    "nan_time": (["--workers=8", "--t_compute=nan", "--t_update=0.04"], 2,
                 "invalid t_compute=nan: a finite number > 0"),
    "inf_time": (["--workers=8", "--t_compute=0.1", "--t_update=inf"], 2,
                 "invalid t_update=inf: a finite number > 0"),
    "unknown_machine": (["--machine=tsubame3", "--network=resnet50"], 2,
                        "invalid machine='tsubame3': one of tsubame25"),
    "unknown_network": (["--machine=abci", "--network=resnet51"], 2,
                        "invalid network='resnet51': one of alexnet"),
    "too_big": (["--machine=tsubame25", "--network=vgg16", "--sub_batch=512"], 2,
                "invalid sub_batch=512: 1..37: 60.6 GB needed for vgg16"),
    "missing": (["--workers=8", "--t_compute=0.1"], 2, "invalid --t_update=None: required in timings mode"),
    "mixed": (["--workers=8", "--machine=abci"], 2, "invalid --machine='abci': not given with --workers"),
    "no_network": (["--machine=abci"], 2, "invalid --network=None: required in spec mode: one of alexnet"),
    "positional": (["extra"], 2, "invalid arguments=['extra']: none besides --flags"),
    "bad_flag": (["--workers=abc"], 2, "workers"),
}


def _file_cases(preset):
    return [
        [f"--machine_file={preset}", "--network=resnet8", "--nodes=2", "--gpus_per_node=2",
         "--sub_batch=16", "--json"],
        ["--machine=cpu", "--network=resnet8", "--nodes=2", "--gpus_per_node=2", "--sub_batch=16",
         "--json"],
        [f"--machine_file={preset}", "--machine=cpu", "--network=resnet8"],
        ["--machine_file=/nonexistent/m.json", "--network=resnet8"],
    ]


_JITTER_BASE = ["--workers=4", "--t_compute=1", "--t_update=2", "--json"]
_JITTER_CASES = [_JITTER_BASE, _JITTER_BASE + ["--t_update_cv=0.6", "--t_update_shift=1.2"],
                 _JITTER_BASE + ["--t_update_cv=0.6", "--t_update_shift=2.5"]]


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """A saved "this machine" preset (the cpu preset with a larger latency), as calibrate writes."""
    from jaxsprint.perf import machines, presets

    path = str(tmp_path_factory.mktemp("preset") / "this_machine.json")
    m = machines.with_figures(machines.get("cpu"), network_latency_s=2e-4).replace(name="this_machine")
    presets.save_preset(path, m, compute_cv=0.02)
    return path


@pytest.fixture(scope="module")
def driven(preset):
    """The flag sets of the tests below, all through one child process (one JAX start): {group: results}."""
    groups = {"cases": [c[0] for c in CASES.values()], "file": _file_cases(preset), "jitter": _JITTER_CASES}
    flat = _drive([args for cases in groups.values() for args in cases])
    out, start = {}, 0
    for name, cases in groups.items():
        out[name], start = flat[start:start + len(cases)], start + len(cases)
    return out


def test_many_flag_sets_in_one_process(driven):
    results = driven["cases"]
    for (name, (_, code, text)), (got_code, out, err) in zip(CASES.items(), results):
        assert got_code == code, (name, got_code, err)
        if code == 2:
            assert err.startswith("error: ") and "Traceback" not in err, (name, err)
            assert text in err, (name, err)
        elif text:
            assert text in out, (name, out)
    spec = json.loads(results[0][1])
    assert list(spec) == KEYS
    assert spec["t_compute_s"] > 0 and spec["epoch_time_s"] > 0


def test_real_launcher_exits_2_on_bad_input():
    r = _run(["--workers=0", "--t_compute=0.1", "--t_update=0.04"])
    assert r.returncode == 2
    assert "workers=0" in r.stderr and "Traceback" not in r.stderr


def test_predict_launcher_reads_a_machine_file(preset, driven):
    (c0, o0, e0), (c1, o1, e1), (c2, _, e2), (c3, _, e3) = driven["file"]
    assert c0 == 0 and c1 == 0, (e0, e1)
    from_file, preset_cpu = json.loads(o0), json.loads(o1)
    # Same compute figures, a larger all-reduce latency: same T_c, longer T_u.
    assert from_file["t_compute_s"] == pytest.approx(preset_cpu["t_compute_s"], rel=1e-6)
    assert from_file["t_update_s"] > preset_cpu["t_update_s"]
    assert c2 == 2 and f"invalid machine_file={preset!r}: not given together with machine='cpu'" in e2
    assert c3 == 2 and "invalid machine_file='/nonexistent/m.json': an existing JSON machine preset" in e3
    assert "Traceback" not in e2 + e3


def test_updater_jitter_and_shift_flags(driven):
    # The three runs in the child process of the other flag sets (the real command line's exit status and
    # error line are checked by test_real_launcher_exits_2_on_bad_input).
    (c0, o0, e0), (c1, o1, e1), (c2, _, e2) = driven["jitter"]
    assert c0 == 0, e0[-2000:]
    plain = json.loads(o0)
    assert c1 == 0, e1[-2000:]
    out = json.loads(o1)
    assert out["mean_minibatch"] == plain["mean_minibatch"] and out["mean_staleness"] == plain["mean_staleness"]
    mean = sum(int(k) * v for k, v in out["minibatch_pmf"].items())
    assert mean == pytest.approx(256.0, rel=3e-3)
    assert out["minibatch_pmf"] != plain["minibatch_pmf"]
    assert c2 == 2
    assert [ln for ln in e2.splitlines() if ln.startswith("error:")] == [
        "error: invalid t_update_shift=2.5: a finite number >= 0 and < t_update=2.0"]
