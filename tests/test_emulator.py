"""Tests of jaxsprint.plan.emulator: the proxy emulator under predicted pmfs, updates to target, the run cache."""
import math

import numpy as np
import pytest

from jaxsprint.plan import emulator as cv
from jaxsprint.errors import ConfigError


def _data(n=96, size=4, seed=0):
    """A linearly separable 3-class problem at size x size: quick to learn, quick to compile."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n + 48).astype(np.int32)
    centres = rng.normal(size=(3, size, size, 1)).astype(np.float32) * 2.0
    x = centres[y] + rng.normal(size=(n + 48, size, size, 1)).astype(np.float32) * 0.5
    return cv.ProxyData("toy", x[:n], y[:n], x[n:], y[n:], 3, size, 1)


def _spec(tau=0, m=8, lr=0.05):
    s = np.zeros(cv.MAX_STALENESS + 1)
    s[tau] = 1.0
    mb = np.zeros(m + 1)
    mb[m] = 1.0
    return cv.RunSpec(s, mb, lr, "none", float(m), float(tau))


@pytest.fixture(scope="module")
def emulator():
    return cv.Emulator(_data(), "mlp", seeds=2, max_updates=40, eval_every=10, width=16, min_bucket=8)


def test_updates_to_target_interpolates_and_censors():
    u = np.array([10.0, 20.0, 30.0])
    assert cv.updates_to_target(u, np.array([0.5, 0.7, 0.9]), 0.8) == pytest.approx(25.0)
    assert cv.updates_to_target(u, np.array([0.9, 0.95, 0.97]), 0.45) == pytest.approx(5.0)
    assert cv.updates_to_target(u, np.array([0.5, np.nan, 0.6]), 0.8) is None


def test_minibatch_pmf_maps_counts_to_proxy_samples():
    count = np.array([0.1, 0.2, 0.3, 0.4])  # K = 0..3
    p = cv.minibatch_pmf_from_counts(count, sub_batch=64, scale=32.0)  # m = 0, 2, 4, 6
    np.testing.assert_allclose(p[[0, 2, 4, 6]], count)
    assert p.sum() == pytest.approx(1.0)
    p = cv.minibatch_pmf_from_counts(count, sub_batch=1, scale=100.0)  # K >= 1 never rounds to an empty update
    assert p[0] == pytest.approx(0.1) and p[1] == pytest.approx(0.9)


def test_delays_are_drawn_in_non_empty_updates():
    """A staleness of s versions, each empty with probability q, is Binomial(s, 1 - q) weight changes: what
    the emulator's ring (which stands still on an empty update) must draw."""
    from scipy import stats

    sp, q = np.array([0.1, 0.2, 0.3, 0.4]), 0.3
    want = sum(sp[s] * np.pad(stats.binom.pmf(np.arange(s + 1), s, 1 - q), (0, 3 - s)) for s in range(4))
    np.testing.assert_allclose(cv.nonempty_staleness_pmf(sp, q), want, rtol=1e-12)
    np.testing.assert_array_equal(cv.nonempty_staleness_pmf(sp, 0.0), sp)
    np.testing.assert_array_equal(cv.nonempty_staleness_pmf(sp, 1.0), [1, 0, 0, 0])
    kw = dict(sub_batch=16, scale=1.0, lr_rule="none", base_lr=0.1, reference_batch=32.0, mean_minibatch=8.0,
              mean_staleness=2.0, statistics={"learners": 4.0})
    spec = cv.make_spec(sp, np.array([q, 1 - q]), **kw)
    np.testing.assert_allclose(spec.staleness_pmf[:4], want, rtol=1e-12)
    assert spec.mean_staleness == 2.0  # the law's coordinate stays the version staleness
    assert dict(spec.statistics)["delay"] == 1.0  # cache entries of version-counted delays are not reused


def test_make_spec_learning_rate_rules():
    stale, count = np.array([0.0, 0.5, 0.5]), np.array([0.0, 0.0, 1.0])
    kw = dict(sub_batch=16, scale=1.0, base_lr=0.1, reference_batch=32.0, mean_minibatch=32.0, mean_staleness=1.5)
    lin = cv.make_spec(stale, count, lr_rule="linear", **kw)
    assert lin.learning_rate == pytest.approx(0.1) and lin.mitigation == "none"
    assert cv.make_spec(stale, count, lr_rule="lr_tau", **kw).mitigation == "staleness_lr"
    assert cv.make_spec(stale, count, lr_rule="none", **{**kw, "sub_batch": 64}).learning_rate == pytest.approx(0.1)
    assert cv.make_spec(stale, count, lr_rule="linear", **{**kw, "sub_batch": 64}).learning_rate == pytest.approx(0.4)
    with pytest.raises(ConfigError, match="config.lr_rule"):
        cv.make_spec(stale, count, lr_rule="cosine", **kw)


def test_unknown_proxy_model_and_bad_sizes():
    with pytest.raises(ConfigError, match="config.model"):
        cv.Emulator(_data(), "resnet152")
    with pytest.raises(ConfigError, match="config.seeds"):
        cv.Emulator(_data(), "mlp", seeds=0)


def test_unknown_dataset():
    with pytest.raises(ConfigError, match="data_dir|dataset"):
        cv.load_proxy_data("no_such_dataset_xyz")


def test_the_emulator_learns_and_staleness_slows_it(emulator):
    fresh = emulator.run(_spec(tau=0, lr=0.2))
    assert fresh.accuracy.shape == (2, 4)
    assert np.all(np.isfinite(fresh.accuracy))
    assert fresh.accuracy[:, -1].mean() > 0.9
    stale = emulator.run(_spec(tau=12, lr=0.2))
    assert stale.accuracy[:, 0].mean() < fresh.accuracy[:, 0].mean()
    # An update with an empty mini-batch changes nothing: all-empty stays at the initial weights.
    mb = np.zeros(9)
    mb[0] = 1.0
    idle = emulator.run(cv.RunSpec(_spec().staleness_pmf, mb, 0.2))
    assert np.ptp(idle.accuracy, axis=1).max() == 0.0


@pytest.mark.slow
def test_results_do_not_depend_on_the_compiled_bucket(emulator):
    a = emulator.run(_spec(m=4, lr=0.1))
    other = cv.Emulator(emulator.data, "mlp", seeds=2, max_updates=40, eval_every=10, width=16, min_bucket=16)
    b = other.run(_spec(m=4, lr=0.1))
    np.testing.assert_allclose(a.accuracy, b.accuracy, atol=1e-6)


class _Counting:
    """An emulator stand-in that counts its runs (the cache must not call it for a cached spec)."""

    def __init__(self):
        self.calls = 0
        self.max_updates = 40

    def key_fields(self):
        return {"fake": 1}

    def run(self, spec):
        self.calls += 1
        return cv.RunResult(np.array([20.0, 40.0]), np.array([[0.5, 0.5 + spec.learning_rate]]))


def test_cache_reuses_runs_and_a_changed_statistic_invalidates_only_its_entry(tmp_path):
    em = _Counting()
    specs = [_spec(tau=t) for t in (0, 1, 2)]
    cache = cv.RunCache(str(tmp_path))
    first = [cache.run(em, s) for s in specs]
    assert em.calls == 3 and not any(r.cached for r in first)
    again = [cv.RunCache(str(tmp_path)).run(em, s) for s in specs]
    assert em.calls == 3 and all(r.cached for r in again)
    np.testing.assert_allclose(again[1].accuracy, first[1].accuracy)
    changed = [specs[0], _spec(tau=3), specs[2]]
    cache = cv.RunCache(str(tmp_path))
    [cache.run(em, s) for s in changed]
    assert em.calls == 4 and cache.hits == 2 and cache.misses == 1
    # The spec's fit inputs (not what the run draws from) do not change its key; its pmfs and lr do.
    k = cv.RunCache.key(em, specs[0])
    assert cv.RunCache.key(em, cv.RunSpec(specs[0].staleness_pmf, specs[0].minibatch_pmf, 0.05, "none", 9.0, 9.0)) == k
    assert cv.RunCache.key(em, _spec(lr=0.06)) != k
    assert len(list(tmp_path.glob("run-*.json"))) == 4


def test_no_cache_directory_keeps_nothing(tmp_path):
    em = _Counting()
    cache = cv.RunCache(None)
    cache.run(em, _spec())
    cache.run(em, _spec())
    assert em.calls == 2


@pytest.mark.slow
def test_digits_at_8x8_reach_high_accuracy_synchronously():
    d = cv.load_proxy_data("digits")
    assert d.train_x.shape == (1500, 8, 8, 1) and d.test_x.shape == (297, 8, 8, 1)
    em = cv.Emulator(d, "mlp", seeds=2, max_updates=300, eval_every=50)
    r = em.run(_spec(tau=0, m=32, lr=0.05))
    assert r.accuracy[:, -1].mean() > 0.93
    assert not math.isnan(cv.updates_to_target(r.updates, r.accuracy.mean(0), 0.9) or math.nan)


def test_the_runtime_s_tiny_network_as_a_proxy():
    em = cv.Emulator(_data(n=48), "tiny_nobn", seeds=1, max_updates=10, eval_every=10, min_bucket=8)
    r = em.run(_spec(lr=0.1))
    assert r.accuracy.shape == (1, 1) and np.isfinite(r.accuracy).all()
