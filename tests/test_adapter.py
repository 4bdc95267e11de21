"""Tests for jaxsprint.emulation.adapter: the checks of config.async_emulation and the objects built from it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from config_util import CONFIG_MODULES, default_with
from jaxsprint.emulation import adapter, samplers
from jaxsprint.emulation import staleness as st
from jaxsprint.errors import ConfigError
from jaxsprint.perf import sprint

NAN, INF = float("nan"), float("inf")


def _config(**overrides):
    """The default config with the emulation on and dotted overrides (``"async_emulation.pmf": (...)``)."""
    return default_with(**{"async_emulation.enabled": True, **overrides})


def _a(**kw):
    return _config(**{f"async_emulation.{k}": v for k, v in kw.items()})


@pytest.mark.parametrize("module", CONFIG_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_shipped_config_passes_enabled_or_not(module):
    c = module.get_config()
    adapter.validate_config(c)
    c.async_emulation.enabled = True
    adapter.validate_config(c)


def test_disabled_emulation_ignores_its_fields():
    c = _config(**{"async_emulation.enabled": False, "async_emulation.sampler": "poisson",
                   "async_emulation.max_staleness": -1, "async_emulation.pmf": (NAN,)})
    adapter.validate_config(c)
    assert adapter.from_config(c) == (None, None)


@pytest.mark.parametrize("overrides, field", [
    ({"enabled": "yes"}, "enabled"),
    ({"max_staleness": -1}, "max_staleness"),
    ({"max_staleness": 2.5}, "max_staleness"),
    ({"max_staleness": True}, "max_staleness"),
    ({"sampler": "poisson"}, "sampler"),
    ({"sampler": "constant", "staleness": -1, "max_staleness": 2}, "staleness"),
    ({"sampler": "constant", "staleness": 3, "max_staleness": 2}, "staleness"),
    ({"sampler": "uniform", "staleness": 1.5, "max_staleness": 2}, "staleness"),
    ({"sampler": "geometric", "mean_staleness": NAN, "max_staleness": 4}, "mean_staleness"),
    ({"sampler": "geometric", "mean_staleness": INF, "max_staleness": 4}, "mean_staleness"),
    ({"sampler": "geometric", "mean_staleness": -1.0, "max_staleness": 4}, "mean_staleness"),
    ({"sampler": "geometric", "mean_staleness": 4.5, "max_staleness": 4}, "mean_staleness"),
    ({"sampler": "pmf", "pmf": (0.5, 0.6), "max_staleness": 1}, "pmf"),
    ({"sampler": "pmf", "pmf": (0.5, NAN), "max_staleness": 1}, "pmf"),
    ({"sampler": "pmf", "pmf": (1.2, -0.2), "max_staleness": 1}, "pmf"),
    ({"sampler": "pmf", "pmf": (), "max_staleness": 1}, "pmf"),
    ({"sampler": "pmf", "pmf": (0.0, 0.0, 1.0), "max_staleness": 1}, "pmf"),
    ({"mitigation": "dc"}, "mitigation"),
    ({"mitigation": "dc_asgd+staleness_lr"}, "mitigation"),   # one spelling: staleness.MITIGATIONS
    ({"dc_lambda": NAN}, "dc_lambda"),
    ({"dc_lambda": -0.1}, "dc_lambda"),
    ({"num_sub_batches": -1}, "num_sub_batches"),
    ({"num_sub_batches": 2.0}, "num_sub_batches"),
    ({"num_sub_batches": 7}, "num_sub_batches"),                # 512 % 7
    ({"num_sub_batches": 8, "k_pmf": (0.5, 0.5)}, "k_pmf"),
    ({"num_sub_batches": 8, "k_pmf": (0.0, 0.5, 0.6)}, "k_pmf"),
    ({"num_sub_batches": 8, "k_pmf": (0.0, NAN)}, "k_pmf"),
    ({"num_sub_batches": 2, "k_pmf": (0.0, 0.0, 0.0, 1.0)}, "k_pmf"),
    ({"sampler": "perf_model", "workers": 0}, "workers"),
    ({"sampler": "perf_model", "workers": 2.5}, "workers"),
    ({"sampler": "perf_model", "t_compute_s": 0.0}, "t_compute_s"),
    ({"sampler": "perf_model", "t_compute_s": NAN}, "t_compute_s"),
    ({"sampler": "perf_model", "t_compute_s": -1.0}, "t_compute_s"),
    ({"sampler": "perf_model", "t_update_s": INF}, "t_update_s"),
    ({"sampler": "perf_model", "t_update_s": 0.0}, "t_update_s"),
    ({"sampler": "perf_model", "t_compute_cv": -0.1}, "t_compute_cv"),
    ({"sampler": "perf_model", "t_compute_cv": NAN}, "t_compute_cv"),
    # The model is also used for K when num_sub_batches > 0 and k_pmf is empty.
    ({"num_sub_batches": 8, "workers": 0}, "workers"),
])
def test_each_bad_value_names_its_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"^invalid config\.async_emulation\.{field}=") as e:
        adapter.validate_config(_a(**overrides))
    assert e.value.field == f"config.async_emulation.{field}"
    with pytest.raises(ConfigError, match=rf"config\.async_emulation\.{field}="):  # from_config checks first
        adapter.from_config(_a(**overrides))


def test_mini_batch_needs_no_accumulation():
    with pytest.raises(ConfigError, match="config.async_emulation.num_sub_batches=8: .*without gradient"):
        adapter.validate_config(_config(**{"async_emulation.num_sub_batches": 8, "grad_accum_steps": 2}))


def test_limits_are_inclusive_and_unused_fields_are_not_checked():
    for kw in ({"sampler": "geometric", "mean_staleness": 4, "max_staleness": 4},
               {"sampler": "constant", "staleness": 4, "max_staleness": 4},
               {"sampler": "pmf", "pmf": (0.5, 0.5, 0.0, 0.0), "max_staleness": 1},
               {"num_sub_batches": 2, "k_pmf": (0.0, 0.0, 1.0, 0.0)},
               {"sampler": "constant", "workers": 0, "t_compute_s": NAN},   # the model is not used
               {"sampler": "constant", "mean_staleness": NAN, "pmf": (NAN,)},
               {"mitigation": "staleness_lr+dc_asgd"}):
        adapter.validate_config(_a(**kw))
    for name in st.MITIGATIONS:
        adapter.validate_config(_a(mitigation=name))


# --------------------------------------------------------------------------------------------------------
# from_config builds what the old train.make_async_emulation built.
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, expected", [
    ({"sampler": "constant", "staleness": 3, "max_staleness": 5}, st.constant(3).pmf),
    ({"sampler": "uniform", "staleness": 4, "max_staleness": 4}, st.uniform(4).pmf),
    ({"sampler": "geometric", "mean_staleness": 2.0, "max_staleness": 6}, st.geometric(2.0, 6).pmf),
    ({"sampler": "pmf", "pmf": (0.1, 0.0, 0.9), "max_staleness": 3}, np.array([0.1, 0.0, 0.9])),
])
def test_sampler_pmfs_equal_the_factories(kw, expected):
    np.testing.assert_array_equal(adapter.sampler_from_config(_a(**kw)).pmf, expected)


def test_perf_model_sampler_is_the_models_pmf_on_the_buffer():
    c = _a(sampler="perf_model", max_staleness=6)
    a = c.async_emulation
    stale, count = sprint.delay_pmfs(a.workers, a.t_compute_s, a.t_update_s, a.t_compute_cv, max_staleness=6,
                                     max_count=1)
    count = np.asarray(count, np.float64)
    thinned = samplers.nonempty_staleness_pmf(np.asarray(stale, np.float64), count[0] / count.sum())
    want = st.sampler_from_perf_model(thinned, max_staleness=6, tail="renormalize")
    got = adapter.sampler_from_config(c)
    np.testing.assert_array_equal(got.pmf, want.pmf)
    assert got.max_value <= 6 and got.pmf.sum() == pytest.approx(1.0)
    assert 2.0 < got.mean < 4.0  # E[S] = T_c / T_u + 1 = 3 for 8 workers at 0.1 s / 0.05 s (K = 0 is rare)
    # Where most cycles are empty (1 worker, T_c = 4 T_u) the delay in applied updates is far below 5 versions.
    c2 = _a(sampler="perf_model", max_staleness=16)
    c2.async_emulation.workers, c2.async_emulation.t_compute_s, c2.async_emulation.t_update_s = 1, 0.2, 0.05
    stale2, _ = sprint.delay_pmfs(1, 0.2, 0.05, c2.async_emulation.t_compute_cv, max_staleness=16, max_count=1)
    assert np.dot(np.arange(17), np.asarray(stale2)) > 4.5
    assert adapter.sampler_from_config(c2).mean < 2.0


def test_k_pmf_from_the_model_is_conditioned_on_k_at_least_one():
    c = _a(sampler="constant", max_staleness=0, num_sub_batches=16)
    a = c.async_emulation
    _, count = sprint.delay_pmfs(a.workers, a.t_compute_s, a.t_update_s, a.t_compute_cv, max_staleness=1,
                                 max_count=16)
    count = np.asarray(count, np.float64)
    tx, (n_sub, k_pmf) = adapter.from_config(c)
    assert n_sub == 16 and k_pmf.dtype == np.float64 and k_pmf.shape == (17,)
    assert k_pmf[0] == 0.0 and k_pmf.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(k_pmf[1:], count[1:] / count[1:].sum(), rtol=1e-12)
    np.testing.assert_array_equal(k_pmf, adapter.k_pmf_from_config(c))


def test_explicit_k_pmf_is_used_as_given():
    k = (0, 0, 0, 0, 0.5, 0, 0, 0, 0.5)
    _, (n_sub, k_pmf) = adapter.from_config(_a(num_sub_batches=8, k_pmf=k))
    assert n_sub == 8
    np.testing.assert_array_equal(k_pmf, np.asarray(k, np.float64))
    assert adapter.from_config(_a(num_sub_batches=0))[1] is None


def _run(tx, n_steps=40):
    a = jnp.array([1.0, 0.5, 2.0])
    w = jnp.array([3.0, -2.0, 1.0])
    state = tx.init(w)
    taus = []
    for _ in range(n_steps):
        g, state = tx.update(a * w - 1.0, state, w)
        w = optax.apply_updates(w, jax.tree.map(lambda u: -0.1 * u, g))
        taus.append(int(st.find_delayed_state(state).last_tau))
    return np.asarray(w), taus


@pytest.mark.parametrize("mitigation", st.MITIGATIONS)
def test_transform_equals_the_old_construction_bit_for_bit(mitigation):
    c = _a(sampler="uniform", staleness=3, max_staleness=3, mitigation=mitigation, dc_lambda=0.3)
    c.seed = 5
    tx, minibatch = adapter.from_config(c)
    assert minibatch is None
    old_mitigation = mitigation.split("+") if mitigation != "none" else "none"  # train.make_async_emulation's
    old = st.delayed_gradients(3, st.uniform(3), mitigation=old_mitigation, dc_lambda=0.3, seed=5 + 7)
    (w_new, taus_new), (w_old, taus_old) = _run(tx), _run(old)
    assert taus_new == taus_old and len(set(taus_new)) == 4
    np.testing.assert_array_equal(w_new, w_old)


def test_model_failures_are_config_errors_naming_the_emulation(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("the model cannot predict this cluster")

    monkeypatch.setattr(adapter, "_perf_model_pmfs", broken)
    with pytest.raises(ConfigError, match=r"^invalid config\.async_emulation=.*cannot predict") as e:
        adapter.from_config(_a(sampler="perf_model", max_staleness=4))
    assert e.value.value["sampler"] == "perf_model"


def test_model_with_no_update_of_k_at_least_one_is_rejected(monkeypatch):
    monkeypatch.setattr(adapter, "_perf_model_pmfs",
                        lambda a, m, n: (np.eye(m + 1)[0], np.eye(n + 1)[0]))  # every update empty
    with pytest.raises(ConfigError, match=r"^invalid config\.async_emulation=.*no update with K >= 1"):
        adapter.from_config(_a(num_sub_batches=4))


def test_every_sampler_name_builds():
    for name in samplers.SAMPLERS:
        kw = {"sampler": name, "max_staleness": 8, "staleness": 2, "mean_staleness": 2.0, "pmf": (0.5, 0.5)}
        assert adapter.sampler_from_config(_a(**kw)).max_value <= 8
