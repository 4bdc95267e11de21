"""Models: published parameter counts, BatchNorm reduction modes, moments, zero-init."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsprint import models
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


def test_zero_init_last_bn_makes_blocks_identity_residual():
    m = models.create_model("resnet8", num_classes=10, zero_init_last_bn=True)
    v = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)), train=False)
    scales = {k: p["BatchNorm_1"]["scale"] for k, p in v["params"].items() if k.startswith("BasicBlock")}
    assert scales and all(float(jnp.abs(s).max()) == 0.0 for s in scales.values())
    m1 = models.create_model("resnet8", num_classes=10, zero_init_last_bn=False)
    v1 = m1.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)), train=False)
    assert float(v1["params"]["BasicBlock_0"]["BatchNorm_1"]["scale"].min()) == 1.0


def test_bfloat16_model_keeps_float32_params_and_stats():
    m = models.create_model("resnet8", num_classes=10, dtype="bfloat16")
    x = jax.random.normal(jax.random.key(0), (4, 8, 8, 3))
    v = m.init(jax.random.key(0), x, train=False)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(v["params"]))
    logits, new = m.apply(v, x, train=True, mutable=["batch_stats"])
    assert logits.shape == (4, 10) and bool(jnp.all(jnp.isfinite(logits)))
    assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(new["batch_stats"]))


def _bn_loss_and_grads(native_stats, x, running_mean, dy, residual=None, relu=False):
    """BN output, updated running stats and the gradients of sum(y * dy) w.r.t. x, scale, bias (and the
    residual), under jit."""
    bn = models.BatchNorm(momentum=0.9, native_stats=native_stats)
    c = x.shape[-1]
    rng = np.random.default_rng(5)
    params = {"scale": jnp.asarray(rng.uniform(0.5, 1.5, c), jnp.float32),
              "bias": jnp.asarray(rng.normal(size=c), jnp.float32)}
    stats = {"mean": running_mean, "var": jnp.ones((c,), jnp.float32)}

    def f(x, params, residual):
        y, new = bn.apply({"params": params, "batch_stats": stats}, x, use_running_average=False,
                          residual=residual, relu=relu, mutable=["batch_stats"])
        return jnp.sum(y * dy), (y, new["batch_stats"])

    (_, (y, new)), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(x, params, residual)
    return jax.jit(f).lower(x, params, residual).as_text(), y, new, grads, params


@pytest.mark.parametrize("shape,with_residual,relu", [((6, 5, 3, 16), False, False), ((4, 7, 32), False, False),
                                                      ((6, 5, 3, 16), False, True), ((3, 4, 4, 32), True, True),
                                                      ((3, 4, 4, 16), True, False)])
def test_native_bn_stats_equal_the_xla_formula_and_two_pass_moments(shape, with_residual, relu):
    """native_stats=True (one-pass native sums, native output, custom gradients) against XLA's two-pass
    moments and autodiff, and both against float64, with channel means up to about ten standard deviations
    from zero; with and without a residual input and ReLU."""
    from jaxsprint import native

    rng = np.random.default_rng(11)
    c = shape[-1]
    x = jnp.asarray(rng.normal(size=shape) * 2.0 + rng.normal(size=c) * 10.0, jnp.float32)
    dy = jnp.asarray(rng.normal(size=shape), jnp.float32)
    residual = jnp.asarray(rng.normal(size=shape), jnp.float32) if with_residual else None
    running_mean = jnp.asarray(rng.normal(size=c), jnp.float32)
    text_x, y_x, new_x, g_x, params = _bn_loss_and_grads(False, x, running_mean, dy, residual, relu)
    text_n, y_n, new_n, g_n, _ = _bn_loss_and_grads(True, x, running_mean, dy, residual, relu)
    assert "jaxsprint_channel_moments_f32" not in text_x
    if native.available():
        assert "jaxsprint_channel_moments_f32" in text_n
        assert ("jaxsprint_affine_add_act_f32" if with_residual else "jaxsprint_affine_act_f32") in text_n
    xn = np.asarray(x, np.float64).reshape(-1, c)
    mean, var = xn.mean(0), xn.var(0)
    want = (xn - mean) / np.sqrt(var + 1e-5) * np.asarray(params["scale"]) + np.asarray(params["bias"])
    if with_residual:
        want = want + np.asarray(residual, np.float64).reshape(-1, c)
    if relu:
        want = np.maximum(want, 0.0)
    for y, new in ((y_x, new_x), (y_n, new_n)):
        np.testing.assert_allclose(np.asarray(y).reshape(-1, c), want, atol=1e-5)
        np.testing.assert_allclose(new["mean"], 0.9 * np.asarray(running_mean) + 0.1 * mean, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(new["var"], 0.9 + 0.1 * var, rtol=1e-5)
    assert (g_x[2] is None) == (g_n[2] is None) == (not with_residual)
    for a, b in zip(jax.tree.leaves(g_x), jax.tree.leaves(g_n)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(a))))


def test_native_bn_stats_only_where_they_can_run():
    """C not a multiple of 16, a mask, group statistics or bfloat16 input keep XLA's sums (same formula)."""
    from jaxsprint import native

    if not native.available():
        pytest.skip(native.unavailable_reason())
    x = jnp.ones((4, 3, 3, 8))
    bn = models.BatchNorm(native_stats=True)
    v = bn.init(jax.random.key(0), x, use_running_average=False)
    run = jax.jit(lambda v, x: bn.apply(v, x, use_running_average=False, mutable=["batch_stats"]))
    assert "jaxsprint_channel_moments_f32" not in run.lower(v, x).as_text()
    x16 = jnp.ones((4, 3, 3, 16))
    v16 = bn.init(jax.random.key(0), x16, use_running_average=False)
    assert "jaxsprint_channel_moments_f32" in run.lower(v16, x16).as_text()
    masked = jax.jit(lambda v, x: bn.apply(v, x, use_running_average=False, mask=jnp.ones(4),
                                           mutable=["batch_stats"]))
    assert "jaxsprint_channel_moments_f32" not in masked.lower(v16, x16).as_text()
    grouped = models.BatchNorm(native_stats=True, group_size=2)
    g = jax.jit(lambda v, x: grouped.apply(v, x, use_running_average=False, mutable=["batch_stats"]))
    assert "jaxsprint_channel_moments_f32" not in g.lower(v16, x16).as_text()
    assert "jaxsprint_channel_moments_f32" not in run.lower(v16, x16.astype(jnp.bfloat16)).as_text()
