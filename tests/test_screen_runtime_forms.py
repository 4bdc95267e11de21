"""experiments/screen_runtime_forms.py: the bottleneck form by hand, its fit, and the launcher on real files."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import screen_runtime_forms as srf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THETA = (2e-3, 0.5, 4.0, 1e-3, 1e-3, 0.5, 1.5, 0.4)  # g, k_p, b_0, a, c, q, s_H, c_u


def _run(L, H, b, net, t_step):
    return dict(name=f"h{H}_l{L}_b{b}", L=L, H=H, b=b, net=net, t_step=t_step)


def test_cycle_times_by_hand_for_eight_learners_on_one_host():
    r = _run(8, 1, 32, 0.01, 6e-3)
    g, k_p, b_0, a, c, q, s_h, c_u = THETA
    own = a + c * 8 + q * 6e-3  # the cores are full (N - C + 1 >= 1); one host: no s_H
    beta = own / (own + 0.01)
    lone, gil = 6e-3 + g, 8 * g / (1 - beta / 2)
    cpu = 8 * (1 + k_p * 32 / 36) * 6e-3 / (2 - beta * c_u)
    t_c, t_u = srf.cycle_times(THETA, r, 2.0, 8.0)
    assert t_u == pytest.approx(own + 0.01, rel=1e-12)
    assert t_c == pytest.approx((lone ** 8 + gil ** 8 + cpu ** 8) ** (1 / 8), rel=1e-12)
    assert cpu > gil > lone and t_c > cpu  # the shared cores bound this run; the smooth max lies above it


def test_two_hosts_stretch_the_updater_and_count_every_learner_on_the_cores():
    one = srf.cycle_times(THETA, _run(2, 1, 32, 0.02, 6e-3), 2.0, 8.0)
    two = srf.cycle_times(THETA, _run(1, 2, 32, 0.02, 6e-3), 2.0, 8.0)
    own_one, own_two = one[1] - 0.02, two[1] - 0.02
    assert own_two == pytest.approx((THETA[3] + THETA[4] * 1 + THETA[5] * 6e-3) * (1 + THETA[6]), rel=1e-12)
    assert own_one == pytest.approx(THETA[3] + THETA[4] * 2 + THETA[5] * 6e-3, rel=1e-12)


def test_fit_reproduces_cycles_generated_by_the_form():
    steps = {8: 2.2e-3, 16: 3.8e-3, 32: 6.9e-3, 64: 12.8e-3, 128: 26.9e-3}
    configs = [(1, 1, 8, 0.02), (2, 1, 64, 0.01), (4, 1, 16, 0.1), (8, 1, 128, 0.05), (8, 1, 8, 0.02),
               (1, 2, 8, 0.05), (2, 2, 32, 0.02), (4, 2, 64, 0.1), (4, 1, 32, 0.03), (1, 1, 128, 0.005)]
    runs = []
    for L, H, b, net in configs:
        r = _run(L, H, b, net, steps[b])
        r["Tc"], r["Tu"] = srf.cycle_times(THETA, r, 2.0, 8.0)
        runs.append(r)
    theta = srf.fit(runs, 2.0, 8.0)
    for r in runs:
        t_c, t_u = srf.cycle_times(theta, r, 2.0, 8.0)
        assert t_c == pytest.approx(r["Tc"], rel=2e-3) and t_u == pytest.approx(r["Tu"], rel=2e-3)


def test_launcher_prints_the_loo_table_and_rejects_bad_input(tmp_path):
    steps = {8: 2.2e-3, 32: 6.9e-3, 128: 26.9e-3}
    grid = []
    for L, H, b, net in [(1, 1, 8, 0.02), (2, 1, 32, 0.01), (8, 1, 128, 0.05), (1, 2, 8, 0.05), (4, 1, 8, 0.1)]:
        r = _run(L, H, b, net, steps[b])
        t_c, t_u = srf.cycle_times(THETA, r, 2.0, 8.0)
        grid.append(dict(name=r["name"], hosts=H, learners_per_host=L, sub_batch=b,
                         measured=dict(network_time_s=net, t_compute_s=t_c, t_update_s=t_u)))
    (tmp_path / "results.json").write_text(json.dumps({"runs": grid}))
    (tmp_path / "cal.json").write_text(json.dumps({"measurements": {"gradient_steps": [
        {"sub_batch": b, "measured_s": t} for b, t in steps.items()]}}))
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "screen_runtime_forms.py"),
           f"--results={tmp_path / 'results.json'}", f"--calibration={tmp_path / 'cal.json'}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| h")]
    assert [row.split(" | ")[0][2:] for row in rows] == [g["name"] for g in grid]
    median = next(line for line in out.stdout.splitlines() if "median" in line)
    assert all(math.isfinite(float(v.strip(" %|*"))) for v in median.split(" | ")[1:])
    bad = subprocess.run(cmd[:2] + [f"--calibration={tmp_path / 'missing.json'}"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "--calibration" in bad.stderr and "Traceback" not in bad.stderr
