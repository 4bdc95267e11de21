"""Tests of jaxsprint.perf.space: the exact evaluation is the SPRINT model, the precision option's model,
the constraints and the score, the space's own compiled functions, and validation errors."""
import math

import numpy as np
import pytest

from jaxsprint.perf import machines as mc
from jaxsprint.perf import networks as nw
from jaxsprint.perf import space as sp_lib
from jaxsprint.perf import sprint, times, zoo
from perf_util import raises_invalid


@pytest.fixture(scope="module")
def space():
    # 16 nodes x 4 learners x sub-batch 1..64 = 4,096 configurations of ResNet-8 on ABCI.
    return sp_lib.make_space(zoo.get("resnet8"), mc.get("abci"), max_nodes=16, max_sub_batch=64)


@pytest.fixture(scope="module")
def precision_space():
    net = nw.from_spec([("conv", 16, 3), ("relu",), ("conv", 32, 3), ("gap",), ("dense", 10)], (16, 16, 3))
    prec = sp_lib.Precision(low_peak_factor=4.0, max_low_fraction=0.4)
    return sp_lib.make_space(net, mc.get("abci"), max_nodes=6, max_sub_batch=24, precision=prec)


def test_evaluate_is_the_sprint_model(space):
    target = sp_lib.make_target(500)
    s, score, ok, viol = sp_lib.score_configs(space, target, [(3, 2, 17)])
    p = sprint.predict(space.network, space.machine, 3.0, 2.0, 17.0)
    assert s.epoch_time_s[0] == pytest.approx(float(p.epoch_time_s), rel=1e-6)
    assert s.mean_minibatch[0] == pytest.approx(float(p.mean_minibatch), rel=1e-6)
    assert s.mean_staleness[0] == pytest.approx(float(p.mean_staleness), rel=1e-6)
    assert s.memory_bytes[0] == pytest.approx(float(times.memory_bytes(space.network, 17)), rel=1e-6)
    # Little's law holds for every configuration the space evaluates.
    assert (s.mean_staleness[0] - 1) * s.mean_minibatch[0] == pytest.approx(3 * 2 * 17, rel=1e-4)
    # Feasible exactly on the band; the score is then the log epoch time.
    inside = abs(s.mean_minibatch[0] / 500 - 1) <= 0.05
    assert bool(ok[0]) == inside
    if inside:
        assert score[0] == pytest.approx(math.log(s.epoch_time_s[0]), rel=1e-6) and viol[0] == 0
    else:
        assert score[0] == pytest.approx(sp_lib.INFEASIBLE_SCORE + viol[0]) and viol[0] > 0


def test_score_configs_pads_chunks_without_changing_values(space):
    target = sp_lib.make_target(300)
    rng = np.random.default_rng(0)
    x = np.stack([rng.integers(1, 17, 37), rng.integers(1, 5, 37), rng.integers(1, 65, 37)], 1)
    big = sp_lib.score_configs(space, target, x)
    small = sp_lib.score_configs(space, target, x, chunk=8)  # 5 chunks, the last padded
    for a, b in zip(big[0], small[0]):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_array_equal(big[2], small[2])
    assert len(big[1]) == 37


def test_a_space_compiles_once_and_keeps_its_functions(space):
    built = []

    def build():
        built.append(1)
        return object()

    f1 = space.jitted(("probe",), build)
    f2 = space.jitted(("probe",), build)
    assert f1 is f2 and built == [1]
    other = sp_lib.make_space(space.network, space.machine, max_nodes=16, max_sub_batch=64)
    assert other.jitted(("probe",), build) is not f1 and built == [1, 1]  # an equal space has its own
    assert other == space  # the compiled functions are not part of the value


def test_precision_model(precision_space):
    # Low precision never makes the compute slower, and all-fp32 is the plain model.
    sp, net = precision_space, precision_space.network
    assert sp.num_precision == len(net.layer_names) == 5
    assert sp.size == 6 * 4 * 24 * 2 ** 5
    target = sp_lib.make_target(150)
    s, _, _, _ = sp_lib.score_configs(sp, target, [(2, 2, 8) + (0,) * 5, (2, 2, 8) + (1,) * 5])
    p = sprint.predict(net, sp.machine, 2.0, 2.0, 8.0)
    assert s.t_compute_s[0] == pytest.approx(float(p.t_compute_s), rel=1e-6)
    assert s.t_compute_s[1] < s.t_compute_s[0] and s.t_update_s[1] < s.t_update_s[0]
    assert s.memory_bytes[1] < s.memory_bytes[0]
    assert s.low_fraction[0] == 0 and s.low_fraction[1] == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs, field, value, allowed", [
    (dict(minibatch=0), "target_minibatch", 0, "a finite number >= 1"),
    (dict(minibatch=-5), "target_minibatch", -5, "a finite number >= 1"),
    (dict(minibatch=float("nan")), "target_minibatch", float("nan"), "a finite number >= 1"),
    (dict(minibatch=1024, tolerance=0), "tolerance", 0, "a number > 0 and < 1"),
    (dict(minibatch=1024, tolerance=-0.1), "tolerance", -0.1, "a number > 0 and < 1"),
    (dict(minibatch=1024, tolerance=1.5), "tolerance", 1.5, "a number > 0 and < 1"),
    (dict(minibatch=1024, max_staleness=1.0), "max_staleness", 1.0, "a finite number > 1"),
])
def test_bad_targets_raise_clear_errors(kwargs, field, value, allowed):
    with raises_invalid(field, value, allowed):
        sp_lib.make_target(**kwargs)


def test_bad_spaces_raise_clear_errors():
    net, m = zoo.get("resnet8"), mc.get("abci")
    with raises_invalid("max_gpus_per_node", 5, "1..4"):
        sp_lib.make_space(net, m, max_gpus_per_node=5)
    with raises_invalid("max_nodes", 0, "an integer >= 1"):
        sp_lib.make_space(net, m, max_nodes=0)
    with raises_invalid("algorithm", "star", "one of ring, tree, rabenseifner"):
        sp_lib.make_space(net, m, algorithm="star")
    with raises_invalid("max_sub_batch", 4, "an integer >= min_sub_batch=8"):
        sp_lib.make_space(net, m, min_sub_batch=8, max_sub_batch=4)
    with raises_invalid("max_low_fraction", 1.5, "<= 1"):
        sp_lib.make_space(net, m, precision=sp_lib.Precision(max_low_fraction=1.5))
