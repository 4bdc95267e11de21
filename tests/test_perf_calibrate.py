"""Tests of jaxsprint.perf.calibrate: recovery of known figures from synthetic timings made by
the model itself with noise, the models of a step and an all-reduce, jitter, presets and errors."""
import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from jaxsprint.perf import calibrate
from jaxsprint.perf import machines as mc
from jaxsprint.perf import networks as nw
from jaxsprint.perf import sprint

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
    steps = [calibrate.StepTiming(n, b, 1.0, 5.0) for n in nets for b in (1, 4, 16, 64, 256)]
    ars = [calibrate.AllreduceTiming(m, r, 1.0) for m in (4e3, 1e5, 1e6, 1.6e7) for r in (2, 3, 4)]
    ps, pa = calibrate.predict_timings(true, steps, ars)
    rng = np.random.default_rng(seed)
    steps = [dataclasses.replace(s, measured_s=float(t * math.exp(rng.normal(0, noise))))
             for s, t in zip(steps, ps)]
    ars = [dataclasses.replace(a, measured_s=float(t * math.exp(rng.normal(0, noise))))
           for a, t in zip(ars, pa)]
    return true, steps, ars


def test_fit_recovers_known_figures_from_noisy_synthetic_timings():
    true, steps, ars = _synthetic(noise=0.01)
    res = calibrate.fit(mc.get("cpu"), steps, ars, fields=FIELDS,
                        tied={"efficiency_bwd_data": "efficiency_fwd"}, starts=3, num_steps=1500)
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
    res = calibrate.fit(mc.get("cpu"), allreduces=ars, fields=["updater_overhead_s", "network_latency_s"],
                        bounds={"updater_overhead_s": (1e-4, 2e-4)}, starts=2, num_steps=600)
    assert 1e-4 <= res.fitted["updater_overhead_s"] <= 2e-4
    assert res.at_bound == ["updater_overhead_s"]  # the truth (3e-4) lies outside


def test_step_and_allreduce_models():
    m = mc.get("cpu")
    net = nw.get("resnet8")
    t = float(calibrate.step_time_s(net, m, 16.0, 5.0))
    expect = float(sprint.device_step_time_s(net, m, 16.0)) + 5 * 4 * float(net.total_params) / float(
        m.memory_bandwidth_bytes_per_s)
    assert t == pytest.approx(expect, rel=1e-6)
    one = float(calibrate.allreduce_time_s(m, 1e6, 1.0))
    assert one == pytest.approx(float(m.updater_overhead_s), rel=1e-6)
    four = float(calibrate.allreduce_time_s(m, 1e6, 4.0))
    ring = 6 * float(m.network_latency_s) + 1.5 * 1e6 / float(m.network_bandwidth_bytes_per_s)
    assert four == pytest.approx(ring + float(m.updater_overhead_s), rel=1e-5)


def test_estimate_cv_of_gamma_samples():
    rng = np.random.default_rng(0)
    samples = [rng.gamma(1 / 0.05 ** 2, 0.05 ** 2 * s, 400) for s in (0.01, 0.1, 1.0)]
    # For a near-normal law the robust cv is the cv.
    assert calibrate.estimate_cv(samples) == pytest.approx(0.05, rel=0.15)
    with pytest.raises(calibrate.CalibrationError, match="at least one configuration"):
        calibrate.estimate_cv([[1.0]])


def test_preset_roundtrip_and_errors(tmp_path):
    m = mc.with_figures(mc.get("cpu"), network_latency_s=7e-5)
    path = tmp_path / "sub" / "machine.json"
    calibrate.save_preset(str(path), m, compute_cv=0.03, measurements={"steps": []})
    back, data = calibrate.load_preset(str(path))
    for f in mc._FIELDS:
        assert float(getattr(back, f)) == pytest.approx(float(getattr(m, f)), rel=1e-6)
    assert back.name == "cpu" and data["compute_cv"] == 0.03
    with pytest.raises(calibrate.CalibrationError, match="machine_file=.*does not exist"):
        calibrate.load_preset(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(calibrate.CalibrationError, match="is not a machine preset"):
        calibrate.load_preset(str(bad))
    data["figures"]["peak_flops_per_s"] = -1.0
    bad.write_text(json.dumps(data))
    with pytest.raises(calibrate.CalibrationError, match="peak_flops_per_s"):
        calibrate.load_preset(str(bad))


def test_fit_input_errors():
    _, steps, ars = _synthetic(noise=0.0)
    m = mc.get("cpu")
    with pytest.raises(calibrate.CalibrationError, match="no timings"):
        calibrate.fit(m, fields=["efficiency_fwd"])
    with pytest.raises(calibrate.CalibrationError, match="field='speed' is unknown"):
        calibrate.fit(m, steps, fields=["speed"])
    with pytest.raises(calibrate.CalibrationError, match="measured_s=-1.0"):
        calibrate.fit(m, [dataclasses.replace(steps[0], measured_s=-1.0)], fields=["efficiency_fwd"])
    with pytest.raises(calibrate.CalibrationError, match="bounds"):
        calibrate.fit(m, steps, fields=["efficiency_fwd"], bounds={"efficiency_fwd": (0.5, 0.1)})
    with pytest.raises(calibrate.CalibrationError, match="cannot fit 6 fields"):
        calibrate.fit(m, steps[:2], fields=FIELDS)
    with pytest.raises(calibrate.CalibrationError, match="ranks=1"):
        calibrate.measure_allreduce(1, [1024])


def test_small_batch_factor_scales_gemm_passes_exactly_and_is_off_at_zero():
    """``half_efficiency_batch`` h multiplies every conv/dense pass by 1 + (h / b)^g; 0 changes nothing."""
    # Memory so fast that every pass is compute-bound, so the factor shows unblended.
    base = mc.with_figures(mc.get("cpu"), memory_bandwidth_bytes_per_s=1e18, half_efficiency_batch=0.0)
    net = nw.get("resnet8")
    g = float(base.efficiency_sharpness)
    is_gemm = np.isin(np.asarray(net.kind), [nw.KINDS.index(k) for k in ("conv", "dense")])
    for b in (2.0, 8.0, 64.0):
        f0, b0 = sprint.layer_times_s(net, base, b)
        f1, b1 = sprint.layer_times_s(net, mc.with_figures(base, half_efficiency_batch=6.0), b)
        factor = 1.0 + (6.0 / b) ** g
        np.testing.assert_allclose(np.asarray(f1)[is_gemm], factor * np.asarray(f0)[is_gemm], rtol=1e-4)
        np.testing.assert_allclose(np.asarray(b1)[is_gemm], factor * np.asarray(b0)[is_gemm], rtol=1e-4)
        np.testing.assert_allclose(np.asarray(f1)[~is_gemm], np.asarray(f0)[~is_gemm], rtol=1e-6)
    # Off: finite gradients (the search's sensitivities differentiate every figure).
    grad = jax.grad(lambda h: sprint.device_step_time_s(net, mc.with_figures(base, half_efficiency_batch=h), 4.0))(0.0)
    assert np.isfinite(float(grad)) and float(grad) == 0.0


def test_fit_recovers_a_small_batch_factor():
    true = mc.with_figures(mc.get("cpu"), half_efficiency_batch=3.0, efficiency_fwd=0.6, efficiency_bwd_data=0.6)
    nets = [nw.get("resnet8"), nw.get("resnet20")]
    steps = [calibrate.StepTiming(n, b, 1.0, 5.0) for n in nets for b in (2, 4, 8, 16, 64)]
    ps, _ = calibrate.predict_timings(true, steps)
    steps = [dataclasses.replace(s, measured_s=float(t)) for s, t in zip(steps, ps)]
    res = calibrate.fit(mc.get("cpu"), steps, fields=["efficiency_fwd", "half_efficiency_batch"],
                        tied={"efficiency_bwd_data": "efficiency_fwd"}, starts=3, num_steps=1500)
    assert res.fitted["half_efficiency_batch"] == pytest.approx(3.0, rel=0.03)
    assert res.fitted["efficiency_fwd"] == pytest.approx(0.6, rel=0.03)


def test_presets_saved_before_the_small_batch_factor_still_load(tmp_path):
    path = tmp_path / "old.json"
    calibrate.save_preset(str(path), mc.get("cpu"))
    data = json.loads(path.read_text())
    del data["figures"]["half_efficiency_batch"]
    path.write_text(json.dumps(data))
    machine, _ = calibrate.load_preset(str(path))
    assert float(machine.half_efficiency_batch) == 0.0


def test_conv_efficiencies_may_exceed_one_other_efficiencies_may_not():
    """A fast convolution algorithm (Winograd) beats the direct multiply-accumulate count at peak: the fit must
    be able to say so for the convolution passes, and only for them."""
    bounds = calibrate.default_bounds(mc.get("cpu"), ["efficiency_fwd", "efficiency_bwd_data",
                                                      "efficiency_bwd_weight", "norm_memory_efficiency"])
    assert bounds["efficiency_fwd"][1] > 2.25 and bounds["efficiency_bwd_weight"][1] > 2.25
    assert bounds["norm_memory_efficiency"] == (1e-3, 1.0)
    true = mc.with_figures(mc.get("cpu"), efficiency_fwd=2.0, efficiency_bwd_data=2.0)
    nets = [nw.get("resnet8"), nw.get("resnet20")]
    steps = [calibrate.StepTiming(n, b, 1.0, 5.0) for n in nets for b in (4, 16, 64)]
    ps, _ = calibrate.predict_timings(true, steps)
    steps = [dataclasses.replace(s, measured_s=float(t)) for s, t in zip(steps, ps)]
    res = calibrate.fit(mc.get("cpu"), steps, fields=["efficiency_fwd"],
                        tied={"efficiency_bwd_data": "efficiency_fwd"}, starts=2, num_steps=1000)
    assert res.fitted["efficiency_fwd"] == pytest.approx(2.0, rel=0.03)
    assert not res.at_bound
