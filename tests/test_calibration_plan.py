"""The calibration's plan of its runs and its lone-step timings (pure parts of experiments/calibrate_runtime.py)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def test_lone_steps_before_and_after_the_runs_are_merged():
    """The fit takes every sample of both timings; the record keeps each timing's trimmed mean and the drift."""
    from jaxsprint.calibration import timing
    from jaxsprint.calibration import measurements

    def rec(b, t, n):
        return dict(sub_batch=b, measured_s=t, mean_s=t, samples=[t] * n)

    merged = timing.merge_lone_steps([rec(8, 1e-3, 10), rec(32, 4e-3, 10)], [rec(32, 5e-3, 10), rec(8, 1e-3, 30)])
    assert [g["sub_batch"] for g in merged] == [8, 32]
    assert merged[0]["drift"] == pytest.approx(0.0) and len(merged[0]["samples"]) == 40
    assert merged[1]["drift"] == pytest.approx(0.25) and merged[1]["measured_s"] == pytest.approx(4e-3)
    assert measurements.gradient_step_seconds(merged[1]) == pytest.approx(4.5e-3)
    assert (merged[1]["before_s"], merged[1]["after_s"]) == pytest.approx((4e-3, 5e-3))


def test_a_run_measures_at_least_its_minimum_after_the_warm_up():
    from experiments import runtime_runs

    short = dict(min_gradients=10, min_updates=10, warmup_s=2.0, max_duration_s=20.0)
    assert runtime_runs.plan_duration(1e-3, 1e-3, 1, **short) == pytest.approx(2.0 + 1.3 * 0.01 + 1.0)
    assert runtime_runs.plan_duration(1e-3, 1e-3, 1, min_measure_s=6.0, **short) == pytest.approx(8.0)
    assert runtime_runs.plan_duration(1.0, 1.0, 1, min_measure_s=6.0, **short) == pytest.approx(16.0)
    assert runtime_runs.plan_duration(10.0, 10.0, 1, min_measure_s=6.0, **short) == pytest.approx(20.0)
    # scale: that share of the measuring after a whole warm-up (a slow machine's design, design.run_scale)
    assert runtime_runs.plan_duration(1.0, 1.0, 1, min_measure_s=6.0, scale=0.5, **short) == pytest.approx(9.0)
    assert runtime_runs.plan_duration(10.0, 10.0, 1, scale=0.6, **short) == pytest.approx(2.0 + 0.6 * 18.0)
