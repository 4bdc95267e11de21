"""Schedules, LARS masking, label smoothing and derived hyper-parameters."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.configs import default
from jaxsprint import optim
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
