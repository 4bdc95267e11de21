"""Tests of jaxsprint.calibration.model_fit: recovery of known figures from synthetic timings made by the model
itself with noise, the robust loss, the models of a step and an all-reduce, jitter, the held-out protocols and
errors."""
import dataclasses
import math

import numpy as np
import pytest

from jaxsprint.calibration import model_fit
from jaxsprint.perf import machines as mc
from jaxsprint.perf import networks as nw
from jaxsprint.perf import times, zoo
from perf_util import raises_invalid

TRUE = dict(efficiency_fwd=0.7, efficiency_bwd_weight=0.45, half_efficiency_rows=200.0,
            network_latency_s=30e-6, network_bandwidth_bytes_per_s=2e9, updater_overhead_s=3e-4)
FIELDS = list(TRUE)


def _synthetic(noise: float, seed: int = 0):
    true = mc.with_figures(mc.get("cpu"), efficiency_bwd_data=TRUE["efficiency_fwd"], **TRUE)
    # Small images and dense layers give small GEMM row counts at small batches, which is what
    # separates the saturated efficiencies from the half-efficiency sizes.
    nets = [nw.from_spec([("conv", 16, 3), ("relu",), ("conv", 32, 3), ("relu",), ("gap",),
                          ("dense", 10)], (16, 16, 3), name="a"),
            nw.from_spec([("conv", 64, 3), ("relu",), ("conv", 128, 3), ("relu",), ("gap",),
                          ("dense", 256), ("dense", 10)], (4, 4, 3), name="b")]
    steps = [model_fit.StepTiming(n, b, 1.0, 5.0) for n in nets for b in (1, 4, 16, 64, 256)]
    ars = [model_fit.AllreduceTiming(m, r, 1.0) for m in (4e3, 1e5, 1e6, 1.6e7) for r in (2, 3, 4)]
    ps, pa = model_fit.predict_timings(true, steps, ars)
    rng = np.random.default_rng(seed)
    steps = [dataclasses.replace(s, measured_s=float(t * math.exp(rng.normal(0, noise))))
             for s, t in zip(steps, ps)]
    ars = [dataclasses.replace(a, measured_s=float(t * math.exp(rng.normal(0, noise))))
           for a, t in zip(ars, pa)]
    return true, steps, ars


def test_fit_recovers_known_figures_from_noisy_synthetic_timings():
    true, steps, ars = _synthetic(noise=0.01)
    res = model_fit.fit(mc.get("cpu"), steps, ars, fields=FIELDS,
                        tied={"efficiency_bwd_data": "efficiency_fwd"}, starts=3)
    for f, v in TRUE.items():
        assert res.fitted[f] == pytest.approx(v, rel=0.06), f
        assert 0 < res.rel_std_error[f] < 0.1, f
        # The estimate is within a few standard errors of the truth.
        assert abs(math.log(res.fitted[f] / v)) < 5 * res.rel_std_error[f] + 0.01, f
    assert res.fitted["efficiency_bwd_data"] == res.fitted["efficiency_fwd"]
    assert float(res.machine.efficiency_bwd_data) == pytest.approx(res.fitted["efficiency_fwd"])
    assert np.median(np.abs(res.step_errors)) < 0.02 and np.median(np.abs(res.allreduce_errors)) < 0.02
    assert not res.at_bound
    summary = res.summary()
    assert set(summary) >= {"fitted", "rel_std_error", "steps", "allreduces", "loss"}
    assert "efficiency_fwd" in res.table()


def test_bounds_hold():
    _, _, ars = _synthetic(noise=0.0)
    res = model_fit.fit(mc.get("cpu"), allreduces=ars, fields=["updater_overhead_s", "network_latency_s"],
                        bounds={"updater_overhead_s": (1e-4, 2e-4)}, starts=2)
    assert 1e-4 <= res.fitted["updater_overhead_s"] <= 2e-4
    assert res.at_bound == ["updater_overhead_s"]  # the truth (3e-4) lies outside


def test_step_and_allreduce_models():
    m = mc.get("cpu")
    net = zoo.get("resnet8")
    t = float(model_fit.step_time_s(net, m, 16.0, 5.0))
    expect = float(times.device_step_time_s(net, m, 16.0)) + 5 * 4 * float(net.total_params) / float(
        m.memory_bandwidth_bytes_per_s)
    assert t == pytest.approx(expect, rel=1e-6)
    one = float(model_fit.allreduce_time_s(m, 1e6, 1.0))
    assert one == pytest.approx(float(m.updater_overhead_s), rel=1e-6)
    four = float(model_fit.allreduce_time_s(m, 1e6, 4.0))
    ring = 6 * float(m.network_latency_s) + 1.5 * 1e6 / float(m.network_bandwidth_bytes_per_s)
    assert four == pytest.approx(ring + float(m.updater_overhead_s), rel=1e-5)


def test_estimate_cv_of_gamma_samples():
    rng = np.random.default_rng(0)
    samples = [rng.gamma(1 / 0.05 ** 2, 0.05 ** 2 * s, 400) for s in (0.01, 0.1, 1.0)]
    # For a near-normal law the robust cv is the cv.
    assert model_fit.estimate_cv(samples) == pytest.approx(0.05, rel=0.15)
    with raises_invalid("samples", [1], "at least one configuration with 3 or more samples"):
        model_fit.estimate_cv([[1.0]])


def test_fit_input_errors():
    _, steps, ars = _synthetic(noise=0.0)
    m = mc.get("cpu")
    with raises_invalid("timings", 0, "at least one step or all-reduce timing"):
        model_fit.fit(m, fields=["efficiency_fwd"])
    with raises_invalid("field", "speed", "a machine figure: one of peak_flops_per_s"):
        model_fit.fit(m, steps, fields=["speed"])
    with raises_invalid("measured_s", -1.0, "a finite time > 0"):
        model_fit.fit(m, [dataclasses.replace(steps[0], measured_s=-1.0)], fields=["efficiency_fwd"])
    with raises_invalid("bounds['efficiency_fwd']", (0.5, 0.1), "0 < lo < hi"):
        model_fit.fit(m, steps, fields=["efficiency_fwd"], bounds={"efficiency_fwd": (0.5, 0.1)})
    with raises_invalid("fields", FIELDS, "at most as many fields as timings (2)"):
        model_fit.fit(m, steps[:2], fields=FIELDS)
    with raises_invalid("loss", "huber", "one of squared, soft_l1"):
        model_fit.fit(m, steps, fields=["efficiency_fwd"], loss="huber")
    with raises_invalid("holdout_fraction", 1.0, "a number >= 0 and < 1"):
        model_fit.holdout_split(10, 1.0)


def test_fit_recovers_a_small_batch_factor():
    true = mc.with_figures(mc.get("cpu"), half_efficiency_batch=3.0, efficiency_fwd=0.6, efficiency_bwd_data=0.6)
    nets = [zoo.get("resnet8"), zoo.get("resnet20")]
    steps = [model_fit.StepTiming(n, b, 1.0, 5.0) for n in nets for b in (2, 4, 8, 16, 64)]
    ps, _ = model_fit.predict_timings(true, steps)
    steps = [dataclasses.replace(s, measured_s=float(t)) for s, t in zip(steps, ps)]
    res = model_fit.fit(mc.get("cpu"), steps, fields=["efficiency_fwd", "half_efficiency_batch"],
                        tied={"efficiency_bwd_data": "efficiency_fwd"}, starts=3)
    assert res.fitted["half_efficiency_batch"] == pytest.approx(3.0, rel=0.03)
    assert res.fitted["efficiency_fwd"] == pytest.approx(0.6, rel=0.03)


def test_conv_efficiencies_may_exceed_one_other_efficiencies_may_not():
    """A fast convolution algorithm (Winograd) beats the direct multiply-accumulate count at peak: the fit must
    be able to say so for the convolution passes, and only for them."""
    bounds = model_fit.default_bounds(mc.get("cpu"), ["efficiency_fwd", "efficiency_bwd_data",
                                                      "efficiency_bwd_weight", "norm_memory_efficiency"])
    assert bounds["efficiency_fwd"][1] > 2.25 and bounds["efficiency_bwd_weight"][1] > 2.25
    assert bounds["norm_memory_efficiency"] == (1e-3, 1.0)
    true = mc.with_figures(mc.get("cpu"), efficiency_fwd=2.0, efficiency_bwd_data=2.0)
    nets = [zoo.get("resnet8"), zoo.get("resnet20")]
    steps = [model_fit.StepTiming(n, b, 1.0, 5.0) for n in nets for b in (4, 16, 64)]
    ps, _ = model_fit.predict_timings(true, steps)
    steps = [dataclasses.replace(s, measured_s=float(t)) for s, t in zip(steps, ps)]
    res = model_fit.fit(mc.get("cpu"), steps, fields=["efficiency_fwd"],
                        tied={"efficiency_bwd_data": "efficiency_fwd"}, starts=2)
    assert res.fitted["efficiency_fwd"] == pytest.approx(2.0, rel=0.03)
    assert not res.at_bound


def test_robust_loss_resists_an_outlier_and_equals_squared_without_one():
    true = mc.with_figures(mc.get("cpu"), efficiency_fwd=0.6, efficiency_bwd_data=0.6)
    net = zoo.get("resnet8")
    steps = [model_fit.StepTiming(net, b, 1.0, 5.0) for b in (4, 8, 16, 32, 64, 128)]
    ps, _ = model_fit.predict_timings(true, steps)
    clean = [dataclasses.replace(s, measured_s=float(t)) for s, t in zip(steps, ps)]
    dirty = list(clean)
    dirty[3] = dataclasses.replace(dirty[3], measured_s=3.0 * dirty[3].measured_s)  # one run 3x slow
    kw = dict(fields=["efficiency_fwd"], tied={"efficiency_bwd_data": "efficiency_fwd"}, starts=1)
    squared = model_fit.fit(mc.get("cpu"), dirty, **kw).fitted["efficiency_fwd"]
    robust = model_fit.fit(mc.get("cpu"), dirty, loss="soft_l1", loss_scale=0.05, **kw).fitted["efficiency_fwd"]
    assert abs(math.log(robust / 0.6)) < 0.5 * abs(math.log(squared / 0.6))
    exact = model_fit.fit(mc.get("cpu"), clean, loss="soft_l1", **kw)
    assert exact.fitted["efficiency_fwd"] == pytest.approx(0.6, rel=0.02)


def test_holdout_split_is_a_seeded_permutation():
    held = model_fit.holdout_split(40, 0.5, seed=1)
    assert held.sum() == 20
    order = np.random.default_rng(1).permutation(40)
    assert set(np.nonzero(held)[0]) == set(order[20:].tolist())
    np.testing.assert_array_equal(held, model_fit.holdout_split(40, 0.5, seed=1))
    assert model_fit.holdout_split(7, 0.0).sum() == 0


def test_leave_one_group_out_predicts_unseen_networks():
    true = mc.with_figures(mc.get("cpu"), efficiency_fwd=0.7, efficiency_bwd_data=0.7)
    nets = {"resnet8": zoo.get("resnet8"), "resnet20": zoo.get("resnet20")}
    steps = [model_fit.StepTiming(n, b, 1.0, 5.0, f"{k} b{b}") for k, n in nets.items() for b in (4, 16, 64)]
    ps, _ = model_fit.predict_timings(true, steps)
    steps = [dataclasses.replace(s, measured_s=float(t)) for s, t in zip(steps, ps)]
    groups = [s.label.split()[0] for s in steps]
    errors = model_fit.leave_one_group_out(mc.get("cpu"), steps, groups, fields=["efficiency_fwd"],
                                           tied={"efficiency_bwd_data": "efficiency_fwd"}, starts=1)
    assert list(errors) == list(nets) and all(e.shape == (3,) for e in errors.values())
    assert np.max(np.abs(np.concatenate(list(errors.values())))) < 0.01  # data made by the model itself
    stats = model_fit.error_stats(np.concatenate(list(errors.values())))
    assert stats["n"] == 6 and stats["max_abs_error"] < 0.01
    assert model_fit.error_stats([]) is None
