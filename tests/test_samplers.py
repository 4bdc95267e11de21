"""Tests for jaxsprint.emulation.samplers: staleness samplers and the random mini-batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsprint.emulation import samplers as st
from jaxsprint.emulation import staleness
from jaxsprint.errors import ConfigError


def _tv(p, q):
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def _pad(p, n):
    out = np.zeros(n)
    out[: len(p)] = p
    return out



# --------------------------------------------------------------------------------------------------------
# Samplers.
# --------------------------------------------------------------------------------------------------------


def _draws(sampler, n=100_000, seed=0):
    keys = jax.random.split(jax.random.key(seed), n)
    out = jax.jit(jax.vmap(sampler))(keys)
    assert out.dtype == jnp.int32 and out.shape == (n,)
    return np.asarray(out)


@pytest.mark.parametrize(
    "sampler",
    [
        st.constant(0),
        st.constant(4),
        st.uniform(9),
        st.geometric(4.0, 30),
        st.geometric(3.0, 12, exact_mean=True),
        st.from_pmf(np.array([0.0, 0.2, 0.0, 0.0, 0.8])),
        st.sampler_from_perf_model(np.array([0.0, 0.7, 0.3])),
    ],
    ids=repr,
)
def test_sampler_draws_match_pmf(sampler):
    draws = _draws(sampler)
    assert draws.min() >= 0 and draws.max() <= sampler.max_value
    freq = np.bincount(draws, minlength=sampler.max_value + 1) / draws.size
    assert _tv(freq, sampler.pmf) < 0.01
    assert np.all(freq[sampler.pmf == 0] == 0)


def test_geometric_mean_and_truncation():
    # Untruncated law: P(k) = (1 - r) r^k with r = m / (1 + m).
    m = 3.0
    r = m / (1 + m)
    far = st.geometric(m, 300)
    np.testing.assert_allclose(far.pmf[:5], (1 - r) * r ** np.arange(5), rtol=1e-12)
    np.testing.assert_allclose(far.mean, m, rtol=1e-10)
    # Truncation by renormalisation lowers the mean by (K+1) r^(K+1) / (1 - r^(K+1)).
    k, m = 20, 8.0
    r = m / (1 + m)
    trunc = st.geometric(m, k)
    np.testing.assert_allclose(trunc.mean, m - (k + 1) * r ** (k + 1) / (1 - r ** (k + 1)), rtol=1e-12)
    assert trunc.mean < m - 0.5
    # exact_mean solves for the truncated law's mean.
    exact = st.geometric(m, k, exact_mean=True)
    np.testing.assert_allclose(exact.mean, m, rtol=1e-10)
    assert exact.max_value == k
    # Empirical means agree with the analytic ones (standard error about 0.015 here).
    for sampler in (st.geometric(4.0, 64), exact):
        assert abs(_draws(sampler).mean() - sampler.mean) < 0.06
    assert st.geometric(0.0, 5).max_value == 0


def test_sampler_from_perf_model_sources_and_tails():
    pmf = np.array([0.0, 0.5, 0.3, 0.15, 0.05])
    # An array (float32, as a jnp model would produce), a callable with arguments, an object with the field.
    a = st.sampler_from_perf_model(jnp.asarray(pmf, jnp.float32))
    b = st.sampler_from_perf_model(lambda scale, *, shift: pmf * scale + shift, 1.0, shift=0.0)

    class Prediction:
        staleness_pmf = pmf

    c = st.sampler_from_perf_model(lambda: Prediction())
    for s in (a, b, c):
        np.testing.assert_allclose(s.pmf, pmf, atol=1e-7)
    with pytest.raises(ConfigError, match="invalid max_staleness=2: at least the predicted staleness support"):
        st.sampler_from_perf_model(pmf, max_staleness=2)
    renorm = st.sampler_from_perf_model(pmf, max_staleness=2, tail="renormalize")
    np.testing.assert_allclose(renorm.pmf, pmf[:3] / 0.8)
    clip = st.sampler_from_perf_model(pmf, max_staleness=2, tail="clip")
    np.testing.assert_allclose(clip.pmf, [0.0, 0.5, 0.5])
    # The result plugs into the transform.
    staleness.delayed_gradients(2, clip)


# --------------------------------------------------------------------------------------------------------
# Variable mini-batch emulation.
# --------------------------------------------------------------------------------------------------------


def test_minibatch_weights_select_k_and_sum_to_one():
    n_sub = 8
    k_pmf = np.array([0.0, 0.1, 0.0, 0.3, 0.2, 0.0, 0.0, 0.0, 0.4])
    keys = jax.random.split(jax.random.key(5), 20_000)
    draws = jax.jit(jax.vmap(lambda key: st.minibatch_weights(key, n_sub, k_pmf)))(keys)
    w, k = np.asarray(draws.weights), np.asarray(draws.k)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal((w > 0).sum(axis=1), k)
    np.testing.assert_allclose(w.max(axis=1), 1.0 / k, rtol=1e-7)  # All selected weights are 1 / K.
    np.testing.assert_allclose(np.where(w > 0, w, np.inf).min(axis=1), 1.0 / k, rtol=1e-7)
    # K follows the pmf; every sub-batch is equally likely to be used.
    assert _tv(np.bincount(k, minlength=n_sub + 1) / k.size, k_pmf) < 0.02
    use = (w > 0).mean(axis=0)
    np.testing.assert_allclose(use, k_pmf @ np.arange(n_sub + 1) / n_sub, atol=0.02)
    # Constant K and a sampler of K are accepted too.
    assert int(st.minibatch_weights(jax.random.key(0), n_sub, 3).k) == 3
    assert int(st.minibatch_weights(jax.random.key(0), n_sub, st.from_pmf([0, 0, 1.0])).k) == 2


def test_weighted_loss_gradient_is_mean_over_selected_examples():
    n_sub, batch = 4, 12
    x = jax.random.normal(jax.random.key(1), (batch, 3))
    y = jax.random.normal(jax.random.key(2), (batch,))
    w_param = jnp.array([0.5, -1.0, 2.0])
    draw = st.minibatch_weights(jax.random.key(3), n_sub, [0.0, 0.0, 1.0])  # K = 2.
    ex_w = st.example_weights(draw.weights, batch)
    assert ex_w.shape == (batch,)
    np.testing.assert_allclose(ex_w.sum(), 1.0, rtol=1e-6)

    def per_example(w):
        return (x @ w - y) ** 2

    grad = jax.grad(lambda w: st.weighted_mean(per_example(w), ex_w))(w_param)
    used = np.repeat(np.asarray(draw.weights) > 0, batch // n_sub)
    assert used.sum() == 2 * batch // n_sub
    expected = jax.grad(lambda w: per_example(w)[used].mean())(w_param)
    np.testing.assert_allclose(grad, expected, rtol=1e-5)
    # weighted_mean broadcasts over trailing axes.
    np.testing.assert_allclose(st.weighted_mean(x, ex_w), x[used].mean(axis=0), rtol=1e-5)


# --------------------------------------------------------------------------------------------------------
# Bad input: one clear error naming the field.
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: st.constant(-1), "invalid tau=-1: a non-negative integer"),
        (lambda: st.constant(1.5), "invalid tau=1.5: a non-negative integer"),
        (lambda: st.uniform(-2), "invalid max_value=-2: a non-negative integer"),
        (lambda: st.geometric(-1.0, 5), "invalid mean=-1.0: a finite real number >= 0"),
        (lambda: st.geometric(float("nan"), 5), "invalid mean=nan: a finite real number >= 0"),
        (lambda: st.geometric(2.0, 3.5), "invalid max_staleness=3.5: a non-negative integer"),
        (lambda: st.geometric(3.0, 4, exact_mean=True), r"invalid mean=3.0: < max_staleness / 2 = 2"),
        (lambda: st.from_pmf([0.5, 0.4]), r"invalid pmf=\[0.5, 0.4\]: must sum to 1"),
        (lambda: st.from_pmf([1.2, -0.2]), "invalid pmf=.*: entries must be non-negative"),
        (lambda: st.from_pmf([[0.5, 0.5]]), "invalid pmf=.*: a non-empty 1-D array"),
        (lambda: st.from_pmf([]), "invalid pmf=.*: a non-empty 1-D array"),
        (lambda: st.from_pmf([0.5, float("nan")]), "invalid pmf=.*: entries must be finite"),
        (lambda: st.from_pmf(["a", "b"]), "invalid pmf=.*: a 1-D array of probabilities"),
        (lambda: st.sampler_from_perf_model([0.5, 0.5, 0.1]), "invalid pmf=.*: must sum to 1"),
        (lambda: st.sampler_from_perf_model([0.5, 0.5], max_staleness=1, tail="drop"), "invalid tail='drop'"),
        (lambda: st.minibatch_weights(jax.random.key(0), 4, [0.5, 0.5]), r"invalid k_pmf\[0\]=0.5"),
        (lambda: st.minibatch_weights(jax.random.key(0), 2, [0.0, 0.0, 0.0, 1.0]), "invalid n_sub=2"),
        (lambda: st.minibatch_weights(jax.random.key(0), 0, [0.0, 1.0]), "invalid n_sub=0: a positive integer"),
        (lambda: st.minibatch_weights(jax.random.key(0), 4, 0), "invalid k_distribution=0"),
        (lambda: st.example_weights(jnp.ones(3) / 3, 10), "invalid batch_size=10: a positive multiple of n_sub=3"),
    ],
)
def test_bad_input_raises_naming_the_field(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_pmf_from_inside_jit_is_rejected():
    with pytest.raises(ConfigError, match="concrete"):
        jax.jit(lambda p: st.from_pmf(p).max_value)(jnp.array([0.5, 0.5]))


def test_pmf_check_returns_the_renormalised_pmf():
    out = st.check_pmf("config.async_emulation.pmf", (0.25, 0.75 + 5e-6))
    assert out.dtype == np.float64 and out.sum() == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ConfigError, match=r"invalid config.async_emulation.pmf=\(0.5, 0.6\)"):
        st.check_pmf("config.async_emulation.pmf", (0.5, 0.6))
