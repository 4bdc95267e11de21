"""Models: published parameter counts, BatchNorm reduction modes, moments, zero-init."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsprint.train import models
from jaxsprint.errors import ConfigError


def _count(model, size, channels=3):
    v = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, channels)), train=False))
    return sum(x.size for x in jax.tree.leaves(v["params"]))


@pytest.mark.parametrize("name,classes,size,expected", [
    ("resnet20", 10, 32, 272_474),        # He et al. 2016, CIFAR ResNet-20 (0.27 M)
    ("resnet56", 10, 32, 855_770),
    ("resnet18", 1000, 224, 11_689_512),  # torchvision resnet18
    ("resnet50", 1000, 224, 25_557_032),  # torchvision resnet50 (25.6 M)
])
def test_parameter_counts_match_published(name, classes, size, expected):
    assert _count(models.create_model(name, num_classes=classes), size) == expected


def test_unknown_model_and_dtype_are_config_errors():
    with pytest.raises(ConfigError, match="config.model"):
        models.create_model("resnet7", num_classes=10)
    with pytest.raises(ConfigError, match="config.dtype"):
        models.create_model("tiny", num_classes=10, dtype="float16")


def _bn_apply(group_size, x, mask=None):
    bn = models.BatchNorm(group_size=group_size, momentum=0.9)
    variables = bn.init(jax.random.key(0), x, use_running_average=False)
    y, new = bn.apply(variables, x, use_running_average=False, mask=mask, mutable=["batch_stats", "bn_moments"])
    return y, new


def test_global_bn_normalises_with_batch_moments():
    x = jax.random.normal(jax.random.key(1), (16, 3, 3, 4)) * 3.0 + 1.5
    y, new = _bn_apply(None, x)
    xn = np.asarray(x, np.float64)
    mean, var = xn.mean((0, 1, 2)), xn.var((0, 1, 2))
    np.testing.assert_allclose(y, (xn - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(new["batch_stats"]["mean"], 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new["batch_stats"]["var"], 0.9 + 0.1 * var, rtol=1e-5)
    count, m, m2 = new["bn_moments"]["moments"]
    assert count == 16 * 9
    np.testing.assert_allclose(m, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m2, var * 16 * 9, rtol=1e-5)


def test_group_bn_equals_separate_normalisation_of_each_group():
    x = jax.random.normal(jax.random.key(2), (16, 2, 2, 3)) + jnp.arange(16.0)[:, None, None, None] / 4
    y, new = _bn_apply(4, x)
    parts = [_bn_apply(None, x[i:i + 4])[0] for i in range(0, 16, 4)]
    np.testing.assert_allclose(y, jnp.concatenate(parts), rtol=1e-5, atol=1e-5)
    y_global, _ = _bn_apply(None, x)
    assert float(jnp.max(jnp.abs(y - y_global))) > 0.1
    # Running statistics: mean over groups of the group moments, one array for all devices.
    xg = np.asarray(x).reshape(4, 4, 2, 2, 3)
    np.testing.assert_allclose(new["batch_stats"]["mean"], 0.1 * xg.mean((1, 2, 3)).mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new["batch_stats"]["var"], 0.9 + 0.1 * xg.var((1, 2, 3)).mean(0), rtol=1e-5)


def test_masked_bn_ignores_padded_examples():
    x = jax.random.normal(jax.random.key(3), (8, 2, 2, 3))
    mask = jnp.array([1, 1, 1, 1, 1, 0, 0, 0], jnp.float32)
    y, new = _bn_apply(None, x, mask)
    y5, new5 = _bn_apply(None, x[:5])
    np.testing.assert_allclose(y[:5], y5, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new["batch_stats"]["var"], new5["batch_stats"]["var"], rtol=1e-5)
    assert new["bn_moments"]["moments"][0] == 5 * 4


def _init(model, x):
    """``model.init`` compiled whole, with an "rbg" key (these tests read no random value): an eager init
    compiles a program per operation and parameter shape, threefry's the most (several seconds for a ResNet)."""
    return jax.jit(lambda k, x: model.init(k, x, train=False))(jax.random.key(0, impl="rbg"), x)


def test_zero_init_last_bn_makes_blocks_identity_residual():
    m = models.create_model("resnet8", num_classes=10, zero_init_last_bn=True)
    v = _init(m, jnp.zeros((1, 8, 8, 3)))
    scales = {k: p["BatchNorm_1"]["scale"] for k, p in v["params"].items() if k.startswith("BasicBlock")}
    assert scales and all(float(jnp.abs(s).max()) == 0.0 for s in scales.values())
    m1 = models.create_model("resnet8", num_classes=10, zero_init_last_bn=False)
    v1 = _init(m1, jnp.zeros((1, 8, 8, 3)))
    assert float(v1["params"]["BasicBlock_0"]["BatchNorm_1"]["scale"].min()) == 1.0


def test_bfloat16_model_keeps_float32_params_and_stats():
    m = models.create_model("resnet8", num_classes=10, dtype="bfloat16")
    x = jax.random.normal(jax.random.key(0), (4, 8, 8, 3))
    v = _init(m, x)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(v["params"]))
    logits, new = jax.jit(lambda v, x: m.apply(v, x, train=True, mutable=["batch_stats"]))(v, x)
    assert logits.shape == (4, 10) and bool(jnp.all(jnp.isfinite(logits)))
    assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(new["batch_stats"]))


