"""Tests of jaxsprint.calibration.timing: a real (tiny) all-reduce over 2 local processes and a real train step, checked
for structure and positivity only (never for speed), and the errors that name the setting."""
import math
import os

import jax
import numpy as np
import pytest

from jaxsprint.calibration import timing
from jaxsprint.calibration import model_fit
from perf_util import raises_invalid


def test_allreduce_over_two_processes():
    sizes = [4096, 65536]
    out = timing.measure_allreduce(2, sizes, reps=2, rounds=1, timeout_s=120)
    assert [a.message_bytes for a in out] == [float(s) for s in sizes]
    for a in out:
        assert isinstance(a, model_fit.AllreduceTiming) and a.ranks == 2
        assert math.isfinite(a.measured_s) and a.measured_s > 0
        assert a.label == f"allreduce {int(a.message_bytes)} B x 2"


def test_train_steps_of_a_project_model():
    lines = []
    # 8x8 images; rbg random bits for the eager init inside (no value is read; eager threefry compiles a
    # program per parameter shape, seconds for a ResNet).
    with jax.default_prng_impl("rbg"):
        out = timing.measure_train_steps([("resnet8", 2)], rounds=2, min_time_s=0.0, min_reps=2, image_size=8,
                                         cpu_kernels="off", log=lines.append)
    assert len(out) == 1
    for seconds, samples in out:
        assert len(samples) >= 4 and all(s > 0 for s in samples)  # 2 rounds x at least 2 steps
        assert seconds > 0 and min(samples) <= seconds <= max(samples)
    assert lines[0].startswith("CPU kernels: off") and "round 2/2 done" in lines[-1]


def test_bad_settings_name_the_field():
    with raises_invalid("ranks", 1, "an integer >= 2"):
        timing.measure_allreduce(1, [1024])
    with raises_invalid("timeout_s", 0, "a number > 0"):
        timing.measure_allreduce(2, [1024], timeout_s=0)
    with raises_invalid("cpu_kernels", "fast", "allowed: auto, off, require"):
        timing.measure_train_steps([("resnet8", 2)], cpu_kernels="fast")
    with raises_invalid("rounds", 0, "an integer >= 1"):
        timing.measure_train_steps([("resnet8", 2)], rounds=0)


def _sprint_config():
    from experiments.configs import sprint

    c = sprint.get_config()
    c.cpu_kernels = "off"
    return c


@pytest.mark.slow  # two compiles of the gradient and four of the cost analysis: about a minute when loaded
def test_gradient_steps_of_the_runtime_learner_and_its_network():
    out = timing.measure_gradient_steps(_sprint_config(), [2, 4], rounds=1, min_time_s=0.0, min_reps=2)
    assert len(out) == 2
    for seconds, samples in out:
        assert len(samples) >= 2 and all(s > 0 for s in samples) and min(samples) <= seconds <= max(samples)
    net = timing.runtime_network(_sprint_config())
    assert int(net.total_params) > 0 and float(net.fwd_flops.sum()) > 0
    with raises_invalid("sub_batches", 0, "integers in 1.."):
        timing.measure_gradient_steps(_sprint_config(), [0])
    cores = timing.measure_gradient_cores(_sprint_config(), [2, 4], min_time_s=0.05)
    # CPU seconds per wall second of one busy thread: above 0, never above the machine's cores.
    assert len(cores) == 2 and all(0 < c <= 1.05 * os.cpu_count() for c in cores)
    with raises_invalid("min_reps", 0, "an integer >= 1"):
        timing.measure_gradient_cores(_sprint_config(), [2], min_reps=0)
    # A probe compiles once and times the step again at each call (at least min_reps steps).
    probe = timing.lone_step_probe(_sprint_config(), 4, min_time_s=0.0, min_reps=3)
    assert all(0 < probe() < 10.0 for _ in range(2))
    with raises_invalid("min_reps", 0, "an integer >= 1"):
        timing.lone_step_probe(_sprint_config(), 4, min_reps=0)


def test_input_draws_of_the_runtime_learner_grow_with_the_sub_batch():
    """Every draw is timed (rounds interleaved); drawing 16 times the samples takes longer on average."""
    out = timing.measure_input_draws(_sprint_config(), [4, 64], rounds=2, min_time_s=0.05, min_reps=10)
    assert len(out) == 2 and all(len(s) >= 20 and min(s) > 0 for s in out)
    assert np.median(out[1]) > np.median(out[0])
    with raises_invalid("sub_batches", 0, "integers in 1.."):
        timing.measure_input_draws(_sprint_config(), [0])
    with raises_invalid("rounds", 0, "an integer >= 1"):
        timing.measure_input_draws(_sprint_config(), [4], rounds=0)
