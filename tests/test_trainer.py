"""Train step invariants: sharded == unsharded, ghost BN differs, accumulation, exact resume, NaN guard."""
import functools
import os
import re

import jax
import optax
import numpy as np
import pytest

from experiments.configs import testing
from jaxsprint.train import trainer
from jaxsprint.errors import ConfigError, NonFiniteError


def _config(**kw):
    c = testing.get_config()
    c.optimizer.name, c.optimizer.momentum, c.lr.scaling = "sgd", 0.9, "none"
    for k, v in kw.items():
        node, *rest = k.split(".")
        if rest:
            c[node][rest[0]] = v
        else:
            c[k] = v
    return c


def _one_step(config, images, labels):
    exp = trainer.build_experiment(config)
    state = exp.init_state()
    x = exp.eval_preprocess(images)  # deterministic input: no augmentation randomness
    state, metrics = exp.train_step(state, x, labels, np.ones(len(labels), np.float32))
    return jax.device_get((state.params, state.batch_stats, metrics))


@functools.lru_cache(maxsize=None)
def _one_step_of(n_devices, reduction, **kw):
    """`_one_step` of the testing config on `_batch()`, computed once per process (the BatchNorm tests share
    the 8-device per-device run)."""
    images, labels = _batch()
    return _one_step(_config(num_devices=n_devices, **{"bn.reduction": reduction}, **kw), images, labels)


def _batch(n=64):
    from jaxsprint.train import data

    ds = data.load_digits(8)
    b = ds.train.get_batch(np.arange(n))
    return b["image"], b["label"]


def _init_key():
    """The key of the eager inits: rbg (no test here reads the values; eager threefry compiles a program per
    parameter shape)."""
    return jax.random.key(0, impl="rbg")


def _max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.devices(8)
def test_global_bn_on_8_devices_equals_1_device():
    p8, s8, m8 = _one_step_of(8, "global")
    p1, s1, m1 = _one_step_of(1, "global")
    assert _max_diff(p8, p1) < 1e-5
    assert _max_diff(s8, s1) < 1e-5
    assert abs(float(m8["loss"]) - float(m1["loss"])) < 1e-5
    # Ghost BN (each device normalises its 8 examples) is measurably different.
    pd, sd, _ = _one_step_of(8, "per_device")
    assert _max_diff(pd, p1) > 1e-4
    assert _max_diff(sd, s1) > 1e-4


@pytest.mark.devices(8)
def test_per_device_bn_on_8_devices_equals_group_bn_on_1_device():
    pd, sd, _ = _one_step_of(8, "per_device")
    pg, sg, _ = _one_step_of(1, "group", **{"bn.group_size": 8})
    assert _max_diff(pd, pg) < 1e-5 and _max_diff(sd, sg) < 1e-5


@pytest.mark.devices(8)
def test_accumulation_equals_one_large_batch_without_bn():
    images, labels = _batch()
    base = dict(model="tiny_nobn", num_devices=8)
    p1, _, m1 = _one_step(_config(grad_accum_steps=1, **base), images, labels)
    p4, _, m4 = _one_step(_config(grad_accum_steps=4, **base), images, labels)
    assert _max_diff(p1, p4) < 1e-6
    assert abs(float(m1["loss"]) - float(m4["loss"])) < 1e-5


def test_is_time_and_every_steps():
    assert [s for s in range(1, 11) if trainer.is_time(s, 4, 10)] == [4, 8, 10]
    assert [s for s in range(1, 11) if trainer.is_time(s, 0, 10)] == [10]
    assert trainer.every_steps(0.5, 23) == 12 and trainer.every_steps(0, 23) == 0 and trainer.every_steps(0.01, 23) == 1


def test_resume_is_bit_identical(tmp_path):
    c = _config(**{"checkpoint_every_epochs": 0.0})
    full = trainer.train_and_evaluate(c, str(tmp_path / "full"))
    trainer.train_and_evaluate(c, str(tmp_path / "split"), stop_after_steps=3)
    resumed = trainer.train_and_evaluate(c, str(tmp_path / "split"))
    assert resumed["steps"] == full["steps"] == 6
    for a, b in zip(jax.tree.leaves(jax.device_get(full["state"])), jax.tree.leaves(jax.device_get(resumed["state"]))):
        np.testing.assert_array_equal(a, b)
    assert (tmp_path / "full" / "metrics.jsonl").exists() and (tmp_path / "full" / "summary.json").exists()
    assert any((tmp_path / "full" / "tensorboard").iterdir())


def test_nan_guard_names_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    c = _config(**{"lr.base": 1e8, "num_train_steps": 20, "checkpoint_every_epochs": 0.09})  # every 2 steps
    with pytest.raises(NonFiniteError) as e:
        trainer.train_and_evaluate(c, str(tmp_path))
    step = e.value.step
    assert 1 <= step <= 20 and f"step {step}" in str(e.value)
    assert e.value.name.split("/")[0] in trainer.GUARDED + ("eval_loss",)
    saved = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints"))
    assert all(s < step for s in saved)  # never a checkpoint of a state at or after the bad step
    assert not [p for p in tmp_path.rglob("*") if "orbax-checkpoint-tmp" in p.name]
    if saved:
        state, last, _ = trainer.load_checkpoint(trainer.build_experiment(c), str(tmp_path))
        assert last == saved[-1]
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state)))


def test_guard_keeps_the_input_state_when_a_bn_statistic_turns_nan():
    from jaxsprint.train import models

    model = models.create_model("tiny", num_classes=10)
    images, labels = _batch(16)
    x = (images.astype(np.float32) - 50.0) / 50.0
    state = trainer.create_train_state(_init_key(), model, optax.sgd(0.1, momentum=0.9), (1, 8, 8, 1))
    step = jax.jit(trainer.make_train_step(model=model, num_classes=10))
    names = trainer.guard_names(state)
    w = np.ones(16, np.float32)
    good, m = step(state, x, labels, w)
    assert len(m["guard"]) == len(names) and not np.any(np.asarray(m["guard"]))
    assert int(good.step) == 1
    first = sorted(state.batch_stats)[0]
    bad_stats = dict(state.batch_stats, **{first: dict(state.batch_stats[first], var=np.full_like(
        state.batch_stats[first]["var"], np.nan))})
    bad_in = state.replace(batch_stats=bad_stats)
    out, m = step(bad_in, x, labels, w)
    guard = np.asarray(m["guard"])
    assert names[int(np.flatnonzero(~np.isfinite(guard))[0])] == f"batch_stats/{first}/var"
    assert int(out.step) == 0  # the update was not applied: the input state came back
    for a, b in zip(jax.tree.leaves(jax.device_get(out.params)), jax.tree.leaves(jax.device_get(state.params))):
        np.testing.assert_array_equal(a, b)


def test_batch_not_divisible_by_devices_is_a_config_error():
    with pytest.raises(ConfigError, match="config.batch_size"):
        trainer.validate_config(_config(batch_size=60), 8)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """The testing config trained once, read by the tests that compare another run with it."""
    return trainer.train_and_evaluate(_config(), str(tmp_path_factory.mktemp("plain")))


def test_polish_none_reproduces_the_unpolished_run_and_checkpoint_keeps_both(tmp_path, plain_run):
    plain = plain_run
    pol = trainer.train_and_evaluate(_config(**{"polish.mode": "recompute"}), str(tmp_path / "rec"))
    for a, b in zip(jax.tree.leaves(jax.device_get(plain["state"])), jax.tree.leaves(jax.device_get(pol["state"]))):
        np.testing.assert_array_equal(a, b)
    assert plain["eval_accuracy"] == pol["eval_accuracy"] and np.isnan(plain["eval_polished_accuracy"])
    assert 0.0 <= pol["eval_polished_accuracy"] <= 1.0
    # The last checkpoint keeps the EMA and the polished statistics; resuming reads both back.
    again = trainer.train_and_evaluate(_config(**{"polish.mode": "recompute"}), str(tmp_path / "rec"))
    for a, b in zip(jax.tree.leaves(jax.device_get(pol["polished_batch_stats"])),
                    jax.tree.leaves(jax.device_get(again["polished_batch_stats"]))):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(jax.device_get(pol["polished_batch_stats"])),
        jax.tree.leaves(jax.device_get(pol["state"].batch_stats))))


def test_async_emulation_at_zero_staleness_equals_plain_training(tmp_path, plain_run):
    kw = {"async_emulation.enabled": True, "async_emulation.max_staleness": 2, "async_emulation.staleness": 0}
    delayed = trainer.train_and_evaluate(_config(**kw), str(tmp_path / "delayed"))
    np.testing.assert_array_equal(jax.device_get(plain_run["state"].params["Dense_0"]["kernel"]),
                                  jax.device_get(delayed["state"].params["Dense_0"]["kernel"]))


def test_async_emulation_resume_is_exact_and_histograms_are_logged(tmp_path):
    kw = {"async_emulation.enabled": True, "async_emulation.max_staleness": 3,
          "async_emulation.sampler": "uniform", "async_emulation.staleness": 3,
          "async_emulation.mitigation": "staleness_lr+dc_asgd", "async_emulation.num_sub_batches": 8,
          "async_emulation.k_pmf": (0, 0, 0, 0, 0.5, 0, 0, 0, 0.5), "log_every_steps": 1}
    full = trainer.train_and_evaluate(_config(**kw), str(tmp_path / "full"))
    trainer.train_and_evaluate(_config(**kw), str(tmp_path / "split"), stop_after_steps=4)
    resumed = trainer.train_and_evaluate(_config(**kw), str(tmp_path / "split"))
    for a, b in zip(jax.tree.leaves(jax.device_get(full["state"])), jax.tree.leaves(jax.device_get(resumed["state"]))):
        np.testing.assert_array_equal(a, b)
    assert sum(full["staleness_hist"]) == 6 and len(full["staleness_hist"]) == 4
    k = full["minibatch_hist"]
    assert sum(k) == 6 and k[4] + k[8] == 6


def test_bad_async_config_names_the_field():
    c = _config(**{"async_emulation.enabled": True, "async_emulation.sampler": "pmf",
                   "async_emulation.pmf": (0.5, 0.6), "async_emulation.max_staleness": 1})
    with pytest.raises(ConfigError, match="config.async_emulation"):
        trainer.build_experiment(c)


def test_scanned_accumulation_equals_unrolled():
    from jaxsprint.train import models

    model = models.create_model("tiny_nobn", num_classes=10)
    images, labels = _batch(32)
    x = (images.astype(np.float32) - 50.0) / 50.0
    tx = optax.sgd(0.1, momentum=0.9)
    state = trainer.create_train_state(_init_key(), model, tx, (1, 8, 8, 1))
    w = np.ones(32, np.float32)
    outs = []
    for unroll in (8, 1):  # 4 micro-batches: unrolled, then scanned
        step = jax.jit(trainer.make_train_step(model=model, num_classes=10, accum_steps=4, unroll_accum=unroll))
        outs.append(jax.device_get(step(state, x, labels, w)[0].params))
    assert _max_diff(outs[0], outs[1]) < 1e-6


@pytest.mark.devices(2)
def test_native_kernels_in_scanned_accumulation_over_devices():
    """The CPU fast convolution (native kernels where built) inside the accumulation scan, batch sharded over
    the fake devices: the update equals the one with XLA's convolution, and the kernels are in the program."""
    from jaxsprint.train import cpu, models, parallel
    from conv_util import kernels_mode

    fast = kernels_mode()  # the kernels on any CPU that builds them (AVX2 too)
    mesh = parallel.make_mesh(-1)
    rep, dat = parallel.replicated(mesh), parallel.data_sharding(mesh)
    rng = np.random.default_rng(0)
    n = 32
    x = jax.device_put(rng.normal(size=(n, 16, 16, 3)).astype(np.float32), dat)
    y = jax.device_put(rng.integers(0, 10, n).astype(np.int32), dat)
    w = jax.device_put(np.ones(n, np.float32), dat)
    params, programs = {}, {}
    for impl in ("off", fast):
        accel = cpu.acceleration(impl)
        model = models.create_model("resnet8", num_classes=10, **accel.model_kwargs())
        tx = optax.sgd(0.1, momentum=0.9)
        state = jax.jit(lambda k: trainer.create_train_state(k, model, tx, (1, 16, 16, 3)),
                        out_shardings=rep)(jax.random.key(0))
        step = trainer.make_train_step(model=model, num_classes=10, accum_steps=2, unroll_accum=1,
                                     num_shards=jax.device_count(), mesh=mesh)
        f = jax.jit(step, in_shardings=(rep, dat, dat, dat), out_shardings=(rep, rep))
        compiled = f.lower(state, x, y, w).compile()  # run as it is: f(...) would compile it again
        programs[impl] = compiled.as_text()
        params[impl] = jax.device_get(compiled(state, x, y, w)[0].params)
    assert "while" in programs[fast]  # the scanned accumulation
    if accel.kernels:
        assert "jaxsprint_conv_filter_grad_f32" in programs[fast]
        # No activation is gathered: the only all-gathers are of BatchNorm's per-shard (sum, M2), [devices, 2, C].
        gathered = re.findall(r"= (\w+\[[\d,]*\])\S* all-gather\(", programs[fast])
        n_dev = jax.device_count()
        assert all(re.fullmatch(rf"f32\[{n_dev},2,\d+\]", g) for g in gathered), gathered
        assert "jaxsprint_channel_products_f32" in programs[fast]
    assert _max_diff(params["off"], params[fast]) < 1e-6
