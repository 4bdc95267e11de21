"""jaxsprint.train.cpu.fused: the fused BatchNorm and blocks equal the plain ones (values, gradients, running
statistics, parameter names), and the native kernels run exactly where they can."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsprint.train import cpu, models
from jaxsprint.train.cpu import fused

from conv_util import kernels_mode, require_kernels


def _bn_loss_and_grads(fused_bn, x, running_mean, dy, residual=None, relu=False):
    """BN output (plus residual, through ReLU), updated running stats and the gradients of sum(y * dy) w.r.t.
    x, scale, bias (and the residual), under jit: the plain BatchNorm composed in jnp, or the fused one."""
    bn = fused.BatchNorm(momentum=0.9) if fused_bn else models.BatchNorm(momentum=0.9)
    c = x.shape[-1]
    rng = np.random.default_rng(5)
    params = {"scale": jnp.asarray(rng.uniform(0.5, 1.5, c), jnp.float32),
              "bias": jnp.asarray(rng.normal(size=c), jnp.float32)}
    stats = {"mean": running_mean, "var": jnp.ones((c,), jnp.float32)}

    def f(x, params, residual):
        v = {"params": params, "batch_stats": stats}
        if fused_bn:
            y, new = bn.apply(v, x, residual, use_running_average=False, relu=relu, mutable=["batch_stats"])
        else:
            y, new = bn.apply(v, x, use_running_average=False, mutable=["batch_stats"])
            y = y if residual is None else y + residual
            y = jax.nn.relu(y) if relu else y
        return jnp.sum(y * dy), (y, new["batch_stats"])

    (_, (y, new)), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(x, params, residual)
    return y, new, grads, params


def _spy(monkeypatch):
    """Records which native BatchNorm kernels a traced function calls."""
    calls = []
    for name in ("channel_moments", "channel_products", "affine_act"):
        real = getattr(fused.native, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name + ("+residual" if _name == "affine_act" and len(args) > 3
                                  and args[3] is not None else ""))
            return _real(*args, **kwargs)

        monkeypatch.setattr(fused.native, name, spy)
    return calls


@pytest.mark.parametrize("shape,with_residual,relu", [((6, 5, 3, 16), False, False), ((4, 7, 32), False, False),
                                                      ((6, 5, 3, 16), False, True), ((3, 4, 4, 32), True, True),
                                                      ((3, 4, 4, 16), True, False)])
def test_fused_bn_equals_the_plain_formula_and_two_pass_moments(monkeypatch, shape, with_residual, relu):
    """The fused BatchNorm (one-pass native sums, native output, custom gradients) against the plain one
    composed with jnp and autodiff, and both against float64, with channel means up to about ten standard
    deviations from zero; with and without a residual input and ReLU."""
    require_kernels()
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(11)
    c = shape[-1]
    x = jnp.asarray(rng.normal(size=shape) * 2.0 + rng.normal(size=c) * 10.0, jnp.float32)
    dy = jnp.asarray(rng.normal(size=shape), jnp.float32)
    residual = jnp.asarray(rng.normal(size=shape), jnp.float32) if with_residual else None
    running_mean = jnp.asarray(rng.normal(size=c), jnp.float32)
    y_x, new_x, g_x, params = _bn_loss_and_grads(False, x, running_mean, dy, residual, relu)
    assert calls == []
    y_n, new_n, g_n, _ = _bn_loss_and_grads(True, x, running_mean, dy, residual, relu)
    assert "channel_moments" in calls and "channel_products" in calls
    assert ("affine_act+residual" if with_residual else "affine_act") in calls
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


def test_fused_bn_runs_natively_only_where_it_can(monkeypatch):
    """C not a multiple of 16, a mask, group statistics, bfloat16 input or evaluation keep the plain sums."""
    require_kernels()
    calls = _spy(monkeypatch)
    bn = fused.BatchNorm()

    def traced(module, x, **kw):
        v = module.init(jax.random.key(0), x, use_running_average=False)
        calls.clear()
        jax.eval_shape(lambda v, x: module.apply(v, x, mutable=["batch_stats"], **kw), v, x)
        return "channel_moments" in calls

    kw = {"use_running_average": False}
    assert traced(bn, jnp.ones((4, 3, 3, 16)), **kw)
    assert not traced(bn, jnp.ones((4, 3, 3, 8)), **kw)
    assert not traced(bn, jnp.ones((4, 3, 3, 16)), mask=jnp.ones(4), **kw)
    assert not traced(fused.BatchNorm(group_size=2), jnp.ones((4, 3, 3, 16)), **kw)
    assert not traced(bn, jnp.ones((4, 3, 3, 16), jnp.bfloat16), **kw)
    assert not traced(bn, jnp.ones((4, 3, 3, 16)), use_running_average=True)


def _small_resnet(block, **kwargs):
    """One stage of `block` at 16 and 32 filters (a strided projection block included): every code path of
    the blocks at a fraction of ResNet-50's compile time."""
    return models.ResNet(stage_sizes=(1, 1), block_cls=block, widths=(16, 32), num_classes=10, stem="cifar",
                         **kwargs)


@pytest.mark.parametrize("block", [models.BasicBlock, models.BottleneckBlock], ids=lambda b: b.__name__)
def test_fused_model_equals_the_plain_model(block):
    """A model with the seam's fused BatchNorm and blocks has the plain model's parameter tree (so
    checkpoints are interchangeable), the same initial values, loss and running statistics, and the same
    gradients up to float summation order."""
    accel = cpu.acceleration(kernels_mode())
    if not accel.active:
        pytest.skip(accel.reason)
    kw = accel.model_kwargs()
    x = jax.random.normal(jax.random.key(1), (8, 16, 16, 3))
    labels = jnp.arange(8) % 10
    out = []
    for m, copts in ((_small_resnet(block), None),
                     (_small_resnet(kw["block_overrides"][block], norm_cls=kw["norm_cls"],
                                    conv_general_dilated=kw["conv_general_dilated"]), accel.compiler_options)):
        # An rbg key: eagerly drawing threefry bits compiles a larger program per parameter shape.
        v = m.init(jax.random.key(0, impl="rbg"), x, train=False)
        v = {"params": v["params"], "batch_stats": v["batch_stats"]}  # not init's sown activation moments

        def loss(p, m=m, v=v):
            logits, new = m.apply({"params": p, "batch_stats": v["batch_stats"]}, x, train=True,
                                  mutable=["batch_stats"])
            return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(8), labels]), new

        (value, new), grads = jax.jit(jax.value_and_grad(loss, has_aux=True), compiler_options=copts)(v["params"])
        out.append((v, value, new, grads))
    (v0, l0, s0, g0), (v1, l1, s1, g1) = out
    assert jax.tree.structure(v0) == jax.tree.structure(v1)
    for a, b in zip(jax.tree.leaves(v0), jax.tree.leaves(v1)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s0), jax.tree.leaves(s1)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-3 * float(jnp.max(jnp.abs(a))))


def test_create_model_swaps_in_the_fused_blocks_with_the_same_names():
    """ResNet-50 from the zoo with the seam's kwargs: fused Bottleneck blocks, the plain parameter tree."""
    accel = cpu.acceleration(kernels_mode())
    if not accel.active:
        pytest.skip(accel.reason)
    x = jnp.zeros((1, 32, 32, 3))
    shapes = [jax.eval_shape(lambda: models.create_model("resnet50", num_classes=10, **kw).init(
        jax.random.key(0), x, train=False)["params"]) for kw in ({}, accel.model_kwargs())]
    assert jax.tree.structure(shapes[0]) == jax.tree.structure(shapes[1])
    assert models.create_model("resnet50", num_classes=10, **accel.model_kwargs()).block_cls is fused.BottleneckBlock
