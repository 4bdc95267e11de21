"""jaxsprint.plan.network: the planner's emulated runs of a zoo network through the trainer."""
import tempfile

import numpy as np
import pytest

from experiments.configs import default
from jaxsprint.errors import ConfigError
from jaxsprint.plan import emulator, network
from jaxsprint.train import trainer


def _base(model="tiny_nobn"):
    c = default.get_config()
    c.model, c.dataset, c.image_size = model, "digits", 8
    c.optimizer.name, c.optimizer.momentum, c.optimizer.weight_decay = "sgd", 0.5, 0.0
    c.augment.kind, c.label_smoothing = "none", 0.0
    return c


def _spec(staleness, minibatch, lr=0.1):
    s = np.zeros(emulator.MAX_STALENESS + 1)
    s[:len(staleness)] = staleness
    return emulator.RunSpec(s, np.asarray(minibatch, np.float64), lr)


def test_a_runs_config_draws_the_specs_pmfs_and_counts_empty_cycles():
    em = network.NetworkEmulator(_base(), seeds=2, max_updates=400, eval_every=20, target_accuracy=0.9)
    mb = np.zeros(21)
    mb[0], mb[10], mb[20] = 0.5, 0.25, 0.25  # half of the cycles are empty
    config, cycles_per_step = em.training_config(_spec([0.5, 0.3, 0.2], mb), seed=1)
    a = config.async_emulation
    assert config.batch_size == 20 and a.num_sub_batches == 20  # one example per sub-batch, the largest draw
    assert a.k_pmf[0] == 0 and a.k_pmf[10] == pytest.approx(0.5) and a.k_pmf[20] == pytest.approx(0.5)
    tail = np.zeros(1001)
    tail[1:1000], tail[1000] = 0.9995 / 999, 0.0005  # a rare huge draw is lumped at the 99.9% mini-batch
    lumped, _ = em.training_config(_spec([1.0], tail), seed=0)
    assert lumped.batch_size == 999 and sum(lumped.async_emulation.k_pmf) == pytest.approx(1.0)
    # A spec that knows its sub-batch: whole sub-batches, each its own BN group (as SPRINT's learners).
    whole = np.zeros(49)
    whole[16], whole[32], whole[48] = 0.2, 0.5, 0.3
    spec = _spec([1.0], whole)
    grouped, _ = em.training_config(emulator.RunSpec(spec.staleness_pmf, whole, 0.1, sub_batch=16), seed=0)
    assert (grouped.batch_size, grouped.async_emulation.num_sub_batches) == (48, 3)
    assert (grouped.bn.reduction, grouped.bn.group_size) == ("group", 16)
    assert grouped.async_emulation.k_pmf == pytest.approx((0.0, 0.2, 0.5, 0.3))
    ragged = whole.copy()
    ragged[20] = 0.1  # a mini-batch that is not whole sub-batches: one example per sub-batch, global BN
    flat, _ = em.training_config(emulator.RunSpec(spec.staleness_pmf, ragged / ragged.sum(), 0.1, sub_batch=16), 0)
    assert flat.bn.reduction == "global" and flat.async_emulation.num_sub_batches == flat.batch_size
    assert a.pmf == pytest.approx((0.5, 0.3, 0.2)) and a.max_staleness == 2 and a.sampler == "pmf"
    assert cycles_per_step == pytest.approx(2.0) and config.num_train_steps == 200
    assert config.seed == 1 and config.stop_at_accuracy == 0.9 and config.lr.base == pytest.approx(0.1)
    assert "resnet8" in network.NetworkEmulator(_base("resnet8"), seeds=1).describe()
    with pytest.raises(ConfigError, match="config.model"):
        network.NetworkEmulator(_base("mlp"))


def test_a_run_without_staleness_at_the_full_bucket_is_synchronous_training():
    em = network.NetworkEmulator(_base(), seeds=1, max_updates=40, eval_every=10)
    full = np.zeros(33)
    full[32] = 1.0
    result = em.run(_spec([1.0], full))
    assert result.updates.tolist() == [10.0, 20.0, 30.0, 40.0]
    # The same training with the emulation off: the plain trainer's evaluations.
    config, _ = em.training_config(_spec([1.0], full), seed=0)
    with config.unlocked():
        config.async_emulation.enabled = False
    with tempfile.TemporaryDirectory() as d:
        trainer.train_and_evaluate(config, d)
        steps, acc = network._eval_curve(d)
    assert steps.tolist() == [10, 20, 30, 40]
    np.testing.assert_allclose(result.accuracy[0], acc, atol=1e-6)
    # A run that diverges counts as never reaching the target from there on.
    diverging = em.run(_spec([1.0], full, lr=1e6))
    assert np.all(diverging.accuracy[0, -2:] == 0.0)
    assert result.accuracy[0, -1] > 0.2  # it learned (10 classes: chance is 0.1)


def test_the_stall_check_resumes_bit_for_bit_and_stops_a_run_that_does_not_learn():
    full = np.zeros(33)
    full[32] = 1.0
    plain = network.NetworkEmulator(_base(), seeds=1, max_updates=160, eval_every=10)
    checked = network.NetworkEmulator(_base(), seeds=1, max_updates=160, eval_every=10, target_accuracy=0.99)
    a, b = plain.run(_spec([1.0], full, lr=0.3)), checked.run(_spec([1.0], full, lr=0.3))
    np.testing.assert_array_equal(a.accuracy, b.accuracy)  # checked at 40 updates, resumed, never stopped
    frozen = checked.run(_spec([1.0], full, lr=1e-7))
    assert np.all(frozen.accuracy[0, 4:] == 0.0)  # stopped at the check: never reaches the target
    assert network.stalled(np.array([0.1, 0.12, 0.15]), 0.95) and not network.stalled(np.array([0.1, 0.3]), 0.95)
