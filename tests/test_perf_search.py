"""Tests of jaxsprint.perf.search: gradient search vs grid vs brute force, constraints, the
precision option, sensitivities vs finite differences, and errors.

The spaces are small (a few thousand configurations) so that the grid and a numpy brute force
can check the gradient search exactly; they share one compilation per space structure.
"""
import itertools
import math

import numpy as np
import pytest

from jaxsprint.perf import machines as mc
from jaxsprint.perf import networks as nw
from jaxsprint.perf import search
from jaxsprint.perf import sprint


@pytest.fixture(scope="module")
def space():
    # 16 nodes x 4 learners x sub-batch 1..64 = 4,096 configurations of ResNet-8 on ABCI.
    return search.make_space(nw.get("resnet8"), mc.get("abci"), max_nodes=16, max_sub_batch=64)


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
    target = search.make_target(target_minibatch, 0.05)
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


def test_evaluate_is_the_sprint_model(space):
    target = search.make_target(500)
    c = search.evaluate_configs(space, target, [(3, 2, 17)])[0]
    p = sprint.predict(space.network, space.machine, 3.0, 2.0, 17.0)
    assert c.epoch_time_s == pytest.approx(float(p.epoch_time_s), rel=1e-6)
    assert c.mean_minibatch == pytest.approx(float(p.mean_minibatch), rel=1e-6)
    assert c.mean_staleness == pytest.approx(float(p.mean_staleness), rel=1e-6)
    assert c.memory_bytes == pytest.approx(float(sprint.memory_bytes(space.network, 17)), rel=1e-6)
    # Little's law holds for every candidate the search reports.
    assert (c.mean_staleness - 1) * c.mean_minibatch == pytest.approx(3 * 2 * 17, rel=1e-4)


@pytest.mark.parametrize("target_minibatch, max_staleness", [(300, 3.5), (500, 3.0)])
def test_constraints_hold_in_the_result(target_minibatch, max_staleness):
    # A machine with little memory (sub-batch <= 39 of 64), and a staleness limit, both binding:
    # without them the optimum of 300 is 11 x 2 x 39 (mean staleness 3.74).
    m = mc.with_figures(mc.get("abci"), device_memory_bytes=4.5e7)
    net = nw.get("resnet8")
    sp = search.make_space(net, m, max_nodes=16, max_sub_batch=64)
    assert sprint.max_sub_batch(net, m) == 39
    target = search.make_target(target_minibatch, 0.05, max_staleness=max_staleness)
    res = search.gradient_search(sp, target, starts=16)
    brute, _ = _brute_force(sp, target)
    assert res.feasible and brute is not None
    assert res.best.epoch_time_s <= brute.epoch_time_s * (1 + 1e-6)
    free, _ = _brute_force(sp, search.make_target(target_minibatch, 0.05))
    assert free.mean_staleness > max_staleness  # the limit binds
    for c in [res.best] + res.runner_ups:
        assert abs(c.mean_minibatch / target_minibatch - 1) <= 0.05
        assert c.mean_staleness <= max_staleness
        assert c.memory_bytes <= float(m.device_memory_bytes)
        assert c.sub_batch <= 39
        assert 1 <= c.nodes <= 16 and 1 <= c.gpus_per_node <= 4


def test_no_configuration_meets_the_target_is_an_answer(space):
    target = search.make_target(1600)  # beyond 16 nodes x 4 learners (the most is about 1,260)
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
    prec = search.Precision(low_peak_factor=4.0, max_low_fraction=0.4)
    return search.make_space(net, mc.get("abci"), max_nodes=6, max_sub_batch=24, precision=prec)


@pytest.mark.parametrize("target_minibatch", [20, 100, 300])
def test_precision_space_matches_the_grid(precision_space, target_minibatch):
    sp, net = precision_space, precision_space.network
    assert sp.num_precision == len(net.layer_names) == 5
    assert sp.size == 6 * 4 * 24 * 2 ** 5
    target = search.make_target(target_minibatch, 0.05)
    grid = search.grid_search(sp, target)
    res = search.gradient_search(sp, target, starts=16)
    assert grid.best is not None and res.feasible
    assert res.best.epoch_time_s <= grid.best.epoch_time_s * 1.01
    # The budget on the low-precision share of forward FLOPs holds.
    w = np.asarray(net.count * net.fwd_flops)
    share = float(np.dot(w, res.best.low_precision) / w.sum())
    assert share <= 0.4 + 1e-6 and share == pytest.approx(res.best.low_fraction, abs=1e-5)


def test_precision_model(precision_space):
    # Low precision never makes the compute slower, and all-fp32 is the plain model.
    sp, net = precision_space, precision_space.network
    target = search.make_target(150)
    fp32 = search.evaluate_configs(sp, target, [(2, 2, 8) + (0,) * sp.num_precision])[0]
    low = search.evaluate_configs(sp, target, [(2, 2, 8) + (1,) * sp.num_precision])[0]
    p = sprint.predict(net, sp.machine, 2.0, 2.0, 8.0)
    assert fp32.t_compute_s == pytest.approx(float(p.t_compute_s), rel=1e-6)
    assert low.t_compute_s < fp32.t_compute_s and low.t_update_s < fp32.t_update_s
    assert low.memory_bytes < fp32.memory_bytes


def test_precision_space_too_large_for_the_grid():
    sp = search.make_space(nw.get("resnet50"), mc.get("dgx_h100"), max_nodes=64,
                           precision=search.Precision())
    assert sp.size > 2 ** 60
    with pytest.raises(search.SearchError, match="grid has"):
        search.grid_search(sp, search.make_target(4096))


def test_sensitivities_signs_and_finite_differences():
    sp = search.make_space(nw.get("resnet8"), mc.get("tsubame_kfc_dl"))
    fields = ["peak_flops_per_s", "network_bandwidth_bytes_per_s", "network_latency_s",
              "host_memory_bandwidth_bytes_per_s", "efficiency_fwd"]
    n, g, b = 16, 8, 32
    rows = {r.field: r for r in search.sensitivities(sp, n, g, b, fields)}
    # Signs: faster compute shortens the epoch at a fixed configuration; the network cannot
    # (epoch = N_file T_c / (N b)), but it does at a fixed mini-batch (epoch = N_file T_u / E[B]).
    assert rows["peak_flops_per_s"].fixed_config < -0.1
    assert rows["efficiency_fwd"].fixed_config < 0
    assert abs(rows["network_bandwidth_bytes_per_s"].fixed_config) < 1e-6
    assert rows["network_bandwidth_bytes_per_s"].at_minibatch < -0.01
    assert rows["network_latency_s"].at_minibatch > 0
    assert rows["host_memory_bandwidth_bytes_per_s"].at_minibatch < -0.1
    assert abs(rows["peak_flops_per_s"].at_minibatch) < abs(rows["peak_flops_per_s"].fixed_config)
    # Central finite differences of the model in log space.
    h = 1e-2

    def epoch(machine, nodes):
        return float(sprint.predict(sp.network, machine, nodes, g, b).epoch_time_s)

    def minibatch(machine, nodes):
        return float(sprint.predict(sp.network, machine, nodes, g, b).mean_minibatch)

    m0 = sp.machine
    for f in fields:
        v = float(getattr(m0, f))
        up, dn = mc.with_figures(m0, **{f: v * math.exp(h)}), mc.with_figures(m0, **{f: v * math.exp(-h)})
        fd = (math.log(epoch(up, n)) - math.log(epoch(dn, n))) / (2 * h)
        assert rows[f].fixed_config == pytest.approx(fd, rel=2e-2, abs=2e-3), f
        # Mini-batch kept: move n (continuous) so that E[B] is unchanged (B is linear in n up to
        # the slow growth of T_u, so one secant step per side is exact enough).
        target_b = minibatch(m0, n)

        def n_at(machine):
            nn = float(n)
            for _ in range(6):
                nn *= target_b / minibatch(machine, nn)
            return nn

        fd_at = (math.log(epoch(up, n_at(up))) - math.log(epoch(dn, n_at(dn)))) / (2 * h)
        assert rows[f].at_minibatch == pytest.approx(fd_at, rel=3e-2, abs=2e-3), f
    # The 2x columns are exact recomputations.
    r = rows["peak_flops_per_s"]
    two = mc.with_figures(m0, peak_flops_per_s=2 * float(m0.peak_flops_per_s))
    assert r.double_fixed == pytest.approx(epoch(two, n) / epoch(m0, n) - 1, rel=1e-3)
    assert "peak_flops_per_s" in search.sensitivity_table(list(rows.values()))


@pytest.mark.parametrize("kwargs, text", [
    (dict(minibatch=0), "target_minibatch=0 is infeasible"),
    (dict(minibatch=-5), "target_minibatch=-5 is infeasible"),
    (dict(minibatch=float("nan")), "target_minibatch=nan"),
    (dict(minibatch=1024, tolerance=0), "tolerance=0"),
    (dict(minibatch=1024, tolerance=-0.1), "tolerance=-0.1"),
    (dict(minibatch=1024, tolerance=1.5), "tolerance=1.5"),
    (dict(minibatch=1024, max_staleness=1.0), "max_staleness=1.0 is infeasible"),
])
def test_bad_targets_raise_clear_errors(kwargs, text):
    with pytest.raises(search.SearchError, match=text.replace("(", r"\(").replace(")", r"\)")):
        search.make_target(**kwargs)


def test_bad_spaces_raise_clear_errors():
    net, m = nw.get("resnet8"), mc.get("abci")
    with pytest.raises(search.SearchError, match="max_gpus_per_node=5 is not allowed.*1..4"):
        search.make_space(net, m, max_gpus_per_node=5)
    with pytest.raises(search.SearchError, match="max_nodes=0"):
        search.make_space(net, m, max_nodes=0)
    with pytest.raises(search.SearchError, match="algorithm='star' is unknown"):
        search.make_space(net, m, algorithm="star")
    with pytest.raises(search.SearchError, match="max_sub_batch=4 is below min_sub_batch=8"):
        search.make_space(net, m, min_sub_batch=8, max_sub_batch=4)
    with pytest.raises(search.SearchError, match="max_low_fraction"):
        search.make_space(net, m, precision=search.Precision(max_low_fraction=1.5))
    with pytest.raises(search.SearchError, match="field='speed' is unknown"):
        search.sensitivities(search.make_space(net, m), 1, 1, 8, ["speed"])
