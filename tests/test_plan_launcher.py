"""End-to-end tests of experiments/plan.py: bad input exits 2 with one line before anything is written; a tiny
plan runs (slow)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ["--machine=tsubame_kfc_dl", "--network=resnet8", "--max_nodes=16", "--max_sub_batch=32"]


def _run(args, cache, timeout=600):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "experiments/plan.py", *BASE, f"--cache_dir={cache}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


_DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys
    sys.argv = ["plan.py"]
    sys.path.insert(0, "experiments")
    import plan as launcher
    from jaxsprint import cli
    results = []
    for args in json.loads(sys.stdin.read()):
        launcher.FLAGS.unparse_flags()
        err, out = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                cli.guarded(launcher.main)(cli.parse_flags(["plan.py", *args]))
            except SystemExit as e:
                code = e.code
        results.append([code, out.getvalue(), err.getvalue()])
    print(json.dumps(results))
""")

BAD = [
    (["--target_accuracy=0"], "--target_accuracy"),
    (["--target_accuracy=1.2"], "--target_accuracy"),
    (["--target_accuracy=nan"], "--target_accuracy"),
    ([], "--target_accuracy"),
    (["--target_accuracy=0.9", "--data=no_such_data"], "--data"),
    (["--target_accuracy=0.9", "--model=resnet999"], "--model"),
    (["--target_accuracy=0.9", "--staleness_limits=0.5"], "--staleness_limits"),
    (["--target_accuracy=0.9", "--minibatch_range=64,8"], "--minibatch_range"),
    (["--target_accuracy=0.9", "--budget_runs=0"], "--budget_runs"),
    (["--target_accuracy=0.9", "--lr_rule=cosine"], "lr_rule"),
]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    """Every case in one child process (absl flags are process-global), as jaxsprint.cli.run would run it."""
    cache = tmp_path / "cache"
    cases = [[*BASE, f"--cache_dir={cache}", *args] for args, _ in BAD]
    r = subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(cases), capture_output=True, text=True,
                       cwd=ROOT, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    for (args, field), (code, _, err) in zip(BAD, json.loads(r.stdout.strip().splitlines()[-1])):
        assert code == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and field in lines[0], (args, err)
    assert not cache.exists()


@pytest.mark.slow
def test_a_tiny_plan_then_the_same_plan_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    args = ["--target_accuracy=0.8", "--minibatch_range=16,64", "--ladder=2", "--staleness_limits=inf",
            "--budget_runs=2", "--initial_runs=2", "--seeds=1", "--max_updates=100", "--eval_every=25",
            "--search_starts=2", "--json", f"--plot={tmp_path / 'plan.png'}"]
    r = _run(args, cache)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["runs"]["trained"] == out["runs"]["used"] >= 1
    if out["reached"]:
        assert out["chosen"]["predicted_time_to_accuracy_s"] > 0
        assert (tmp_path / "plan.png").exists()
    else:
        assert 0.0 <= out["best_reached"]["accuracy"] < 0.8
    again = json.loads(_run(args, cache).stdout)
    assert again["runs"]["trained"] == 0 and again["runs"]["cached"] == out["runs"]["used"]
    unreachable = _run([a if not a.startswith("--target_accuracy") else "--target_accuracy=1.0" for a in args], cache)
    assert unreachable.returncode == 0, unreachable.stderr[-3000:]
    u = json.loads(unreachable.stdout)
    assert u["runs"]["trained"] == 0  # the same runs, read back: the target is not part of a run's key
    if not u["reached"]:
        assert u["best_reached"]["accuracy"] < 1.0
