"""Schedules, LARS masking, label smoothing, derived hyper-parameters and the checks of the recipe's settings."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.configs import default
from config_util import CONFIG_MODULES, default_with
from jaxsprint.train import optim
from jaxsprint.errors import ConfigError


def _config(**lr):
    c = default.get_config()
    c.batch_size, c.num_epochs = 512, 40
    c.lr.base, c.lr.warmup_epochs, c.lr.end_lr, c.lr.poly_power = 1.0, 5.0, 0.0, 2.0
    for k, v in lr.items():
        c.lr[k] = v
    return c


def test_derived_hparams_linear_scaling():
    hp = optim.derive_hparams(_config(), 1500)
    assert (hp.steps_per_epoch, hp.total_steps, hp.warmup_steps) == (2, 80, 10)
    assert hp.peak_lr == pytest.approx(2.0)  # 1.0 * 512 / 256
    c = _config(scaling="none")
    assert optim.derive_hparams(c, 1500).peak_lr == pytest.approx(1.0)


@pytest.mark.parametrize("schedule,step,expected", [
    ("poly", 0, 0.0), ("poly", 5, 1.0), ("poly", 10, 2.0), ("poly", 45, 2.0 * (1 - 35 / 70) ** 2),
    ("poly", 80, 0.0),
    ("cosine", 10, 2.0), ("cosine", 45, 1.0), ("cosine", 80, 0.0),
    ("constant", 3, 0.6), ("constant", 60, 2.0),
])
def test_schedule_values(schedule, step, expected):
    c = _config(schedule=schedule)
    hp = optim.derive_hparams(c, 1500)
    assert float(optim.make_schedule(c, hp)(step)) == pytest.approx(expected, abs=1e-6)


def test_poly_power_and_end_lr():
    c = _config(schedule="poly", poly_power=2.2, end_lr=0.1, warmup_epochs=0.0)
    hp = optim.derive_hparams(c, 1500)
    f = optim.make_schedule(c, hp)
    assert float(f(0)) == pytest.approx(2.0)
    assert float(f(20)) == pytest.approx(0.1 + 1.9 * (1 - 20 / 80) ** 2.2, rel=1e-6)
    assert float(f(80)) == pytest.approx(0.1)


def test_lars_leaves_bn_and_bias_unscaled():
    c = _config(scaling="none", warmup_epochs=0.0, schedule="constant")
    c.lr.base, c.optimizer.name, c.optimizer.weight_decay = 0.5, "lars", 0.01
    hp = optim.derive_hparams(c, 1500)
    tx = optim.make_optimizer(c, optim.make_schedule(c, hp))
    params = {"conv": {"kernel": jnp.full((3, 3), 2.0)}, "bn": {"scale": jnp.ones(3), "bias": jnp.zeros(3)},
              "dense": {"bias": jnp.ones(3)}}
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.3), params)
    updates, _ = tx.update(grads, tx.init(params), params)
    # 1-D parameters: plain SGD step (first momentum step = gradient), no decay, no trust ratio.
    for path in (("bn", "scale"), ("bn", "bias"), ("dense", "bias")):
        np.testing.assert_allclose(updates[path[0]][path[1]], -0.5 * 0.3, rtol=1e-6)
    w, g = np.full((3, 3), 2.0), np.full((3, 3), 0.3)
    d = g + 0.01 * w
    trust = 0.001 * np.linalg.norm(w) / np.linalg.norm(d)
    np.testing.assert_allclose(updates["conv"]["kernel"], -0.5 * trust * d, rtol=1e-5)


def test_label_smoothing_matches_numpy():
    logits = np.array([[2.0, -1.0, 0.5, 0.0], [0.1, 0.2, 3.0, -2.0]], np.float32)
    labels = np.array([0, 2])
    s, k = 0.1, 4
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    target = np.full((2, k), s / k)
    target[np.arange(2), labels] += 1 - s
    expected = -(target * logp).sum(-1)
    got = optim.smoothed_cross_entropy(jnp.asarray(logits), jnp.asarray(labels), k, s)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_bad_values_are_config_errors():
    c = _config()
    c.lr.base = -0.1
    with pytest.raises(ConfigError, match="config.lr.base"):
        optim.make_optimizer(c, optax.constant_schedule(0.1))
    c = _config()
    c.optimizer.name = "adamw"
    with pytest.raises(ConfigError, match="config.optimizer.name"):
        optim.make_optimizer(c, optax.constant_schedule(0.1))
    c = _config()
    c.grad_accum_steps = 3
    with pytest.raises(ConfigError, match="grad_accum_steps"):
        optim.derive_hparams(c, 1500)


# --------------------------------------------------------------------------------------------------------
# validate_config: every rejected kind, and every shipped config passes.
# --------------------------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


_with = default_with


@pytest.mark.parametrize("module", CONFIG_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_shipped_config_passes(module):
    optim.validate_config(module.get_config())


@pytest.mark.parametrize("field, value", [
    ("optimizer.name", "adamw"),
    ("optimizer.momentum", NAN), ("optimizer.momentum", -0.1), ("optimizer.momentum", 1.0),
    ("optimizer.momentum", "0.9"),
    ("optimizer.weight_decay", NAN), ("optimizer.weight_decay", -1e-4), ("optimizer.weight_decay", INF),
    ("optimizer.lars_trust_coefficient", 0.0), ("optimizer.lars_trust_coefficient", -0.001),
    ("optimizer.lars_trust_coefficient", NAN),
    ("optimizer.lars_eps", -1e-9), ("optimizer.lars_eps", NAN),
    ("optimizer.lars_nesterov", "yes"),
    ("optimizer.lamb_b1", 1.0), ("optimizer.lamb_b2", NAN), ("optimizer.lamb_b2", -0.5),
    ("optimizer.lamb_eps", -1e-6), ("optimizer.lamb_eps", INF),
    ("lr.base", NAN), ("lr.base", INF), ("lr.base", -0.1), ("lr.base", True),
    ("lr.scaling", "sqrt"),
    ("lr.reference_batch", 0), ("lr.reference_batch", -256), ("lr.reference_batch", NAN),
    ("lr.reference_batch", INF),
    ("lr.warmup_epochs", NAN), ("lr.warmup_epochs", -1.0), ("lr.warmup_epochs", INF),
    ("lr.warmup_init", -0.1), ("lr.warmup_init", 1.5), ("lr.warmup_init", NAN),
    ("lr.schedule", "step"),
    ("lr.poly_power", NAN), ("lr.poly_power", 0.0), ("lr.poly_power", -2.0), ("lr.poly_power", INF),
    ("lr.end_lr", NAN), ("lr.end_lr", -0.01), ("lr.end_lr", INF),
    ("label_smoothing", NAN), ("label_smoothing", -0.1), ("label_smoothing", 1.0),
])
def test_each_bad_value_names_its_field(field, value):
    c = _with(**{field: value})
    with pytest.raises(ConfigError, match=rf"^invalid config\.{re.escape(field)}=") as e:
        optim.validate_config(c)
    assert e.value.field == f"config.{field}"
    # The factories check the same settings first.
    with pytest.raises(ConfigError, match=rf"config\.{re.escape(field)}="):
        optim.derive_hparams(c, 1500)


def test_limits_that_are_allowed():
    for overrides in ({"optimizer.momentum": 0.0}, {"lr.base": 0.0}, {"lr.warmup_init": 1.0},
                      {"label_smoothing": 0.0}, {"lr.end_lr": 0.0}):
        optim.validate_config(_with(**overrides))
