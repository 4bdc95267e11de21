"""scripts/pool_draws.py on two written draws of one preset: the pooled medians and 90th percentiles per placement
are numpy's over all their runs, the bar's verdict names what misses; bad input exits 2."""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    return subprocess.run([sys.executable, "scripts/pool_draws.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})


def _draw(path, preset, errors, speed=None):
    """A draw as validate_runtime.py writes it: ``errors`` is ``(placement, epoch, mini-batch, staleness)``
    relative errors from specs (from timings a tenth of them); with ``speed``, learner cycles from specs that
    many times the measured ones."""
    os.makedirs(path)
    keys = ("epoch_time_rel_error", "mean_minibatch_rel_error", "mean_staleness_rel_error")
    runs = [dict(name=f"r{i:02d}", updater_device=where, errors_from_specs=dict(zip(keys, e)),
                 errors_from_timings={k: v / 10 for k, v in zip(keys, e)}) for i, (where, *e) in enumerate(errors)]
    for i, r in enumerate(runs if speed else []):
        tc = 0.004 * (i + 1)
        r["measured"], r["predicted_from_specs"] = dict(t_compute_s=tc), dict(t_compute_s=tc * speed)
    with open(os.path.join(path, "results.json"), "w") as fh:
        json.dump(dict(runs=runs, failures=[]), fh)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(dict(validation=dict(machine_file=preset, machine="cpu_runtime")), fh)


def test_pool_draws_pools_per_placement_and_names_the_misses(tmp_path):
    rng = np.random.default_rng(0)
    own = rng.uniform(-0.12, 0.12, (10, 3))
    own[3, 1] = 0.6  # two large mini-batch errors: the pooled p90 over 10 runs passes 25%
    own[7, 1] = -0.5
    shared = rng.uniform(-0.1, 0.1, (10, 3))
    a, b = tmp_path / "a", tmp_path / "b"
    _draw(a, "p.json", [("own", *e) for e in own[:5]] + [("shared", *e) for e in shared[:5]])
    _draw(b, "p.json", [("own", *e) for e in own[5:]] + [("shared", *e) for e in shared[5:]], speed=1.082)
    r = _run(f"--out={a},{b}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 draws against p.json, 20 runs" in r.stdout
    # Each draw's learner cycle from specs over the measured one (a has none: no line).
    assert f"{b}: the learner cycle from specs +8.2% over its 10 runs" in r.stdout and f"{a}:" not in r.stdout
    for where, e in (("own", own), ("shared", shared)):
        for stat, q in (("median", 50), ("p90", 90)):
            want = " | ".join(f"{100 * v:.1f}%" for v in np.percentile(np.abs(e), q, axis=0))
            assert f"| {where} (10) | specs | {stat} | {want} |" in r.stdout, (where, stat, r.stdout)
            want = " | ".join(f"{10 * v:.1f}%" for v in np.percentile(np.abs(e), q, axis=0))
            assert f"| {where} (10) | timings | {stat} | {want} |" in r.stdout, (where, stat, r.stdout)
    p90 = 100 * np.percentile(np.abs(own[:, 1]), 90)
    assert f"own: missed (mean mini-batch p90 {p90:.1f}%)" in r.stdout and "shared: met" in r.stdout
    r = _run(f"--out={a},{b}", "--p90_bar=0.6")  # a looser bar: both met
    assert r.returncode == 0 and "own: met; shared: met" in r.stdout, r.stdout


def test_pool_draws_bad_input_exits_2(tmp_path):
    _draw(tmp_path / "a", "p.json", [("own", 0.1, 0.1, 0.1)])
    _draw(tmp_path / "b", "q.json", [("own", 0.1, 0.1, 0.1)])
    os.makedirs(tmp_path / "empty")
    for args, field in (([], "--out"), ([f"--out={tmp_path / 'empty'}"], "--out"),
                        ([f"--out={tmp_path / 'a'},{tmp_path / 'b'}"], "--out"),
                        ([f"--out={tmp_path / 'a'}", "--median_bar=0"], "--median_bar"),
                        ([f"--out={tmp_path / 'a'}", "extra"], "arguments")):
        r = _run(*args)
        assert r.returncode == 2 and field in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
