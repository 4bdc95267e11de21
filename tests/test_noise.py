"""The gradient noise scale: unbiased estimators, batch-means errors, the measuring step, two runs agreeing."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import config_util
from experiments.configs import testing
from jaxsprint.errors import ConfigError
from jaxsprint.train import noise, optim, trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_estimators_are_unbiased_on_a_gaussian_with_known_mean_and_covariance():
    rng = np.random.default_rng(0)
    d, n_small, b_small, trials = 12, 8, 4, 20_000
    mu = rng.normal(size=d) * 0.3
    scales = rng.uniform(0.5, 2.0, size=d)  # Sigma = diag(scales^2)
    g2_true, trace_true = float(mu @ mu), float(np.sum(scales ** 2))
    per_example = mu + scales * rng.normal(size=(trials, n_small, b_small, d))
    small = per_example.mean(axis=2)                         # [trials, n_small, d]: G_Bs
    big = small.mean(axis=1)                                 # [trials, d]: G_Bb, B_b = n_small * b_small
    small_sq = np.mean(np.sum(small ** 2, -1), axis=1)
    big_sq = np.sum(big ** 2, -1)
    g2, trace = (np.asarray(a) for a in noise.unbiased(small_sq, big_sq, b_small, n_small * b_small))
    for est, true in ((g2, g2_true), (trace, trace_true)):
        se = est.std() / np.sqrt(trials)
        assert abs(est.mean() - true) < 4 * se, (est.mean(), true, se)
    # The naive |G_Bb|^2 is off by tr(Sigma) / B_b, many standard errors: the test can see a bias.
    naive_se = big_sq.std() / np.sqrt(trials)
    assert big_sq.mean() - g2_true > 10 * naive_se
    # The window's ratio recovers B_simple = tr(Sigma) / |G|^2 within its standard error's reach.
    est = noise.window_estimate(np.arange(trials), g2, trace, num_blocks=20)
    assert abs(est.b_simple - trace_true / g2_true) < 4 * est.b_simple_se


def test_batch_means_standard_error_matches_the_spread_of_autocorrelated_windows():
    rng = np.random.default_rng(1)
    reps, steps, phi = 400, 400, 0.5
    ratios, ses = [], []
    for _ in range(reps):
        e = rng.normal(size=(2, steps))
        for t in range(1, steps):  # AR(1) noise: consecutive steps are correlated
            e[:, t] = phi * e[:, t - 1] + np.sqrt(1 - phi ** 2) * e[:, t]
        est = noise.window_estimate(np.arange(steps), 1.0 + 0.5 * e[0], 50.0 + 20.0 * e[1], num_blocks=10)
        ratios.append(est.b_simple)
        ses.append(est.b_simple_se)
    spread, typical = np.std(ratios), np.median(ses)
    assert abs(np.mean(ratios) - 50.0) < 3 * spread / np.sqrt(reps) + 0.5  # the ratio's bias is small here
    assert 0.7 < typical / spread < 1.3, (typical, spread)


def test_moving_average_is_bias_corrected_and_by_progress_covers_every_step():
    ema = noise.ema_init()
    assert noise.smoothed(ema) == {}
    assert "noise_b_simple" not in noise.smoothed(noise.ema_update(ema, -1.0, 10.0, 0.95))
    ema = noise.ema_update(ema, 2.0, 10.0, 0.95)
    assert noise.smoothed(ema) == pytest.approx({"noise_g2_ema": 2.0, "noise_trace_ema": 10.0,
                                                 "noise_b_simple": 5.0})
    windows = noise.by_progress(np.arange(1, 101), np.ones(100), np.arange(100.0), num_windows=4)
    assert [(w.first_step, w.last_step) for w in windows] == [(1, 25), (26, 50), (51, 75), (76, 100)]
    assert windows[0].b_simple < windows[-1].b_simple


def _config(**fields):
    return config_util.override(testing.get_config().to_dict(), **{
        "optimizer.name": "sgd", "lr.scaling": "none", "label_smoothing": 0.1, **fields})


def _batch(n=64):
    from jaxsprint.train import data

    b = data.load_digits(8).train.get_batch(np.arange(n))
    return b["image"], b["label"]


@pytest.mark.devices(8)
@pytest.mark.parametrize("accum", [1, 2])
def test_measuring_step_equals_the_plain_step_and_measures_each_devices_micro_batch(accum):
    images, labels = _batch()
    plain = trainer.build_experiment(_config(grad_accum_steps=accum))
    measuring = trainer.build_experiment(_config(grad_accum_steps=accum, **{"noise_scale.enabled": True}))
    state = plain.init_state()
    x = plain.eval_preprocess(images)
    w = np.ones(len(labels), np.float32)
    s_plain, m_plain = jax.device_get(plain.train_step(plain.init_state(), x, labels, w))
    s_meas, m_meas = jax.device_get(measuring.train_step(measuring.init_state(), x, labels, w))
    for a, b in zip(jax.tree.leaves((s_plain.params, s_plain.batch_stats)),
                    jax.tree.leaves((s_meas.params, s_meas.batch_stats))):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    assert m_meas["loss"] == pytest.approx(m_plain["loss"], rel=1e-5)
    assert "noise_g2" not in m_plain

    # Reference: each device's i-th chunk is micro-batch i; its gradient is that of its share of the loss.
    model, b, n_small = plain.model, len(labels), 8 * accum
    xs, ys = np.asarray(jax.device_get(x)), np.asarray(labels)

    def share(params, chunk_x, chunk_y):
        logits, _ = model.apply({"params": params, "batch_stats": state.batch_stats}, chunk_x, train=True,
                                mutable=["batch_stats"])
        return jnp.sum(optim.smoothed_cross_entropy(logits, chunk_y, 10, 0.1)) / b

    params = jax.device_get(state.params)
    grads = []
    for dev in np.split(np.arange(b), 8):
        for chunk in np.split(dev, accum):
            grads.append(jax.grad(share)(params, xs[chunk], ys[chunk]))
    small_sq_sum = sum(float(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(gr))) for gr in grads)
    total = jax.tree.map(lambda *g: sum(g), *grads)
    ref = noise.unbiased(n_small * small_sq_sum, float(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(total))),
                         b / n_small, b)
    assert float(m_meas["noise_g2"]) == pytest.approx(float(ref[0]), rel=1e-3)
    assert float(m_meas["noise_trace"]) == pytest.approx(float(ref[1]), rel=1e-3)


@pytest.mark.devices(8)
@pytest.mark.parametrize("fields, message", [
    ({"num_devices": 1}, "devices (1) x config.grad_accum_steps (1) is 1"),
    ({"bn.reduction": "global"}, "per_device' or 'group' on 8 devices"),
    ({"async_emulation.enabled": True, "async_emulation.num_sub_batches": 4,
      "async_emulation.k_pmf": (0.0, 0.25, 0.25, 0.25, 0.25)}, "num_sub_batches=0"),
    ({"noise_scale.ema_decay": 1.0}, "a number in [0, 1)"),
])
def test_settings_the_measurement_cannot_use_are_refused(fields, message):
    from jaxsprint.train import settings

    config = _config(**{"noise_scale.enabled": True}, **fields)
    with pytest.raises(ConfigError, match="noise_scale") as err:
        settings.validate_config(config, 1 if fields.get("num_devices") == 1 else 8)
    assert message in str(err.value)


def _measure(tmp_path, seed):
    out = tmp_path / f"seed{seed}"
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "train.py"),
           "--config=" + os.path.join(ROOT, "experiments", "configs", "noise_scale.py"), f"--workdir={out}",
           f"--config.seed={seed}", "--config.num_train_steps=160", "--config.noise_scale.num_windows=2",
           "--config.model=tiny", "--config.image_size=8", "--config.eval_every_epochs=0"]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "B_simple" in proc.stdout
    return json.loads((out / "summary.json").read_text())["noise_scale"]


def test_two_independent_runs_agree_within_their_standard_errors(tmp_path):
    (a, wa), (b, wb) = ((r["run"], r["windows"]) for r in (_measure(tmp_path, seed) for seed in (0, 1)))
    assert a["num_steps"] == b["num_steps"] == 160 and [w["num_steps"] for w in wa + wb] == [80] * 4
    for r in (a, b):
        assert 0 < r["b_simple_se"] < 0.5 * r["b_simple"]  # a measurement, not noise
    assert abs(a["b_simple"] - b["b_simple"]) < 2 * np.hypot(a["b_simple_se"], b["b_simple_se"]), (a, b)
