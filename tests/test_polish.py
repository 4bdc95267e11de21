"""Final Polishing: exact population statistics, independent of batching and devices; parameters untouched."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.configs import default
from config_util import CONFIG_MODULES
from jaxsprint.train import models, parallel, polish
from jaxsprint.errors import ConfigError, DataError


def _setup(n=40, seed=0):
    model = models.create_model("tiny", num_classes=10)
    x = jax.random.normal(jax.random.key(seed), (n, 8, 8, 3)) * 2.0 + 0.5
    variables = model.init(jax.random.key(1), x[:2], train=False)
    # Non-trivial EMA statistics, as after training.
    variables = {"params": variables["params"],
                 "batch_stats": jax.tree.map(lambda s: s + 0.3, variables["batch_stats"])}
    return model, variables, np.asarray(x)


def _batches(x, b):
    out = []
    for s in range(0, len(x), b):
        img = x[s:s + b]
        mask = np.ones(b, np.float32)
        if len(img) < b:
            mask[len(img):] = 0
            img = np.concatenate([img, np.zeros((b - len(img),) + img.shape[1:], img.dtype)])
        out.append({"image": img, "mask": mask})
    return out


def _pre_bn_activations(model, variables, x):
    """Inputs of the two BatchNorms (the conv outputs), normalising with the given statistics."""
    _, inter = model.apply(variables, x, train=False, capture_intermediates=True)
    return [np.asarray(inter["intermediates"][f"Conv_{i}"]["__call__"][0], np.float64) for i in range(2)]


def test_one_batch_equals_numpy_moments():
    model, variables, x = _setup()
    stats = polish.recompute_batch_stats(model, variables, _batches(x, 40), num_passes=1, num_samples=None)
    for i, act in enumerate(_pre_bn_activations(model, variables, x)):
        np.testing.assert_allclose(stats[f"BatchNorm_{i}"]["mean"], act.mean((0, 1, 2)), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(stats[f"BatchNorm_{i}"]["var"], act.var((0, 1, 2)), rtol=1e-4, atol=1e-5)


def test_split_into_many_batches_equals_concatenated_data():
    model, variables, x = _setup(n=37)
    whole = polish.recompute_batch_stats(model, variables, _batches(x, 37), num_samples=None)
    split = polish.recompute_batch_stats(model, variables, _batches(x, 8), num_samples=None)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(split)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_eight_devices_equal_one_device_with_a_short_last_batch():
    model, variables, x = _setup(n=45)   # 45 = 2 full batches of 16 + 13 (padded, masked)
    one = polish.recompute_batch_stats(model, variables, _batches(x, 16), mesh=parallel.make_mesh(1),
                                       num_samples=None)
    eight = polish.recompute_batch_stats(model, variables, _batches(x, 16), mesh=parallel.make_mesh(8),
                                         num_samples=None)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(eight)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_parameters_are_bit_identical_and_only_stats_change():
    model, variables, x = _setup()
    before = jax.tree.map(np.array, variables)
    stats = polish.recompute_batch_stats(model, variables, _batches(x, 8))
    after = jax.tree.map(np.array, variables)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(stats) == jax.tree.structure(variables["batch_stats"])
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(stats),
                                                     jax.tree.leaves(variables["batch_stats"])))


def test_sample_budget_uses_exactly_the_first_examples():
    model, variables, x = _setup(n=40)
    budget = polish.recompute_batch_stats(model, variables, _batches(x, 8), num_samples=13, num_passes=1)
    first = polish.recompute_batch_stats(model, variables, _batches(x[:13], 13), num_samples=None, num_passes=1)
    for a, b in zip(jax.tree.leaves(budget), jax.tree.leaves(first)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_compiles_once_for_all_batches_and_passes():
    model, variables, x = _setup(n=40)
    traces = []
    base = polish.make_moments_fn(model)

    def counted(v, images, mask):
        traces.append(1)
        return base(v, images, mask)

    polish.recompute_batch_stats(model, variables, _batches(x, 8), num_passes=3, moments_fn=jax.jit(counted))
    assert len(traces) == 1


def test_converged_statistics_equal_train_mode_bn_over_the_whole_set():
    """The fixed point is what train-mode BN computes with all the data as one batch (PreciseBN's target)."""
    model = models.create_model("resnet8", num_classes=10)
    x = np.asarray(jax.random.normal(jax.random.key(5), (48, 8, 8, 3)) * 1.5 + 0.3)
    v = model.init(jax.random.key(1, impl="rbg"), x[:2], train=False)  # eager threefry: a compile per shape
    v = {"params": jax.tree.map(lambda p: p * 1.3, v["params"]),
         "batch_stats": jax.tree.map(lambda s: s * 2.0 + 0.5, v["batch_stats"])}  # far from the fixed point
    info = {}
    stats = polish.recompute_batch_stats(model, v, _batches(x, 16), num_samples=None, info=info)
    one_batch = models.create_model("resnet8", num_classes=10, bn_momentum=0.0)
    _, ref = one_batch.apply(v, x, train=True, mutable=["batch_stats"])
    for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(ref["batch_stats"])):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    n_bn = len(jax.tree.leaves(v["batch_stats"])) // 2
    assert 2 <= info["passes"] <= n_bn + 1 and info["change"] <= 1e-6
    # Too few passes are not the answer: the iteration is needed.
    two = polish.recompute_batch_stats(model, v, _batches(x, 16), num_samples=None, num_passes=2)
    assert max(float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6))) for a, b in
               zip(jax.tree.leaves(two), jax.tree.leaves(ref["batch_stats"]))) > 1e-2


def test_merge_matches_numpy_on_skewed_data():
    rng = np.random.default_rng(0)
    parts = [rng.normal(1e3, 1e-2, (n, 4)).astype(np.float32) for n in (1, 7, 100, 3)]
    acc = None
    for p in parts:
        t = (jnp.float32(len(p)), jnp.asarray(p.mean(0)), jnp.asarray(((p - p.mean(0)) ** 2).sum(0)))
        acc = t if acc is None else polish.merge_moments(acc, t)
    allx = np.concatenate(parts).astype(np.float64)
    np.testing.assert_allclose(acc[1], allx.mean(0), rtol=1e-6)
    np.testing.assert_allclose(acc[2] / acc[0], allx.var(0), rtol=1e-3)


def test_bad_inputs_are_clear_errors():
    model, variables, x = _setup(n=16)
    with pytest.raises(DataError, match=r"^invalid batches=\[\]: at least one batch: .*empty"):
        polish.recompute_batch_stats(model, variables, iter([]))
    bad = _batches(x, 8)
    bad[1] = {"image": bad[1]["image"][:4]}
    with pytest.raises(DataError, match=r"^invalid batches\[1\]\['image'\].shape=\(4, 8, 8, 3\): .*same shape"):
        polish.recompute_batch_stats(model, variables, bad)
    bad = _batches(x, 8)
    bad[0]["mask"] = bad[0]["mask"][:5]
    with pytest.raises(DataError, match=r"^invalid batches\[0\]\['mask'\].shape=\(5,\): \(8,\)"):
        polish.recompute_batch_stats(model, variables, bad)
    with pytest.raises(DataError, match=r"^invalid batches\[0\]\['image'\].shape\[0\]=8: a multiple of the 3"):
        polish.recompute_batch_stats(model, variables, _batches(x, 8),
                                     mesh=jax.sharding.Mesh(np.asarray(jax.devices()[:3]), ("data",)))
    nobn = models.create_model("tiny_nobn", num_classes=10)
    v = nobn.init(jax.random.key(0), x[:2], train=False)
    with pytest.raises(ConfigError, match=r"^invalid variables\['batch_stats'\]=.*nothing to polish"):
        polish.recompute_batch_stats(nobn, v, _batches(x, 8))
    for bad_passes in (-1, 1.5):
        with pytest.raises(ConfigError, match="^invalid num_passes="):
            polish.recompute_batch_stats(model, variables, _batches(x, 8), num_passes=bad_passes)
    for bad_samples in (0, -1, 2.5):
        with pytest.raises(ConfigError, match="^invalid num_samples="):
            polish.recompute_batch_stats(model, variables, _batches(x, 8), num_samples=bad_samples)


# --------------------------------------------------------------------------------------------------------
# validate_config: every rejected kind, and every shipped config passes.
# --------------------------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


def _with(**overrides):
    """The default config (eval batch 512) with ``polish.*`` overrides of any type."""
    d = default.get_config().to_dict()
    for key, value in overrides.items():
        d["polish"][key] = value
    return ml_collections.ConfigDict(d)


@pytest.mark.parametrize("module", CONFIG_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_shipped_config_passes(module):
    c = module.get_config()
    polish.validate_config(c, c.num_devices if c.num_devices > 0 else 8)
    for mode in polish.POLISH_MODES:
        c.polish.mode = mode
        polish.validate_config(c, c.num_devices if c.num_devices > 0 else 8)


@pytest.mark.parametrize("field, value", [
    ("mode", "precise_bn"), ("mode", ""),
    ("num_passes", -1), ("num_passes", 1.5), ("num_passes", NAN),
    ("num_samples", 0), ("num_samples", -2), ("num_samples", 10.5), ("num_samples", NAN),
    ("batch_size", -8), ("batch_size", 100), ("batch_size", 8.0), ("batch_size", NAN),
    ("no_augment_epochs", -1.0), ("no_augment_epochs", NAN), ("no_augment_epochs", INF),
    ("no_augment_epochs", "5"),
])
def test_each_bad_value_names_its_field(field, value):
    with pytest.raises(ConfigError, match=rf"^invalid config\.polish\.{field}=") as e:
        polish.validate_config(_with(**{field: value}), 8)
    assert e.value.field == f"config.polish.{field}"


def test_batch_size_zero_means_the_eval_batch_which_must_split_over_the_devices():
    polish.validate_config(_with(batch_size=0), 8)
    polish.validate_config(_with(batch_size=24, num_samples=-1, num_passes=3, no_augment_epochs=0.0), 8)
    with pytest.raises(ConfigError, match=r"config\.polish\.batch_size=0: 0 \(config\.eval_batch_size=512\)"):
        polish.validate_config(_with(batch_size=0), 7)
