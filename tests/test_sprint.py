"""Tests of jaxsprint.perf.sprint: closed forms, Little's law, exact pmfs (float64 references), continuity,
gradient signs of spec predictions, agreement with the simulator and the launcher-side validation."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from jaxsprint.perf import machines as mc
from jaxsprint.perf import simulate as sim
from jaxsprint.perf import sprint, times, zoo
from perf_util import raises_invalid

# ---------------------------------------------------------------------------- references (float64)


def ref_count_pmf(r, cv, kmax):
    """P(K_i = k), k = 0..kmax, of a stationary gamma renewal process in a window r (mean 1)."""
    a = 1.0 / cv ** 2

    def g(j):  # E[(r - S_j)_+], S_j ~ Gamma(j a, scale 1 / a)
        if j == 0:
            return r
        return r * special.gammainc(j * a, a * r) - j * special.gammainc(j * a + 1, a * r)

    gs = [g(j) for j in range(kmax + 2)]
    tail = [1.0] + [gs[k - 1] - gs[k] for k in range(1, kmax + 2)]
    return np.array([tail[k] - tail[k + 1] for k in range(kmax + 1)])


def ref_staleness_pmf(q, cv, smax):
    """P(S = s), s = 0..smax, with S = 1 + ceil(Q - x), Q ~ Gamma(1 / cv^2, mean q)."""
    a = 1.0 / cv ** 2

    def h(c):  # E[(c - Q)_+]
        if c <= 0:
            return 0.0
        return c * special.gammainc(a, a * c / q) - q * special.gammainc(a + 1, a * c / q)

    u = [1.0] + [1.0 - (h(m) - h(m - 1)) for m in range(1, smax + 1)]
    pmf = np.zeros(smax + 1)
    for m in range(smax):
        pmf[m + 1] = u[m] - u[m + 1]
    return pmf


# One window set for the small configurations below, with or without updater jitter: one compilation of
# `distributions` (the same program as suggest_windows' small set with jitter).
W = dict(sprint.SMALL_WINDOWS, mix_nodes=64)


def fixed(offset, pmf, n):
    return np.asarray(sprint.to_fixed_support(offset, pmf, n - 1), np.float64)


# ---------------------------------------------------------------------------- closed forms


def test_closed_forms_and_littles_law():
    p = sprint.predict_from_timings(64, 0.1, 0.037, 32, 1_281_167)
    assert float(p.mean_minibatch) == pytest.approx(32 * 64 * 0.037 / 0.1, rel=1e-6)
    assert float(p.mean_staleness) == pytest.approx(0.1 / 0.037 + 1, rel=1e-6)
    assert float(p.epoch_time_s) == pytest.approx(1_281_167 * 0.1 / (64 * 32), rel=1e-6)
    assert float(p.updates_per_epoch) == pytest.approx(float(p.epoch_time_s) / 0.037, rel=1e-6)
    little = (float(p.mean_staleness) - 1) * float(p.mean_minibatch)
    assert little == pytest.approx(64 * 32, rel=1e-5)


@pytest.mark.parametrize("n,r,cv", [(4, 0.37, 0.0), (16, 2.7, 0.3), (64, 0.05, 0.1), (3, 13.3, 0.5)])
def test_pmf_means_obey_littles_law(n, r, cv):
    d = sprint.distributions(n, 1.0, r, cv, **W)
    mean_k = float(d.count_offset) + float(jnp.sum(d.count_pmf * jnp.arange(d.count_pmf.size)))
    mean_s = float(d.staleness_offset) + float(jnp.sum(d.staleness_pmf * jnp.arange(d.staleness_pmf.size)))
    assert mean_k == pytest.approx(n * r, rel=2e-3)
    assert mean_s == pytest.approx(1 / r + 1, rel=2e-3)
    assert (mean_s - 1) * mean_k == pytest.approx(n, rel=4e-3)


def test_deterministic_case_is_binomial_and_two_point():
    n, r = 5, 2.3
    d = sprint.distributions(n, 1.0, r, 0.0, **W)
    count = fixed(d.count_offset, d.count_pmf, 32)
    expect = np.zeros(32)
    expect[10:16] = stats.binom.pmf(np.arange(6), n, 0.3)  # K = N floor(r) + Binomial(N, frac r)
    np.testing.assert_allclose(count, expect, atol=2e-6)
    q = 1 / r  # 0.4348: S = 1 w.p. 1 - frac(q), 2 w.p. frac(q)
    stale = fixed(d.staleness_offset, d.staleness_pmf, 8)
    np.testing.assert_allclose(stale[:3], [0.0, 1 - q, q], atol=1e-6)
    assert stale[3:].sum() < 1e-6


@pytest.mark.parametrize("r,cv", [(0.37, 0.2), (2.7, 0.3), (13.3, 0.5), (50.0, 0.02), (0.05, 0.1),
                                  (1.0, 0.01), (100.0, 0.05)])
def test_learner_count_pmf_matches_float64_reference(r, cv):
    off, pmf = sprint.learner_count_pmf(r, cv, size=128)
    kmax = int(r + 12 * math.sqrt(r * cv * cv + 0.25) + 4)
    got = fixed(off, pmf, kmax + 1)
    want = ref_count_pmf(r, cv, kmax)
    assert 0.5 * np.abs(got - want).sum() < 2e-3
    np.testing.assert_allclose(got, want, atol=5e-4)


@pytest.mark.parametrize("q,cv", [(2.7, 0.2), (0.37, 0.3), (20.0, 0.1), (100.0, 0.5), (7.0, 0.01)])
def test_staleness_pmf_matches_float64_reference(q, cv):
    off, pmf = sprint.staleness_pmf(q, cv, size=1024)
    smax = int(q + 1 + 14 * q * cv + 4)
    got = fixed(off, pmf, smax + 1)
    want = ref_staleness_pmf(q, cv, smax)
    assert 0.5 * np.abs(got - want).sum() < 2e-3
    np.testing.assert_allclose(got, want, atol=5e-4)


def test_pmfs_nonnegative_sum_to_one_and_vmap():
    rng = np.random.default_rng(0)
    k = 32
    n = rng.integers(1, 48, k).astype(np.float32)
    tc = np.ones(k, np.float32)
    tu = np.exp(rng.uniform(np.log(0.2), np.log(10), k)).astype(np.float32)
    cv = np.where(rng.random(k) < 0.3, 0.0, rng.uniform(0, 0.5, k)).astype(np.float32)
    f = jax.jit(jax.vmap(lambda *a: sprint.distributions(*a, **W)))
    d = f(n, tc, tu, cv)
    for pmf in (d.count_pmf, d.staleness_pmf):
        assert float(jnp.min(pmf)) >= 0.0
        np.testing.assert_allclose(np.asarray(jnp.sum(pmf, -1)), 1.0, atol=1e-5)
    one = sprint.distributions(n[3], tc[3], tu[3], cv[3], **W)
    np.testing.assert_allclose(np.asarray(one.count_pmf), np.asarray(d.count_pmf[3]), atol=1e-6)


@pytest.mark.parametrize("cv", [0.0, 0.2])
def test_pmfs_are_continuous_in_the_timings(cv):
    # Across an integer ratio (r = 2) and an integer staleness (q = 1), tiny changes stay tiny.
    for tu in (2.0, 1.0, 0.37):
        pmfs = []
        for eps in (-1e-4, 1e-4):
            d = sprint.distributions(8, 1.0, tu * (1 + eps), cv, **W)
            pmfs.append((fixed(d.count_offset, d.count_pmf, 64),
                         fixed(d.staleness_offset, d.staleness_pmf, 64)))
        for a, b in zip(*pmfs):
            assert np.abs(a - b).max() < 5e-3


def test_delay_pmfs_for_the_emulator():
    stale, count = sprint.delay_pmfs(8, 1.0, 0.4, 0.1, max_staleness=16, max_count=40)
    assert stale.shape == (17,) and count.shape == (41,)
    assert float(stale[0]) == 0.0
    np.testing.assert_allclose([float(stale.sum()), float(count.sum())], 1.0, atol=1e-5)
    assert float(jnp.sum(stale * jnp.arange(17))) == pytest.approx(1 / 0.4 + 1, rel=1e-3)
    assert float(jnp.sum(count * jnp.arange(41))) == pytest.approx(8 * 0.4, rel=1e-3)
    s2, _ = sprint.delay_pmfs(8, 1.0, 0.4, 0.1, max_staleness=3, max_count=40, tail="truncate")
    np.testing.assert_allclose(np.asarray(s2), np.asarray(stale[:4]), atol=1e-7)
    assert float(s2.sum()) < 1.0
    with raises_invalid("tail", "clip", "one of lump, truncate"):
        sprint.delay_pmfs(8, 1.0, 0.4, max_staleness=3, max_count=4, tail="clip")
    with raises_invalid("workers", 2.5, "an integer >= 1"):
        sprint.delay_pmfs(2.5, 1.0, 0.4, max_staleness=3, max_count=4)


# ---------------------------------------------------------------------------- simulator agreement


@pytest.mark.parametrize("n,r,cv", [(4, 0.37, 0.0), (16, 2.7, 0.3), (64, 0.05, 0.1), (7, 1.0, 0.01),
                                    (32, 0.8, 0.5)])
def test_model_agrees_with_simulator(n, r, cv):
    s = sim.simulate(n, 1.0, r, cv, n_cycles=20_000, seed=1)
    d = sprint.distributions(n, 1.0, r, cv, **W)
    assert s.mean_count == pytest.approx(float(d.mean_count), rel=0.02)
    assert s.mean_staleness == pytest.approx(float(d.mean_staleness), rel=0.02)
    for off, pmf, emp in ((d.count_offset, d.count_pmf, s.count_pmf),
                          (d.staleness_offset, d.staleness_pmf, s.staleness_pmf)):
        size = max(emp.size, int(off) + pmf.size)
        model = fixed(off, pmf, size)
        e = np.zeros(size)
        e[:emp.size] = emp
        assert 0.5 * np.abs(model - e).sum() < 0.05


# ---------------------------------------------------------------------------- times and gradients


def _kfc(**figures):
    return mc.with_figures(mc.get("tsubame_kfc_dl"), **figures)


def test_spec_prediction_is_sane_and_vmaps():
    net, m = zoo.get("resnet50"), mc.get("tsubame_kfc_dl")
    p = sprint.predict(net, m, 16.0, 8.0, 32.0)
    assert 0.1 < float(p.t_compute_s) < 3.0        # K80 die: tens of images per second
    assert 0.01 < float(p.t_update_s) < 1.0
    f = jax.jit(jax.vmap(lambda a, b, c: sprint.predict(net, m, a, b, c)))
    batch = f(jnp.array([1.0, 16.0]), jnp.array([8.0, 8.0]), jnp.array([16.0, 32.0]))
    assert float(batch.epoch_time_s[1]) == pytest.approx(float(p.epoch_time_s), rel=1e-5)


def test_gradient_signs():
    net = zoo.get("resnet50")
    base = dict(peak=4.37e12, net_bw=6.8e9, pcie=7.9e9, nodes=16.0, sub_batch=32.0)

    def stats_of(peak, net_bw, pcie, nodes, sub_batch):
        m = _kfc(peak_flops_per_s=peak, network_bandwidth_bytes_per_s=net_bw,
                 host_device_bandwidth_bytes_per_s=pcie)
        p = sprint.predict(net, m, nodes, 8.0, sub_batch)
        return jnp.stack([p.epoch_time_s, p.mean_minibatch, p.mean_staleness])

    jac = jax.jacfwd(stats_of, argnums=(0, 1, 2, 3, 4))(*base.values())
    g = {k: np.asarray(v) * base[k] for k, v in zip(base, jac)}  # elasticities
    for k, v in g.items():
        assert np.all(np.isfinite(v)), k
    epoch, minibatch, staleness = 0, 1, 2
    assert g["peak"][epoch] < 0 and g["pcie"][epoch] < 0 and g["nodes"][epoch] < 0
    assert g["sub_batch"][epoch] < 0
    assert g["net_bw"][minibatch] < 0 and g["peak"][minibatch] > 0
    assert g["nodes"][minibatch] > 0 and g["sub_batch"][minibatch] > 0
    assert g["net_bw"][staleness] > 0 and g["peak"][staleness] < 0
    assert g["nodes"][staleness] < 0 and g["sub_batch"][staleness] > 0


def test_memory_limit_and_validation_messages():
    net = zoo.get("resnet50")
    kfc = mc.get("tsubame_kfc_dl")
    largest = times.max_sub_batch(net, kfc)
    assert 32 <= largest < 512
    assert sprint.validate_config(net, kfc, 16, 8, 32) == []
    assert "hypothetical" in sprint.validate_config(net, kfc, 64, 8, 32)[0]
    with raises_invalid("sub_batch", 512, f"1..{largest}: ") as e:
        sprint.validate_config(net, kfc, 16, 8, 512)
    assert "GB needed for resnet50" in e.value.allowed and "tsubame_kfc_dl" in e.value.allowed
    with raises_invalid("gpus_per_node", 9, "1..8"):
        sprint.validate_config(net, kfc, 16, 9, 32)
    with raises_invalid("nodes", 0, "an integer >= 1"):
        sprint.validate_config(net, kfc, 0, 8, 32)
    with raises_invalid("workers", 0, "an integer >= 1"):
        sprint.validate_timings(0, 0.1, 0.04)
    with raises_invalid("t_compute", float("nan"), "a finite number > 0"):
        sprint.validate_timings(8, float("nan"), 0.04)
    with raises_invalid("t_update", -1, "a finite number > 0"):
        sprint.validate_timings(8, 0.1, -1)
    with raises_invalid("t_compute_cv", 2.5, "a finite number >= 0 and <= 2"):
        sprint.validate_timings(8, 0.1, 0.04, 2.5)
    with raises_invalid("sub_batch", True, "an integer >= 1"):
        sprint.validate_timings(8, 0.1, 0.04, 0.0, True)


# ---------------------------------------------------------------------------- updater jitter


def test_update_cv_zero_is_the_fixed_cycle_model():
    a = sprint.distributions(16, 1.0, 2.7, 0.3, **sprint.SMALL_WINDOWS, mix_nodes=1)
    b = sprint.distributions(16, 1.0, 2.7, 0.3, 0.0, **W)
    np.testing.assert_allclose(np.asarray(a.count_pmf), np.asarray(b.count_pmf), atol=1e-6)
    np.testing.assert_allclose(np.asarray(a.staleness_pmf), np.asarray(b.staleness_pmf), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("n,r,cv,ucv", [(4, 1.78, 0.26, 0.11), (8, 0.238, 0.48, 0.54), (2, 2.0, 0.3, 0.5),
                                        (1, 5.0, 0.3, 0.5), (4, 3.0, 0.0, 0.3)])
def test_updater_jitter_agrees_with_simulator(n, r, cv, ucv):
    s = sim.simulate(n, 1.0, r, cv, n_cycles=100_000, seed=1, update_cv=ucv)
    d = sprint.distributions(n, 1.0, r, cv, ucv, **sprint.suggest_windows(n, 1.0, r, cv, ucv))
    assert s.mean_count == pytest.approx(float(d.mean_count), rel=0.02)
    assert s.mean_staleness == pytest.approx(float(d.mean_staleness), rel=0.02)
    tv = []
    for off, stride, pmf, emp in ((d.count_offset, d.count_stride, d.count_pmf, s.count_pmf),
                                  (d.staleness_offset, d.staleness_stride, d.staleness_pmf, s.staleness_pmf)):
        size = 2 * max(emp.size, 64)
        model = np.asarray(sprint.to_fixed_support(off, pmf, size - 1, stride=stride), np.float64)
        e = np.zeros(size)
        e[:emp.size] = emp
        tv.append(0.5 * np.abs(model - e).sum())
    # The count's TV includes the sampling noise of 100,000 cycles (about 0.02 between two seeds at
    # (4, 3.0, 0, 0.3)); the staleness histogram (several 10^5 gradients) is sharper.
    assert tv[0] < 0.03 and tv[1] < 0.02, tv


# ---------------------------------------------------------------------------- shifted updater cycle


def ref_shifted_renewal_pmf(w, cv, shift, kmax):
    """P(N(w) = k) of a stationary renewal process with intervals shift + Gamma(mean 1 - shift, cv_G)."""
    m, a = 1.0 - shift, (1.0 - shift) ** 2 / cv ** 2

    def g(j):  # E[(c - Gamma(j a, mean j m))_+] at c = w - j shift
        if j == 0:
            return w
        c = w - j * shift
        if c <= 0:
            return 0.0
        return c * special.gammainc(j * a, j * a * c / (j * m)) - j * m * special.gammainc(j * a + 1, j * a * c / (j * m))

    gs = [g(j) for j in range(kmax + 2)]
    tail = [1.0] + [gs[k - 1] - gs[k] for k in range(1, kmax + 2)]
    return np.array([tail[k] - tail[k + 1] for k in range(kmax + 1)])


@pytest.mark.parametrize("w,cv,shift", [(2.3, 0.5, 0.4), (0.7, 1.5, 0.6), (5.0, 0.2, 0.9), (1.0, 3.0, 0.5)])
def test_shifted_renewal_count_matches_float64_reference(w, cv, shift):
    from jaxsprint.perf import renewal as rn

    k = jnp.arange(1, 40, dtype=jnp.float32)
    pmf = np.asarray(rn.pmf_from_tail(rn.renewal_tail(k, jnp.float32(w), jnp.float32(cv), jnp.float32(shift))))
    ref = ref_shifted_renewal_pmf(w, cv, shift, 39)
    np.testing.assert_allclose(pmf, ref, atol=2e-6)
    assert np.dot(np.arange(40), pmf) == pytest.approx(w, rel=1e-5)   # stationary: E N(w) = w
    assert pmf[int(w / shift) + 2:].sum() < 1e-6                      # at most w / shift + 1 cycles fit


def test_update_shift_zero_is_todays_model_and_simulator():
    a = sprint.distributions(6, 1.0, 1.3, 0.3, 0.7, **W)
    b = sprint.distributions(6, 1.0, 1.3, 0.3, 0.7, 0.0, **W)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert sprint.suggest_windows(6, 1.0, 1.3, 0.3, 0.7) == sprint.suggest_windows(6, 1.0, 1.3, 0.3, 0.7, 0.0)
    kw = dict(n_cycles=400, seed=2, update_cv=0.7)
    s0, s1 = sim.simulate(6, 1.0, 1.3, 0.3, **kw), sim.simulate(6, 1.0, 1.3, 0.3, update_shift_s=0.0, **kw)
    np.testing.assert_array_equal(s0.count_hist, s1.count_hist)
    np.testing.assert_array_equal(s0.staleness_hist, s1.staleness_hist)
    # A tiny shift is close to none: the model is continuous in it.
    c = sprint.distributions(6, 1.0, 1.3, 0.3, 0.7, 1e-4, **W)
    np.testing.assert_allclose(np.asarray(c.count_pmf), np.asarray(a.count_pmf), atol=2e-3)
    np.testing.assert_allclose(np.asarray(c.staleness_pmf), np.asarray(a.staleness_pmf), atol=2e-3)


def test_shifted_cycle_keeps_the_means_and_narrows_the_count():
    a = sprint.distributions(4, 1.0, 2.0, 0.2, 0.6, **W)
    b = sprint.distributions(4, 1.0, 2.0, 0.2, 0.6, 1.2, **W)
    for d in (a, b):
        x = float(d.count_offset) + np.arange(d.count_pmf.size)
        y = float(d.staleness_offset) + np.arange(d.staleness_pmf.size)
        assert np.dot(x, d.count_pmf) == pytest.approx(8.0, rel=2e-3)
        assert np.dot(y, d.staleness_pmf) == pytest.approx(1.5, rel=2e-3)
    # No cycle is shorter than 1.2 T_c: far less mass on the near-empty updates than a gamma cycle.
    assert float(np.asarray(b.count_pmf)[:2].sum()) < 0.5 * float(np.asarray(a.count_pmf)[:2].sum())
    stale, count = sprint.delay_pmfs(4, 1.0, 2.0, 0.2, 0.6, max_staleness=12, max_count=60, update_shift_s=1.2)
    for p, mean in ((stale, 1.5), (count, 8.0)):
        assert float(jnp.sum(p)) == pytest.approx(1.0, abs=1e-5)
        assert float(jnp.dot(jnp.arange(p.size), p)) == pytest.approx(mean, rel=2e-3)
    np.testing.assert_allclose(np.asarray(count)[:7], fixed(b.count_offset, b.count_pmf, 8)[:7], atol=2e-3)


def test_update_shift_validation():
    sprint.validate_timings(4, 1.0, 2.0, 0.2, update_cv=2.0, update_shift_s=1.0)  # tail cv 4: allowed
    with raises_invalid("t_update_shift", 2.0, "< t_update=2.0"):
        sprint.validate_timings(4, 1.0, 2.0, 0.2, update_cv=0.5, update_shift_s=2.0)
    with raises_invalid("t_update_shift", -0.1, ">= 0"):
        sprint.validate_timings(4, 1.0, 2.0, 0.2, update_cv=0.5, update_shift_s=-0.1)
    with raises_invalid("t_update_shift", 1.5, "<= 4"):
        sprint.validate_timings(4, 1.0, 2.0, 0.2, update_cv=2.0, update_shift_s=1.5)   # tail cv 8
    with raises_invalid("t_update_shift", 1.0, "< t_update"):
        sprint.delay_pmfs(4, 1.0, 1.0, 0.2, 0.5, max_staleness=4, max_count=8, update_shift_s=1.0)
    with raises_invalid("update_shift_s", 3.0, "t_update_s"):
        sim.simulate(4, 1.0, 2.0, 0.2, update_cv=0.5, update_shift_s=3.0, n_cycles=10)


@pytest.mark.slow
@pytest.mark.parametrize("n,r,cv,ucv,shift", [(4, 1.78, 0.26, 0.5, 0.6), (8, 0.5, 0.3, 0.5, 0.3),
                                              (2, 2.0, 0.3, 1.5, 0.5), (4, 1.0, 0.3, 2.0, 0.5)])
def test_shifted_updater_agrees_with_simulator(n, r, cv, ucv, shift):
    s = sim.simulate(n, 1.0, r, cv, n_cycles=100_000, seed=1, update_cv=ucv, update_shift_s=shift * r)
    d = sprint.distributions(n, 1.0, r, cv, ucv, shift * r,
                             **sprint.suggest_windows(n, 1.0, r, cv, ucv, shift * r))
    rel = 0.01 if ucv <= 0.5 else 0.02   # the simulator's own noise grows with the cycle's cv
    assert s.mean_count == pytest.approx(float(d.mean_count), rel=rel)
    assert s.mean_staleness == pytest.approx(float(d.mean_staleness), rel=rel)
    tv = []
    for off, stride, pmf, emp in ((d.count_offset, d.count_stride, d.count_pmf, s.count_pmf),
                                  (d.staleness_offset, d.staleness_stride, d.staleness_pmf, s.staleness_pmf)):
        size = 2 * max(emp.size, 64)
        model = np.asarray(sprint.to_fixed_support(off, pmf, size - 1, stride=stride), np.float64)
        e = np.zeros(size)
        e[:emp.size] = emp
        tv.append(0.5 * np.abs(model - e).sum())
    assert tv[0] < 0.04 and tv[1] < 0.015, tv
