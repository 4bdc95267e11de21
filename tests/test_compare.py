"""Tests of jaxsprint.calibration.compare: TV, errors, predictions from timings (against simulated logs), specs."""
import json
import math

import numpy as np
import pytest

from jaxsprint.errors import ConfigError
from jaxsprint.perf import machines, zoo
from jaxsprint.calibration import compare, host
from jaxsprint.runtime import events


def test_tv_distance():
    assert compare.tv_distance({1: 0.5, 2: 0.5}, {1: 0.5, 2: 0.5}) == 0.0
    assert compare.tv_distance({1: 1.0}, {2: 1.0}) == 1.0
    assert compare.tv_distance({"1": 0.25, "2": 0.75}, {1: 0.5, 3: 0.5}) == pytest.approx(0.75)
    assert compare.tv_distance({1: 2.0, 2: 2.0}, {1: 0.5, 2: 0.5}) == 0.0  # normalised first
    assert math.isnan(compare.tv_distance({}, {1: 1.0}))


def test_compare_gives_signed_relative_errors_and_tvs():
    measured = dict(epoch_time_s=10.0, mean_minibatch=40.0, mean_staleness=2.0, minibatch_pmf={32: 0.5, 48: 0.5},
                    staleness_pmf={1: 0.5, 2: 0.5})
    predicted = dict(epoch_time_s=11.0, mean_minibatch=36.0, mean_staleness=2.0, minibatch_pmf={32: 1.0},
                     staleness_pmf={"1": 0.5, "2": 0.5})
    e = compare.compare(measured, predicted)
    assert set(e) == set(compare.ERROR_KEYS)
    assert e["epoch_time_rel_error"] == pytest.approx(0.1)
    assert e["mean_minibatch_rel_error"] == pytest.approx(-0.1)
    assert e["mean_staleness_rel_error"] == 0.0
    assert e["minibatch_tv"] == pytest.approx(0.5) and e["staleness_tv"] == 0.0


def test_tv_floor_is_the_sampling_noise_of_a_finite_run():
    assert compare.tv_floor({5: 1.0}, 100) == 0.0  # a point mass is measured exactly
    assert math.isnan(compare.tv_floor({}, 100)) and math.isnan(compare.tv_floor({1: 1.0}, 0))
    k = np.arange(-40, 41)
    sigma = 6.0
    p = np.exp(-0.5 * (k / sigma) ** 2)
    pmf = dict(zip(k.tolist(), (p / p.sum()).tolist()))
    f = compare.tv_floor(pmf, 600)
    assert f == pytest.approx(0.89 * math.sqrt(sigma / 600), rel=0.08)  # the docstring's large-n law
    assert compare.tv_floor(pmf, 2400) / f == pytest.approx(0.5, rel=0.08)  # 1/sqrt(n)
    assert compare.tv_floor(pmf, 600) == f  # seeded
    # compare() reports the floors of the prediction over the run's updates and gradients
    e = compare.compare(dict(epoch_time_s=1.0, mean_minibatch=1.0, mean_staleness=1.0, minibatch_pmf=pmf,
                             staleness_pmf={0: 1.0}, updates=600, gradients=10),
                        dict(epoch_time_s=1.0, mean_minibatch=1.0, mean_staleness=1.0, minibatch_pmf=pmf,
                             staleness_pmf={0: 1.0}))
    assert e["minibatch_tv_floor"] == f and e["staleness_tv_floor"] == 0.0


def test_predict_is_the_model():
    p = compare.predict(4, 0.02, 0.035, 0.3, sub_batch=32, dataset_size=1500)
    assert p["epoch_time_s"] == pytest.approx(1500 * 0.02 / (4 * 32))
    assert p["mean_minibatch"] == pytest.approx(32 * 4 * 0.035 / 0.02, rel=1e-5)
    assert p["mean_staleness"] == pytest.approx(0.02 / 0.035 + 1, rel=1e-5)
    for key, scale in (("minibatch_pmf", 32), ("count_pmf", 1), ("staleness_pmf", 1)):
        assert sum(p[key].values()) == pytest.approx(1.0)
        assert all(isinstance(k, int) and k % scale == 0 for k in p[key])
    # Little's law: (E[S] - 1) E[B] = N N_sub.
    assert (p["mean_staleness"] - 1) * p["mean_minibatch"] == pytest.approx(4 * 32, rel=1e-4)


def test_predict_refuses_bad_timings():
    with pytest.raises(ConfigError, match="invalid t_update="):
        compare.predict(2, 0.01, 0.0, sub_batch=8, dataset_size=100)
    stats = events.statistics(events.simulate_log(1, 1.0, 0.5, duration_s=0.4))  # no complete update cycle
    with pytest.raises(ConfigError, match="run is too short"):
        compare.predict_from_timings(stats)


@pytest.mark.parametrize("n,tu,cv,ucv", [(4, 0.37, 0.3, 0.0), (3, 1.7, 0.2, 0.0), (4, 0.37, 0.3, 0.5)])
def test_predictions_from_timings_of_simulated_runs_are_near_exact(n, tu, cv, ucv):
    ev = events.simulate_log(n, 1.0, tu, cv, ucv, duration_s=20_000 * max(tu, 1.0 / n), warmup_s=5.0, sub_batch=8,
                             dataset_size=5000, seed=4)
    stats = events.statistics(ev)
    e = compare.compare(stats, compare.predict_from_timings(stats))
    assert abs(e["epoch_time_rel_error"]) < 0.02
    assert abs(e["mean_minibatch_rel_error"]) < 0.02
    assert abs(e["mean_staleness_rel_error"]) < 0.02
    assert e["minibatch_tv"] < 0.03 and e["staleness_tv"] < 0.03


def test_updater_jitter_matters_when_the_model_has_it():
    ev = events.simulate_log(4, 1.0, 0.37, 0.3, 0.5, duration_s=5000.0, warmup_s=5.0, sub_batch=8, seed=5)
    stats = events.statistics(ev)
    with_jitter = compare.compare(stats, compare.predict_from_timings(stats))
    without = compare.compare(stats, compare.predict_from_timings(stats, use_update_cv=False))
    assert with_jitter["minibatch_tv"] < without["minibatch_tv"] / 2


class _Sprint(dict):
    __getattr__ = dict.__getitem__


def test_predict_from_specs_uses_the_spec_times():
    network = zoo.resnet_cifar(1)
    machine = machines.get("cpu_runtime")
    host_figures = host.load_host(machine, "cpu_runtime")
    config = _Sprint(sprint=_Sprint(learners_per_host=None, sub_batch=32, network_time_s=0.02))
    p = compare.predict_from_specs(machine, host_figures, network, config, num_hosts=2, learners_per_host=3,
                                   dataset_size=1500)
    tc, tu, cv, ucv = compare.spec_times(network, machine, host_figures, learners_per_host=3, num_hosts=2, sub_batch=32,
                                         network_time_s=0.02)
    assert (p["t_compute_s"], p["t_update_s"], p["t_compute_cv"], p["t_update_cv"]) == (tc, tu, cv, ucv)
    assert tu > 0.02  # the emulated network time is part of the updater cycle
    assert p["epoch_time_s"] == pytest.approx(1500 * tc / (6 * 32), rel=1e-6)
    with pytest.raises(ConfigError, match="invalid learners_per_host=None"):
        compare.predict_from_specs(machine, host_figures, network, config, dataset_size=1500)


def test_spec_cycles_are_the_spec_times_of_every_entry_in_one_call():
    """The batched form gives each configuration's spec_times (hosts, learners, sub-batch, network, placement;
    no placement: shared)."""
    from jaxsprint.calibration.grids import Entry

    network = zoo.resnet_cifar(1)
    machine = machines.get("cpu_runtime")
    figures = host.load_host(machine, "cpu_runtime")
    entries = [Entry("a", 1, 1, 8, 0, "own"), Entry("b", 2, 4, 64, 20, "shared"), Entry("c", 2, 1, 128, 100, None)]
    got = compare.spec_cycles(network, machine, figures, entries)
    for e, (tc, tu) in zip(entries, got):
        want = compare.spec_times(network, machine, figures, learners_per_host=e.learners_per_host, num_hosts=e.hosts,
                                  sub_batch=e.sub_batch, network_time_s=e.network_ms / 1e3,
                                  updater_device=e.updater_device or "shared")[:2]
        assert (tc, tu) == pytest.approx(want, rel=1e-6)
    assert got[0] != got[1] and compare.spec_cycles(network, machine, figures, []) == []


def test_report_is_json_with_string_keys_and_no_nan():
    stats = events.statistics(events.simulate_log(2, 0.01, 0.02, 0.3, duration_s=5.0, warmup_s=0.5, sub_batch=4))
    pred = compare.predict_from_timings(stats)
    out = compare.report(stats, {"timings": pred, "specs": None})
    text = json.dumps(out, allow_nan=False)
    back = json.loads(text)
    assert back["predicted_from_specs"] is None and back["errors_from_specs"] is None
    for part in ("measured", "predicted_from_timings"):
        for key in compare.REPORT_KEYS:
            assert key in back[part]
        assert all(isinstance(k, str) for k in back[part]["minibatch_pmf"])
        assert sum(back[part]["staleness_pmf"].values()) == pytest.approx(1.0)
    for key in compare.MEASURED_KEYS:
        assert key in back["measured"]
    assert compare.jsonable({"x": np.float64("nan"), 3: np.int64(2)}) == {"x": None, "3": 2}
    table = compare.format_table(stats, {"timings": pred, "specs": None})
    assert "mean staleness" in table and "TV mini-batch" in table


def test_summarize_errors_takes_absolute_values_and_skips_missing_runs():
    errs = [dict(zip(compare.ERROR_KEYS, (0.1, -0.2, 0.0, 0.05, 0.5))),
            dict(zip(compare.ERROR_KEYS, (-0.3, 0.2, math.nan, 0.15, 0.1))), None]
    s = compare.summarize_errors(errs)
    assert s["epoch_time_rel_error"] == {"median": pytest.approx(0.2), "p90": pytest.approx(0.28), "n": 2}
    assert s["mean_minibatch_rel_error"]["median"] == pytest.approx(0.2)
    assert s["mean_staleness_rel_error"]["n"] == 1
    assert s["staleness_tv"]["p90"] == pytest.approx(0.46)
    assert math.isnan(compare.summarize_errors([None])["minibatch_tv"]["median"])


def test_cycle_shift_is_the_geometric_mean_ratio_and_skips_what_is_not_a_time():
    def runs(measured, predicted):  # records as validate_runtime.py writes them
        return [dict(measured=dict(t_compute_s=m), predicted_from_specs=dict(t_compute_s=p))
                for m, p in zip(measured, predicted)]

    # Every run 10% longer than measured: +10%, whatever the cycles' lengths.
    shift, n = compare.cycle_shift(runs([0.002, 0.05, 0.3], [0.0022, 0.055, 0.33]))
    assert shift == pytest.approx(0.10) and n == 3
    # One run twice as long, one half as long: they cancel (a ratio, not a difference).
    assert compare.cycle_shift(runs([0.01, 0.01], [0.02, 0.005]))[0] == pytest.approx(0.0, abs=1e-12)
    shift, n = compare.cycle_shift(runs([0.01, 0.0, math.nan, 0.01], [0.011, 0.02, 0.02, None])
                                   + [dict(measured=dict(t_compute_s=0.01), predicted_from_specs=None)])
    assert shift == pytest.approx(0.1) and n == 1
    assert compare.cycle_shift(runs([0.01], [0.02]), source="timings") == (pytest.approx(math.nan, nan_ok=True), 0)
    assert math.isnan(compare.cycle_shift([])[0]) and math.isnan(compare.cycle_shift(runs([0.0], [1.0]))[0])


def test_a_shifted_updater_cycle_is_found_and_used():
    # Cycles of a fixed 0.3 s plus a bursty gamma tail (whole cycle: mean 0.5 s, cv 0.6, tail cv 1.5).
    ev = events.simulate_log(4, 1.0, 0.5, 0.3, 0.6, duration_s=10_000.0, warmup_s=5.0, sub_batch=8,
                             dataset_size=5000, seed=6, update_shift_s=0.3)
    stats = events.statistics(ev)
    assert 0.3 <= stats["t_update_p01_s"] < 0.32
    assert compare.update_shift(stats, stats["t_update_cv"]) == pytest.approx(stats["t_update_p01_s"])
    shifted = compare.predict_from_timings(stats)
    assert shifted["t_update_shift_s"] == pytest.approx(stats["t_update_p01_s"])
    plain = compare.predict_from_timings(stats, use_update_shift=False)
    assert plain["t_update_shift_s"] == 0.0
    e, e0 = compare.compare(stats, shifted), compare.compare(stats, plain)
    assert abs(e["mean_minibatch_rel_error"]) < 0.02 and abs(e["mean_staleness_rel_error"]) < 0.02
    assert e["minibatch_tv"] < 0.03 and e["staleness_tv"] < 0.03, e
    assert e["minibatch_tv"] < e0["minibatch_tv"] / 2, (e, e0)
    # The shift is capped so that the tail's cv stays within the model's limit.
    assert compare.update_shift(dict(t_update_s=1.0, t_update_p01_s=0.9), 2.0) < 0.5
    assert compare.update_shift(dict(t_update_s=1.0, t_update_p01_s=0.9), 0.0) == 0.0


def test_two_moment_tv_is_zero_for_a_discretised_gamma_and_large_for_two_peaks():
    from scipy import stats

    k = np.arange(80)
    cdf = stats.gamma.cdf(k + 0.5, 40.0, scale=0.5)  # mean 20, variance 10
    q = np.diff(np.concatenate([[0.0], cdf]))
    gamma_pmf = {int(i): float(v) for i, v in enumerate(q)}
    tv = compare.two_moment_tv(gamma_pmf)
    assert tv < 0.005  # its own moments give it back (up to the discretisation's moment shift)
    # On the sub-batch's lattice (mini-batch = 8 x count) it is the same number.
    assert compare.two_moment_tv({8 * i: v for i, v in gamma_pmf.items()}) == pytest.approx(tv)
    # Two peaks (mean 5, variance 16): a gamma with those moments puts most of its mass elsewhere.
    two = compare.two_moment_tv({1: 0.5, 9: 0.5})
    g = stats.gamma(5.0 ** 2 / 16.0, scale=16.0 / 5.0)
    expected = 0.5 * (abs(0.5 - (g.cdf(1.5) - g.cdf(0.5))) + abs(0.5 - (g.cdf(9.5) - g.cdf(8.5)))
                      + (1.0 - (g.cdf(1.5) - g.cdf(0.5)) - (g.cdf(9.5) - g.cdf(8.5))))
    assert two == pytest.approx(expected, rel=1e-6) and two > 0.6
    assert compare.two_moment_tv({3: 1.0}) == 0.0 and math.isnan(compare.two_moment_tv({}))
    e = compare.compare(dict(epoch_time_s=1.0, mean_minibatch=1.0, mean_staleness=1.0, minibatch_pmf={8: 0.5, 72: 0.5},
                             staleness_pmf={0: 1.0}),
                        dict(epoch_time_s=1.0, mean_minibatch=1.0, mean_staleness=1.0, minibatch_pmf={8: 1.0},
                             staleness_pmf={0: 1.0}))
    assert e["minibatch_tv_two_moment"] == pytest.approx(two)  # the measured pmf's own reference
