"""Tests for jaxsprint.emulation.staleness: the delayed-gradient transform, its mitigations and metrics."""

from __future__ import annotations

import chex
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.stats

from jaxsprint.emulation import samplers
from jaxsprint.emulation import staleness as st
from jaxsprint.errors import ConfigError

# --------------------------------------------------------------------------------------------------------
# Small problems.
# --------------------------------------------------------------------------------------------------------

# Quadratic f(w) = 0.5 * w^T A w - b^T w with diagonal A: g(w) = A w - b.
_A = np.array([1.0, 0.5, 2.0, 0.25])
_B = np.array([1.0, -1.0, 0.5, 2.0])
_W0 = np.array([3.0, -2.0, 1.0, 0.0])
_LR = 0.1


def _quad_grad(w):
    return jnp.asarray(_A, jnp.float32) * w - jnp.asarray(_B, jnp.float32)


def _reference_delayed_sgd(taus, *, lr=_LR, dc_lambda=0.0, staleness_lr=False, dc=False):
    """numpy float64 reference of w_{t+1} = w_t - lr * m(g(w_{t - tau_t})), m the mitigations."""
    ws, gs = [_W0.copy()], []
    for t, tau in enumerate(taus):
        w = ws[-1]
        gs.append(_A * w - _B)
        g = gs[t - tau]
        if dc:
            g = g + dc_lambda * g * g * (w - ws[t - tau])
        if staleness_lr:
            g = g / max(1, tau)
        ws.append(w - lr * g)
    return np.stack(ws)


def _run_quadratic(tx, n_steps):
    """Runs SGD-like `tx` on the quadratic; returns weights [n_steps + 1, d] and realised taus [n_steps]."""

    def body(carry, _):
        w, state = carry
        updates, state = tx.update(_quad_grad(w), state, w)
        tau = st.find_delayed_state(state).last_tau
        return (optax.apply_updates(w, updates), state), (w, tau)

    w0 = jnp.asarray(_W0, jnp.float32)
    (w_end, _), (ws, taus) = jax.jit(
        lambda w: jax.lax.scan(body, (w, tx.init(w)), None, length=n_steps)
    )(w0)
    return np.concatenate([np.asarray(ws), np.asarray(w_end)[None]]), np.asarray(taus)


def _mlp_params(key):
    k1, k2 = jax.random.split(key)
    return {
        "dense1": {"w": jax.random.normal(k1, (6, 16)) * 0.3, "b": jnp.zeros(16)},
        "dense2": {"w": jax.random.normal(k2, (16, 3)) * 0.3, "b": jnp.zeros(3)},
    }


def _mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["dense1"]["w"] + params["dense1"]["b"])
    logits = h @ params["dense2"]["w"] + params["dense2"]["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _mlp_data(step):
    key = jax.random.fold_in(jax.random.key(123), step)
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, (32, 6)), jax.random.randint(ky, (32,), 0, 3)


def _make_step(tx):
    def step(params, opt_state, x, y):
        grads = jax.grad(_mlp_loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step)


def _tv(p, q):
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def _pad(p, n):
    out = np.zeros(n)
    out[: len(p)] = p
    return out


# --------------------------------------------------------------------------------------------------------
# The delayed-gradient transformation.
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_staleness", [0, 4])
@pytest.mark.parametrize("mitigation", ["none", "staleness_lr", "dc_asgd", ("dc_asgd", "staleness_lr")])
def test_tau0_is_bit_identical_to_inner_optimizer(max_staleness, mitigation):
    inner = optax.sgd(0.05, momentum=0.9)
    delayed = optax.chain(
        st.delayed_gradients(max_staleness, st.constant(0), mitigation=mitigation, dc_lambda=0.5), inner
    )
    params = _mlp_params(jax.random.key(0))
    p_ref, s_ref = params, inner.init(params)
    p_del, s_del = params, delayed.init(params)
    step_ref, step_del = _make_step(inner), _make_step(delayed)
    for t in range(50):
        x, y = _mlp_data(t)
        p_ref, s_ref = step_ref(p_ref, s_ref, x, y)
        p_del, s_del = step_del(p_del, s_del, x, y)
    chex.assert_trees_all_equal(p_ref, p_del)  # Exact, bit for bit.
    chex.assert_trees_all_equal(s_ref, s_del[1])  # The momentum state too.
    assert int(s_del[0].count) == 50 and int(s_del[0].tau_counts[0]) == 50


@pytest.mark.parametrize("tau", [1, 3, 7])
def test_constant_tau_matches_closed_form_recursion(tau):
    n = 80
    ws, taus = _run_quadratic(optax.chain(st.delayed_gradients(8, st.constant(tau)), optax.sgd(_LR)), n)
    expected_taus = np.minimum(tau, np.arange(n))  # Warm-up clipping.
    np.testing.assert_array_equal(taus, expected_taus)
    np.testing.assert_allclose(ws, _reference_delayed_sgd(expected_taus), rtol=1e-5, atol=1e-5)


def test_warmup_clips_tau_to_step_and_emits_oldest_gradient():
    # The "gradient" of step t is the constant t, so the emitted value is the step it was computed at.
    tx = st.delayed_gradients(5, st.constant(5))
    state = tx.init(jnp.zeros(3))
    update = jax.jit(tx.update)
    emitted, realised = [], []
    for t in range(10):
        out, state = update(jnp.full(3, float(t)), state)
        emitted.append(float(out[0]))
        realised.append(int(state.last_tau))
    np.testing.assert_array_equal(realised, [0, 1, 2, 3, 4, 5, 5, 5, 5, 5])
    np.testing.assert_array_equal(emitted, [0, 0, 0, 0, 0, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(state.tau_counts, [1, 1, 1, 1, 1, 5])


@pytest.mark.parametrize(
    "mitigation, dc_lambda",
    [("none", 0.0), ("staleness_lr", 0.0), ("dc_asgd", 0.3), (("dc_asgd", "staleness_lr"), 0.3)],
)
def test_random_tau_with_mitigations_matches_numpy_reference(mitigation, dc_lambda):
    tx = optax.chain(
        st.delayed_gradients(6, st.uniform(6), mitigation=mitigation, dc_lambda=dc_lambda, seed=3),
        optax.sgd(_LR),
    )
    ws, taus = _run_quadratic(tx, 120)
    assert len(set(taus.tolist())) == 7  # Every staleness value occurred.
    names = {mitigation} if isinstance(mitigation, str) else set(mitigation)
    ref = _reference_delayed_sgd(
        taus.tolist(), dc_lambda=dc_lambda, staleness_lr="staleness_lr" in names, dc="dc_asgd" in names
    )
    np.testing.assert_allclose(ws, ref, rtol=1e-5, atol=1e-5)


def test_staleness_lr_scales_emitted_gradient_by_inverse_tau():
    tx = st.delayed_gradients(4, st.constant(4), mitigation="staleness_lr")
    state = tx.init(jnp.zeros(2))
    update = jax.jit(tx.update)
    for t in range(8):
        out, state = update(jnp.full(2, t + 1.0), state)
        tau = min(t, 4)
        np.testing.assert_allclose(out, np.full(2, (t - tau + 1.0) / max(1, tau)), rtol=1e-7)


def test_dc_asgd_matches_numpy_formula_and_stores_stale_params():
    lam = 0.7
    tx = st.delayed_gradients(2, st.constant(2), mitigation="dc_asgd", dc_lambda=lam)
    rng = np.random.default_rng(0)
    params = [rng.normal(size=(3,)).astype(np.float32) for _ in range(5)]
    grads = [rng.normal(size=(3,)).astype(np.float32) for _ in range(5)]
    state = tx.init(jnp.asarray(params[0]))
    for t in range(5):
        out, state = tx.update(jnp.asarray(grads[t]), state, jnp.asarray(params[t]))
        s = t - min(t, 2)
        g = grads[s].astype(np.float64)
        expected = g + lam * g * g * (params[t].astype(np.float64) - params[s])
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)


def test_dc_asgd_without_params_raises():
    tx = st.delayed_gradients(2, 1, mitigation="dc_asgd")
    state = tx.init(jnp.zeros(2))
    with pytest.raises(ConfigError, match="invalid params=None"):
        tx.update(jnp.ones(2), state)


def test_no_retrace_across_steps_with_changing_tau():
    chex.clear_trace_counter()
    tx = optax.chain(st.delayed_gradients(8, st.geometric(3.0, 8), seed=1), optax.sgd(0.1, momentum=0.9))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(params, opt_state, x, y):
        grads = jax.grad(_mlp_loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    params = _mlp_params(jax.random.key(0))
    opt_state = tx.init(params)
    x, y = _mlp_data(0)
    seen = set()
    for _ in range(30):
        params, opt_state = step(params, opt_state, x, y)
        seen.add(int(opt_state[0].last_tau))
    assert len(seen) > 3

    # A replayed staleness trace passed as an argument does not retrace either.
    @jax.jit
    @chex.assert_max_traces(n=1)
    def replay(params, opt_state, grads, tau):
        return tx.update(grads, opt_state, params, staleness=tau)

    for tau in [0, 5, 2, 8, 1]:
        _, opt_state = replay(params, opt_state, params, jnp.int32(tau))
        assert int(opt_state[0].last_tau) == tau


@pytest.mark.parametrize(
    "sampler",
    [st.uniform(6), st.geometric(2.0, 10), st.from_pmf([0.1, 0.0, 0.5, 0.15, 0.25]), st.constant(3)],
    ids=repr,
)
def test_realised_tau_histogram_matches_sampler_pmf(sampler):
    max_staleness, n_warm, n_steps = 10, 10, 20_000
    tx = st.delayed_gradients(max_staleness, sampler, seed=7)

    def run(state, n):
        def body(state, _):
            return tx.update(jnp.ones(()), state)[1], None

        return jax.lax.scan(body, state, None, length=n)[0]

    run = jax.jit(run, static_argnums=1)
    after_warmup = run(tx.init(jnp.zeros(())), n_warm)
    final = run(after_warmup, n_steps)
    counts = np.asarray(final.tau_counts - after_warmup.tau_counts)  # Steps past warm-up only.
    pmf = _pad(sampler.pmf, max_staleness + 1)
    assert counts.sum() == n_steps
    assert np.all(counts[pmf == 0] == 0)
    # With 20k draws over <= 11 values the expected TV distance is below 0.01; 0.02 is a wide margin.
    assert _tv(counts / n_steps, pmf) < 0.02
    if np.count_nonzero(pmf) > 1:
        support = pmf > 0
        assert scipy.stats.chisquare(counts[support], n_steps * pmf[support]).pvalue > 1e-4


def test_buffer_memory_is_depth_times_param_bytes():
    params = _mlp_params(jax.random.key(0))
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    for mitigation, copies in [("none", 1), ("staleness_lr", 1), ("dc_asgd", 2)]:
        state = st.delayed_gradients(16, 4, mitigation=mitigation).init(params)
        assert st.buffer_nbytes(state) == copies * 17 * param_bytes
        total = sum(x.nbytes for x in jax.tree.leaves(state))
        # Besides the buffers: count, key, last_tau and the tau histogram only.
        assert total - st.buffer_nbytes(state) == 4 + 8 + 4 + 4 * 17
    # Works on an abstract state (no allocation), e.g. for reporting before a run.
    abstract = jax.eval_shape(st.delayed_gradients(16, 4).init, params)
    assert st.buffer_nbytes(abstract) == 17 * param_bytes


def _delayed_momentum_tx():
    return optax.chain(
        st.delayed_gradients(5, st.geometric(2.0, 5), mitigation=("dc_asgd", "staleness_lr"), seed=11),
        optax.sgd(0.05, momentum=0.9),
    )


def test_resume_from_flax_checkpoint_is_exact():
    tx = _delayed_momentum_tx()
    step = _make_step(tx)
    params = _mlp_params(jax.random.key(0))

    p_full, s_full = params, tx.init(params)
    for t in range(20):
        p_full, s_full = step(p_full, s_full, *_mlp_data(t))

    p, s = params, tx.init(params)
    for t in range(9):
        p, s = step(p, s, *_mlp_data(t))
    blob = flax.serialization.to_bytes((p, s))
    template = (params, tx.init(params))  # A fresh run's state as the restore target.
    p, s = flax.serialization.from_bytes(template, blob)
    for t in range(9, 20):
        p, s = step(p, s, *_mlp_data(t))

    chex.assert_trees_all_equal(p, p_full)
    chex.assert_trees_all_equal(s, s_full)


def test_state_survives_orbax_round_trip(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    tx = _delayed_momentum_tx()
    step = _make_step(tx)
    params = _mlp_params(jax.random.key(0))
    p, s = params, tx.init(params)
    for t in range(7):
        p, s = step(p, s, *_mlp_data(t))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "ckpt", {"params": p, "opt_state": s})
        ckptr.wait_until_finished()
        target = jax.eval_shape(lambda: {"params": params, "opt_state": tx.init(params)})
        restored = ckptr.restore(tmp_path / "ckpt", target)
    restored_state = jax.tree.unflatten(jax.tree.structure(s), jax.tree.leaves(restored["opt_state"]))
    chex.assert_trees_all_equal(restored_state, s)
    chex.assert_trees_all_equal(restored["params"], p)


def test_staleness_metrics_from_chain_state():
    tx = optax.chain(st.delayed_gradients(3, st.constant(2)), optax.sgd(0.1))
    state = tx.init(jnp.zeros(2))
    for _ in range(6):
        _, state = tx.update(jnp.ones(2), state, jnp.zeros(2))
    metrics = jax.jit(st.staleness_metrics)(state)
    assert int(metrics["staleness/last"]) == 2
    np.testing.assert_array_equal(metrics["staleness/hist"], [1, 1, 4, 0])
    np.testing.assert_allclose(metrics["staleness/mean"], (1 + 2 * 4) / 6)
    assert st.staleness_metrics(optax.sgd(0.1).init(jnp.zeros(2))) == {}



# --------------------------------------------------------------------------------------------------------
# Mitigation names and the public surface.
# --------------------------------------------------------------------------------------------------------


def test_mitigation_names_parse_to_their_parts():
    assert st.parse_mitigation("none") == st.parse_mitigation(None) == frozenset()
    assert st.parse_mitigation("dc_asgd") == {"dc_asgd"}
    assert st.parse_mitigation("staleness_lr+dc_asgd") == {"staleness_lr", "dc_asgd"}
    assert st.parse_mitigation(("dc_asgd", "staleness_lr")) == {"staleness_lr", "dc_asgd"}
    assert st.parse_mitigation(("none",)) == frozenset()
    # Every name of the one tuple is accepted by the transform.
    for name in st.MITIGATIONS:
        st.delayed_gradients(1, 1, mitigation=name)


def test_combined_mitigation_name_equals_the_sequence_form():
    def run(mitigation):
        tx = optax.chain(st.delayed_gradients(6, st.uniform(6), mitigation=mitigation, dc_lambda=0.3, seed=3),
                         optax.sgd(_LR))
        return _run_quadratic(tx, 60)

    ws_a, taus_a = run("staleness_lr+dc_asgd")
    ws_b, taus_b = run(("dc_asgd", "staleness_lr"))
    np.testing.assert_array_equal(taus_a, taus_b)
    np.testing.assert_array_equal(ws_a, ws_b)


def test_samplers_are_re_exported_unchanged():
    for name in ("Sampler", "PmfSampler", "constant", "uniform", "geometric", "from_pmf", "sampler_from_perf_model",
                 "MinibatchDraw", "minibatch_weights", "example_weights", "weighted_mean"):
        assert getattr(st, name) is getattr(samplers, name), name
        assert name in st.__all__


# --------------------------------------------------------------------------------------------------------
# Bad input: one clear error naming the field.
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: st.delayed_gradients(-1, 0), "invalid max_staleness=-1: a non-negative integer"),
        (lambda: st.delayed_gradients(2.5, 0), "invalid max_staleness=2.5: a non-negative integer"),
        (lambda: st.delayed_gradients(True, 0), "invalid max_staleness=True: a non-negative integer"),
        (lambda: st.delayed_gradients(2, st.uniform(5)), "invalid max_staleness=2: at least the support"),
        (lambda: st.delayed_gradients(2, 0, mitigation="dc"), "invalid mitigation='dc'"),
        (lambda: st.delayed_gradients(2, 0, mitigation="dc_asgd+staleness_lr"), "invalid mitigation="),
        (lambda: st.delayed_gradients(2, 0, mitigation=("dc_asgd", "lr")), "invalid mitigation="),
        (lambda: st.delayed_gradients(2, 0, mitigation="dc_asgd", dc_lambda=-1.0), "invalid dc_lambda=-1.0"),
        (lambda: st.delayed_gradients(2, 0, mitigation="dc_asgd", dc_lambda=float("nan")), "invalid dc_lambda=nan"),
        (lambda: st.delayed_gradients(2, lambda key: 0), "invalid sampler=.*a sampler"),
        (lambda: st.delayed_gradients(2, 0, seed=-3), "invalid seed=-3"),
    ],
)
def test_bad_input_raises_naming_the_field(make, message):
    with pytest.raises(ConfigError, match=message):
        make()
