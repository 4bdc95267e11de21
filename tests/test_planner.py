"""Tests of jaxsprint.plan.planner with the emulated runs replaced by a known convergence law."""
import math

import numpy as np
import pytest

from experiments.configs import plan as plan_config
from jaxsprint.plan import emulator, planner
from jaxsprint.errors import ConfigError
from jaxsprint.perf import machines, zoo
from jaxsprint.plan import law
from jaxsprint.perf import space as spaces

TRUE = np.array([math.log(60.0), math.log(1.0), math.log(0.02), math.log(2.0), 1.0])
B_REF = 64.0
TARGET = 0.95


class LawEmulator:
    """Stands in for :class:`jaxsprint.plan.emulator.Emulator`: every seed's accuracy rises linearly and crosses
    the target exactly at the law's U(B, tau) (or tops out at ``ceiling``)."""

    def __init__(self, ceiling=1.0, max_updates=4000):
        self.max_updates, self.min_bucket, self.ceiling = max_updates, 1, ceiling
        self.specs = []

    def key_fields(self):
        return {"law": TRUE.tolist(), "ceiling": self.ceiling}

    def describe(self):
        return "the known law"

    def run(self, spec):
        self.specs.append(spec)
        u_true = math.exp(float(law.law_log_updates(TRUE, spec.mean_minibatch, spec.mean_staleness, B_REF)))
        updates = np.arange(1, 401, dtype=np.float64) * (self.max_updates / 400)
        acc = np.minimum(TARGET * updates / u_true, self.ceiling)
        return emulator.RunResult(updates, np.stack([acc, acc]))


@pytest.fixture(scope="module")
def space():
    return spaces.make_space(zoo.get("resnet8"), machines.get("tsubame_kfc_dl"), max_nodes=16, max_sub_batch=32)


def _settings(**overrides):
    """The planner's settings of the shipped plan config with `overrides` (as --config.<field>=... would)."""
    config = plan_config.get_config()
    with config.unlocked():
        config.update(overrides)
    return planner.settings_from_config(config)


OPTS = _settings(target_accuracy=TARGET, budget_runs=6, initial_runs=4, search_starts=4)


@pytest.mark.slow  # about 20 s on a quiet 2-core machine: searches, pmfs and fits compile
def test_planner_recovers_the_law_and_picks_the_known_optimum(space):
    em = LawEmulator()
    report = planner.run_plan(space, em, emulator.RunCache(None), OPTS, minibatch_targets=[16.0, 64.0, 256.0],
                              staleness_limits=[4.0, math.inf])
    assert report["reached"]
    fit = report["_fit"]
    assert report["runs"]["used"] == len(em.specs) <= 6
    # Each run drew from its candidate's predicted pmfs, whose means are the candidate's (the delay in
    # non-empty updates: the version staleness thinned by the chance that a version is empty).
    for s in em.specs:
        assert np.dot(np.arange(s.staleness_pmf.size), s.staleness_pmf) == pytest.approx(
            s.mean_staleness * (1.0 - s.minibatch_pmf[0]), rel=0.05)
    # The fitted law predicts the true one across the fitted cells.
    b = np.array([r["mean_minibatch"] for r in report["candidates"]])
    tau = np.array([r["mean_staleness"] for r in report["candidates"]])
    pred, _ = law.predict_log_updates(fit, b, tau)
    true = np.asarray(law.law_log_updates(TRUE, b, tau, B_REF))
    np.testing.assert_allclose(pred, true, atol=0.05)
    # The choice is the optimum of the TRUE law over the same range, within 2% of its time to accuracy.
    true_fit = fit._replace(theta=TRUE.copy(), b_ref=B_REF)
    best = law.plan_search(space, true_fit, starts=4)
    c = report["chosen"]
    _, f_chosen, ok = law.evaluate_plan(space, true_fit, [[c["nodes"], c["gpus_per_node"], c["sub_batch"]]])
    assert ok[0]
    assert f_chosen[0] <= best.log_time_to_accuracy + math.log(1.02)
    # Beside it, SPRINT's rule for the same mean mini-batch; never predicted faster than the choice.
    assert report["sprint_rule"] is not None
    assert abs(report["sprint_rule"]["mean_minibatch"] / c["mean_minibatch"] - 1) <= OPTS.tolerance + 1e-6
    assert report["speedup_over_sprint_rule"] >= 1.0 - 1e-6
    for r in report["candidates"]:
        assert r["predicted_updates_low"] <= r["predicted_updates"] <= r["predicted_updates_high"]


@pytest.mark.slow  # about 20 s, as above
@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_a_measured_noise_scale_is_the_laws_b_noise_and_s_min_is_fitted(space, factor):
    b_noise = math.exp(TRUE[1]) * B_REF * factor  # the truth, or three times it
    opts = _settings(target_accuracy=TARGET, budget_runs=4, initial_runs=4, search_starts=4, b_noise=b_noise,
                     b_noise_se=0.01 * b_noise)
    report = planner.run_plan(space, LawEmulator(), emulator.RunCache(None), opts,
                              minibatch_targets=[16.0, 64.0, 256.0], staleness_limits=[4.0, math.inf])
    f = report["fit"]
    assert report["b_noise_source"] == "measured" and report["describes"] == "the known law"
    assert f["b_noise"] == pytest.approx(b_noise, rel=0.03)
    if factor == 1.0:  # the measurement is right: S_min comes out as the truth
        assert f["s_min"] == pytest.approx(math.exp(TRUE[0]), rel=0.1)


def test_a_target_no_run_reaches_gives_the_best_reached(space):
    em = LawEmulator(ceiling=0.6)
    report = planner.run_plan(space, em, emulator.RunCache(None), OPTS, minibatch_targets=[16.0, 64.0],
                              staleness_limits=[math.inf])
    assert not report["reached"]
    assert report["best_reached"]["accuracy"] == pytest.approx(0.6)
    assert "chosen" not in report


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5, math.nan, "high"])
def test_target_accuracy_outside_zero_one(value):
    with pytest.raises(ConfigError, match="config.target_accuracy"):
        planner.check_target_accuracy(value)
    assert planner.check_target_accuracy(1.0) == 1.0


def test_no_candidate_meets_the_ladder(space):
    with pytest.raises(ConfigError, match="config.minibatch_range"):
        planner.run_plan(space, LawEmulator(), emulator.RunCache(None), OPTS, minibatch_targets=[1e7],
                         staleness_limits=[math.inf])


def test_settings_come_from_the_config_and_name_its_fields():
    s = _settings(target_accuracy=0.9)
    c = plan_config.get_config()
    assert (s.lr_rule, s.base_lr, s.budget_runs, s.initial_runs, s.tolerance) == (
        c.lr_rule, c.base_lr, c.budget_runs, c.initial_runs, c.tolerance)
    with pytest.raises(ConfigError, match=r"invalid config\.initial_runs=8: at most config\.budget_runs=3"):
        _settings(target_accuracy=0.9, budget_runs=3)  # the first design is part of the budget, not cut to it
    assert _settings(target_accuracy=0.9, minibatch_scale=None).minibatch_scale == 1.0
    assert planner.settings_from_config(c, target_accuracy=0.9, minibatch_scale=7.5).minibatch_scale == 7.5
    for field, value in [("target_accuracy", None), ("lr_rule", "cosine"), ("base_lr", 0.0), ("tolerance", 1.0),
                         ("budget_runs", 0), ("search_starts", True), ("t_compute_cv", 3.0)]:
        with pytest.raises(ConfigError, match=rf"invalid config\.{field}="):
            _settings(**{"target_accuracy": 0.9, field: value})


def test_spread_design_takes_the_corners_first():
    pts = np.array([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5], [0.0, 1.0], [1.0, 0.0]])
    assert set(planner.spread_design(pts, 4)) == {0, 1, 3, 4}


def test_a_changed_candidate_statistic_invalidates_only_its_own_cache_entry(space):
    import dataclasses

    from jaxsprint.perf import search

    cands = search.evaluate_configs(space, spaces.make_target(1.0), [[2, 2, 12], [12, 2, 6], [14, 4, 14]])
    em = LawEmulator()
    keys = [emulator.RunCache.key(em, planner.candidate_spec(c, OPTS)) for c in cands]
    assert len(set(keys)) == 3
    # Float noise (as between two processes) keeps every key; a changed T_u changes only its candidate's.
    noisy = [dataclasses.replace(c, t_compute_s=c.t_compute_s * (1 + 1e-7)) for c in cands]
    assert [emulator.RunCache.key(em, planner.candidate_spec(c, OPTS)) for c in noisy] == keys
    changed = list(cands)
    changed[1] = dataclasses.replace(cands[1], t_update_s=cands[1].t_update_s * 1.2)
    new = [emulator.RunCache.key(em, planner.candidate_spec(c, OPTS)) for c in changed]
    assert new[0] == keys[0] and new[2] == keys[2] and new[1] != keys[1]
