"""Tests of jaxsprint.perf.search: gradient search vs grid vs brute force, constraints in the result, the
precision space against its grid, no feasible configuration, the grid's size limit and its one compilation.

The spaces are small (a few thousand configurations) so that the grid and a brute force over
evaluate_configs can check the gradient search exactly; each space is built once per module, so that its
compiled functions are reused across targets.
"""
import itertools

import numpy as np
import pytest

from jaxsprint.perf import machines as mc
from jaxsprint.perf import networks as nw
from jaxsprint.perf import search
from jaxsprint.perf import space as sp_lib
from jaxsprint.perf import times, zoo
from perf_util import raises_invalid


@pytest.fixture(scope="module")
def space():
    # 16 nodes x 4 learners x sub-batch 1..64 = 4,096 configurations of ResNet-8 on ABCI.
    return sp_lib.make_space(zoo.get("resnet8"), mc.get("abci"), max_nodes=16, max_sub_batch=64)


def _brute_force(space, target):
    """Every configuration through evaluate_configs, best feasible by a plain Python loop."""
    configs = list(itertools.product(range(1, space.max_nodes + 1),
                                     range(1, space.max_gpus_per_node + 1),
                                     range(space.min_sub_batch, space.max_sub_batch + 1)))
    cands = search.evaluate_configs(space, target, configs)
    feasible = [c for c in cands if c.feasible]
    return (min(feasible, key=lambda c: c.epoch_time_s) if feasible else None), len(feasible)


@pytest.mark.parametrize("target_minibatch", [96, 300, 700, 1200])
def test_gradient_search_finds_the_grid_optimum_and_grid_matches_brute_force(space, target_minibatch):
    target = sp_lib.make_target(target_minibatch, 0.05)
    brute, n_feasible = _brute_force(space, target)
    grid = search.grid_search(space, target)
    grad = search.gradient_search(space, target, starts=16)
    assert brute is not None
    assert grid.best.config == brute.config
    assert grid.feasible_count == n_feasible
    assert grad.feasible
    assert grad.best.epoch_time_s <= brute.epoch_time_s * (1 + 1e-6)  # the optimum itself
    assert grad.evaluations["gradient"] > 0 and grad.evaluations["discrete"] > 0
    assert grid.evaluations == {"grid": space.size}
    assert grad.trajectory.shape[0] == 16 and grad.trajectory.shape[2] == 2


@pytest.fixture(scope="module")
def small_memory_space():
    # A machine with little memory: sub-batch <= 39 of 64.
    m = mc.with_figures(mc.get("abci"), device_memory_bytes=4.5e7)
    return sp_lib.make_space(zoo.get("resnet8"), m, max_nodes=16, max_sub_batch=64)


@pytest.mark.parametrize("target_minibatch, max_staleness", [(300, 3.5), (500, 3.0)])
def test_constraints_hold_in_the_result(small_memory_space, target_minibatch, max_staleness):
    # The memory limit and a staleness limit both bind: without them the optimum of 300 is 11 x 2 x 39
    # (mean staleness 3.74).
    sp = small_memory_space
    net, m = sp.network, sp.machine
    assert times.max_sub_batch(net, m) == 39
    target = sp_lib.make_target(target_minibatch, 0.05, max_staleness=max_staleness)
    res = search.gradient_search(sp, target, starts=16)
    brute, _ = _brute_force(sp, target)
    assert res.feasible and brute is not None
    assert res.best.epoch_time_s <= brute.epoch_time_s * (1 + 1e-6)
    free, _ = _brute_force(sp, sp_lib.make_target(target_minibatch, 0.05))
    assert free.mean_staleness > max_staleness  # the limit binds
    for c in [res.best] + res.runner_ups:
        assert abs(c.mean_minibatch / target_minibatch - 1) <= 0.05
        assert c.mean_staleness <= max_staleness
        assert c.memory_bytes <= float(m.device_memory_bytes)
        assert c.sub_batch <= 39
        assert 1 <= c.nodes <= 16 and 1 <= c.gpus_per_node <= 4


def test_no_configuration_meets_the_target_is_an_answer(space):
    target = sp_lib.make_target(1600)  # beyond 16 nodes x 4 learners (the most is about 1,260)
    res = search.gradient_search(space, target, starts=16)
    assert not res.feasible and res.best is None
    assert res.closest is not None and not res.closest.feasible and res.closest.violation > 0
    grid = search.grid_search(space, target)
    assert grid.best is None and grid.feasible_count == 0 and grid.closest is not None


@pytest.fixture(scope="module")
def precision_space():
    # 5 rows -> 2^5 precision choices x 6 x 4 x 24 = 18,432 configurations.
    net = nw.from_spec([("conv", 16, 3), ("relu",), ("conv", 32, 3), ("gap",), ("dense", 10)],
                       (16, 16, 3))
    prec = sp_lib.Precision(low_peak_factor=4.0, max_low_fraction=0.4)
    return sp_lib.make_space(net, mc.get("abci"), max_nodes=6, max_sub_batch=24, precision=prec)


@pytest.mark.parametrize("target_minibatch", [20, 100, 300])
def test_precision_space_matches_the_grid(precision_space, target_minibatch):
    sp, net = precision_space, precision_space.network
    assert sp.num_precision == len(net.layer_names) == 5
    assert sp.size == 6 * 4 * 24 * 2 ** 5
    target = sp_lib.make_target(target_minibatch, 0.05)
    grid = search.grid_search(sp, target)
    res = search.gradient_search(sp, target, starts=16)
    assert grid.best is not None and res.feasible
    assert res.best.epoch_time_s <= grid.best.epoch_time_s * 1.01
    # The budget on the low-precision share of forward FLOPs holds.
    w = np.asarray(net.count * net.fwd_flops)
    share = float(np.dot(w, res.best.low_precision) / w.sum())
    assert share <= 0.4 + 1e-6 and share == pytest.approx(res.best.low_fraction, abs=1e-5)


def test_precision_space_too_large_for_the_grid():
    sp = sp_lib.make_space(zoo.get("resnet50"), mc.get("dgx_h100"), max_nodes=64,
                           precision=sp_lib.Precision())
    assert sp.size > 2 ** 60
    with raises_invalid("grid size", sp.size, "at most 2147483647 configurations"):
        search.grid_search(sp, sp_lib.make_target(4096))


def test_a_space_traces_its_searches_once_whatever_the_target(monkeypatch):
    # The space keeps its jitted functions and the target is an argument: new targets do not retrace;
    # a new space (even an equal one) does.
    traces = {"grid": 0, "relax": 0}
    score, constraints = search.score, search.constraints

    def counting(kind, fn):
        def wrapped(*args):
            traces[kind] += 1
            return fn(*args)
        return wrapped

    monkeypatch.setattr(search, "score", counting("grid", score))  # called once per trace of the grid
    monkeypatch.setattr(search, "constraints", counting("relax", constraints))
    make = lambda: sp_lib.make_space(zoo.get("resnet8"), mc.get("abci"), max_nodes=4, max_sub_batch=16)  # noqa: E731
    sp = make()
    for t in (20, 40, 80):
        search.grid_search(sp, sp_lib.make_target(t))
        search.gradient_search(sp, sp_lib.make_target(t), starts=2, outer=2, inner=5, max_refine_steps=2)
    grid_traces, relax_traces = traces["grid"], traces["relax"]
    assert grid_traces == 1 and relax_traces > 0
    search.grid_search(sp, sp_lib.make_target(30))
    assert traces == {"grid": grid_traces, "relax": relax_traces}
    search.grid_search(make(), sp_lib.make_target(30))
    assert traces["grid"] == 2 * grid_traces


def test_result_as_dict_is_json_ready(space):
    import json

    res = search.gradient_search(space, sp_lib.make_target(300), starts=16)  # the compiled size
    out = json.loads(json.dumps(res.as_dict()))
    assert out["feasible"] and out["best"]["nodes"] == res.best.nodes
    assert out["total_evaluations"] == sum(out["evaluations"].values()) and out["space_size"] == 4096


