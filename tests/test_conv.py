"""jaxsprint.conv: values and gradients equal jax.grad of lax.conv_general_dilated."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsprint import conv as jconv

DN = ("NHWC", "HWIO", "NHWC")


def _value_and_grads(conv_fn, x, w, dy, strides, padding, **kw):
    """Returns (y, dx, dw) of conv_fn under jit, with cotangent dy."""

    def f(x, w, dy):
        y, vjp = jax.vjp(lambda a, b: conv_fn(a, b, strides, padding, dimension_numbers=DN, **kw), x, w)
        return (y, *vjp(dy))

    return jax.jit(f)(x, w, dy)


def _inputs(n, h, wd, c, k, kh, kw, strides, padding, dtype, seed=0):
    """Random x, w, dy (numpy-generated: no per-shape JAX compilation)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, wd, c), np.float32)
    w = rng.standard_normal((kh, kw, c, k), np.float32) / np.sqrt(kh * kw * c)
    out = jax.eval_shape(lambda a, b: lax.conv_general_dilated(a, b, strides, padding, dimension_numbers=DN),
                         jax.ShapeDtypeStruct(x.shape, jnp.float32), jax.ShapeDtypeStruct(w.shape, jnp.float32))
    dy = rng.standard_normal(out.shape, np.float32)
    return tuple(jnp.asarray(a, dtype) for a in (x, w, dy))


def _assert_close(got, ref, rtol):
    got = np.asarray(jnp.asarray(got, jnp.float32))
    ref = np.asarray(jnp.asarray(ref, jnp.float32))
    assert got.shape == ref.shape
    scale = float(np.max(np.abs(ref))) or 1.0
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale)


def _assert_case_close(case, named, rtol=1e-5):
    """`named`: (name, got, ref) triples of one case; the failure names the case and the output."""
    for name, got, ref in named:
        try:
            _assert_close(got, ref, rtol=rtol)
        except AssertionError as e:
            raise AssertionError(f"{case} {name}") from e


# (n, h, w, c, k, kernel, stride, padding): 1x1 / 3x3 / 7x7, strides 1 and 2, string and explicit
# padding, odd and even spatial sizes, non-square inputs. Cases are grouped so that each group is
# compiled once (one jit holding the fast and the reference convolutions of every case).
F32_GROUPS = {
    "3x3": [
        (4, 9, 7, 5, 6, 3, 1, "SAME"),
        (4, 9, 7, 5, 6, 3, 2, "SAME"),
        (4, 10, 8, 5, 6, 3, 2, "SAME"),
        (4, 9, 7, 5, 6, 3, 1, "VALID"),
        (4, 9, 7, 5, 6, 3, 2, "VALID"),
        (4, 9, 9, 5, 6, 3, 1, ((1, 1), (1, 1))),
        (4, 9, 9, 5, 6, 3, 2, ((1, 1), (1, 1))),
        (4, 8, 8, 5, 6, 3, 2, ((1, 1), (1, 1))),
        (2, 9, 11, 3, 5, 3, 2, ((0, 1), (2, 0))),
    ],
    "1x1": [
        (4, 9, 7, 5, 6, 1, 1, "SAME"),
        (4, 9, 7, 5, 6, 1, 2, "SAME"),
        (4, 8, 8, 5, 6, 1, 2, "VALID"),
        (4, 7, 7, 5, 6, 1, 1, ((1, 1), (1, 1))),
    ],
    "7x7": [
        (2, 15, 13, 3, 8, 7, 2, ((3, 3), (3, 3))),
        (2, 15, 13, 3, 8, 7, 2, "SAME"),
        (2, 11, 11, 3, 8, 7, 1, "VALID"),
        (2, 11, 9, 3, 8, 7, 1, ((3, 3), (3, 3))),
    ],
}

BF16_CASES = [
    (4, 9, 7, 16, 16, 3, 1, "SAME"),
    (4, 9, 7, 16, 32, 3, 2, ((1, 1), (1, 1))),
    (4, 9, 9, 16, 32, 1, 2, "SAME"),
    (2, 15, 13, 3, 16, 7, 2, ((3, 3), (3, 3))),
    (4, 9, 7, 8, 8, 3, 2, "VALID"),
]


def _group_results(cases, dtype, ref_dtype):
    """For every case: ((y, dx, dw) fast, (y, dx, dw) of lax in ref_dtype), from one jit."""
    data = []
    for i, (n, h, wd, c, k, ks, s, padding) in enumerate(cases):
        x, w, dy = _inputs(n, h, wd, c, k, ks, ks, (s, s), padding, dtype, seed=i)
        assert jconv.fast_path_supported(x, w, (s, s), padding, dimension_numbers=DN)
        data.append((x, w, dy))

    def vg(conv_fn, x, w, dy, strides, padding):
        y, vjp = jax.vjp(lambda a, b: conv_fn(a, b, strides, padding, dimension_numbers=DN), x, w)
        return (y, *vjp(dy))

    def all_cases(data):
        out = []
        for (x, w, dy), (*_, s, padding) in zip(data, cases):
            fast = vg(jconv.conv_general_dilated, x, w, dy, (s, s), padding)
            ref = vg(lax.conv_general_dilated, *(a.astype(ref_dtype) for a in (x, w, dy)), (s, s), padding)
            out.append((fast, ref))
        return out

    return jax.jit(all_cases)(data)


@pytest.mark.parametrize("group", sorted(F32_GROUPS))
def test_float32_value_and_grads_equal_lax(group):
    cases = F32_GROUPS[group]
    for case, (fast, ref) in zip(cases, _group_results(cases, jnp.float32, jnp.float32)):
        for name, g, r in zip(("y", "dx", "dw"), fast, ref):
            assert g.dtype == jnp.float32, (case, name)
            try:
                _assert_close(g, r, rtol=1e-5)
            except AssertionError as e:
                raise AssertionError(f"{case} {name}") from e


def test_bfloat16_value_and_grads():
    results = _group_results(BF16_CASES, jnp.bfloat16, jnp.bfloat16)
    results32 = _group_results(BF16_CASES, jnp.bfloat16, jnp.float32)
    for case, (fast, ref), (_, ref32) in zip(BF16_CASES, results, results32):
        for name, g, r, r32 in zip(("y", "dx", "dw"), fast, ref, ref32):
            assert g.dtype == jnp.bfloat16, (case, name)
            try:
                # Against lax in bfloat16: a bfloat16 rounding apart at most.
                _assert_close(g, r, rtol=1e-2)
                # Against lax in float32 on the same (bfloat16-valued) inputs.
                _assert_close(g, r32, rtol=2e-2)
            except AssertionError as e:
                raise AssertionError(f"{case} {name}") from e


def test_filter_grad_exact_whatever_the_condition():
    """The materializing conditional has identical branches: NaN in the kernel changes nothing."""
    strides, padding = (1, 1), "SAME"
    x, w, dy = _inputs(2, 8, 8, 4, 4, 3, 3, strides, padding, jnp.float32)
    w = w.at[0, 0, 0, 0].set(jnp.nan)
    ref = _value_and_grads(lax.conv_general_dilated, x, w, dy, strides, padding)
    got = _value_and_grads(jconv.conv_general_dilated, x, w, dy, strides, padding)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_second_call_and_jit_of_grad():
    """jax.grad of a scalar loss, jitted, with the convolution used twice."""
    strides, padding = (2, 2), "SAME"
    x, w, _ = _inputs(4, 10, 10, 4, 4, 3, 3, strides, padding, jnp.float32)

    def loss(conv_fn, x, w):
        y = conv_fn(x, w, strides, padding, dimension_numbers=DN)
        y = conv_fn(jnp.tanh(y), w, (1, 1), padding, dimension_numbers=DN)
        return jnp.sum(y * y)

    ref = jax.jit(jax.grad(lambda x, w: loss(lax.conv_general_dilated, x, w), argnums=(0, 1)))(x, w)
    got = jax.jit(jax.grad(lambda x, w: loss(jconv.conv_general_dilated, x, w), argnums=(0, 1)))(x, w)
    for g, r in zip(got, ref):
        _assert_close(g, r, rtol=1e-5)


@pytest.mark.parametrize("kwargs", [
    {"feature_group_count": 2},
    {"rhs_dilation": (2, 2)},
    {"lhs_dilation": (2, 2)},
])
def test_fallback_equals_lax(kwargs):
    strides, padding = (1, 1), ((1, 1), (1, 1))
    x, w, _ = _inputs(2, 8, 8, 4, 4, 3, 3, strides, padding, jnp.float32)
    if "feature_group_count" in kwargs:
        w = w[:, :, :2, :]
    assert not jconv.fast_path_supported(x, w, strides, padding, dimension_numbers=DN, **kwargs)
    y_ref, vjp_ref = jax.vjp(lambda a, b: lax.conv_general_dilated(a, b, strides, padding, dimension_numbers=DN,
                                                                   **kwargs), x, w)
    y, vjp = jax.vjp(lambda a, b: jconv.conv_general_dilated(a, b, strides, padding, dimension_numbers=DN,
                                                            **kwargs), x, w)
    dy = jax.random.normal(jax.random.key(3), y_ref.shape)
    for g, r in zip((y, *vjp(dy)), (y_ref, *vjp_ref(dy))):
        _assert_close(g, r, rtol=1e-6)


def test_fallback_other_layouts_and_dtypes():
    x = jnp.ones((2, 4, 8, 8))
    w = jnp.ones((6, 4, 3, 3))
    assert not jconv.fast_path_supported(x, w, (1, 1), "SAME")  # NCHW / OIHW (dimension_numbers=None)
    np.testing.assert_array_equal(jconv.conv_general_dilated(x, w, (1, 1), "SAME"),
                                  lax.conv_general_dilated(x, w, (1, 1), "SAME"))
    xi = jnp.ones((2, 8, 8, 4), jnp.int32)
    wi = jnp.ones((3, 3, 4, 6), jnp.int32)
    assert not jconv.fast_path_supported(xi, wi, (1, 1), "SAME", dimension_numbers=DN)
    xf, wf = xi.astype(jnp.float32), wi.astype(jnp.float32)
    assert not jconv.fast_path_supported(xf, wf, (1, 1), "SAME", dimension_numbers=DN,
                                         preferred_element_type=jnp.bfloat16)
    assert not jconv.fast_path_supported(xf, wf, (1, 1), ((-1, 0), (0, 0)), dimension_numbers=DN)


def _uses_custom_vjp(fn, *args):
    return "custom_vjp_call" in str(jax.make_jaxpr(fn)(*args))


def test_fast_path_is_taken_and_make_conv():
    x = jnp.ones((2, 8, 8, 4))
    w = jnp.ones((3, 3, 4, 6))

    def call(conv_fn):
        return lambda a, b: conv_fn(a, b, (1, 1), "SAME", dimension_numbers=DN)

    assert jconv.make_conv("xla") is lax.conv_general_dilated
    assert jconv.make_conv("fast") is jconv.conv_general_dilated
    assert _uses_custom_vjp(call(jconv.make_conv("fast")), x, w)
    assert not _uses_custom_vjp(call(jconv.make_conv("xla")), x, w)
    assert jax.default_backend() == "cpu"
    assert _uses_custom_vjp(call(jconv.make_conv("auto")), x, w)
    with pytest.raises(ValueError):
        jconv.make_conv("cudnn")
    with pytest.raises(ValueError):
        jconv.make_conv("fast", batch_split=0)


def test_batch_split_equals_lax():
    strides, padding = (2, 2), "SAME"
    x, w, dy = _inputs(6, 9, 9, 4, 8, 3, 3, strides, padding, jnp.float32)
    conv2 = jconv.make_conv("fast", batch_split=2)
    conv4 = jconv.make_conv("fast", batch_split=4)  # does not divide 6: no split
    ref = _value_and_grads(lax.conv_general_dilated, x, w, dy, strides, padding)
    for conv_fn in (conv2, conv4):
        got = _value_and_grads(conv_fn, x, w, dy, strides, padding)
        for g, r in zip(got, ref):
            _assert_close(g, r, rtol=1e-5)


class _TwoConvs(nn.Module):
    conv: object = None

    @nn.compact
    def __call__(self, x):
        kw = {} if self.conv is None else {"conv_general_dilated": self.conv}
        x = nn.Conv(8, (3, 3), strides=2, padding="SAME", **kw)(x)
        x = nn.relu(x)
        x = nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, **kw)(x)
        return nn.Conv(4, (1, 1), strides=2, **kw)(x)


def test_flax_conv_same_output_and_grads():
    x = jax.random.normal(jax.random.key(0), (4, 9, 9, 3))
    params = _TwoConvs().init(jax.random.key(1), x)

    def loss(model, p):
        return jnp.sum(jnp.sin(model.apply(p, x)))

    ref_model, fast_model = _TwoConvs(), _TwoConvs(conv=jconv.make_conv("fast"))
    _assert_close(jax.jit(fast_model.apply)(params, x), jax.jit(ref_model.apply)(params, x), rtol=1e-6)
    g_ref = jax.jit(jax.grad(lambda p: loss(ref_model, p)))(params)
    g = jax.jit(jax.grad(lambda p: loss(fast_model, p)))(params)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        _assert_close(a, b, rtol=1e-5)


def _check_batch_sharded(c, k, strides=(2, 2), padding=((1, 1), (1, 1))):
    """The fast convolution with the batch split over the fake devices (jit + NamedSharding) gives the
    unsharded lax result; returns (mesh, sharded x, sharded dy, lax's (y, dx, dw))."""
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs several devices")
    mesh = jax.sharding.Mesh(np.array(devices), ("b",))
    x, w, dy = _inputs(2 * len(devices), 8, 8, c, k, 3, 3, strides, padding, jnp.float32)
    ref = _value_and_grads(lax.conv_general_dilated, x, w, dy, strides, padding)
    xs = jax.device_put(x, NamedSharding(mesh, P("b")))
    dys = jax.device_put(dy, NamedSharding(mesh, P("b")))
    got = _value_and_grads(jconv.conv_general_dilated, xs, w, dys, strides, padding)
    for g, r in zip(got, ref):
        _assert_close(g, r, rtol=1e-5)
    return mesh, xs, dys, ref


def test_batch_sharded_over_devices():
    """Batch split over the 8 fake CPU devices with jit + NamedSharding gives the unsharded result."""
    _check_batch_sharded(4, 8)


def test_compiler_options_policy():
    """No options with several devices (this session has 8) or for "xla"; bad kinds are refused."""
    assert jax.device_count() == 8
    for kind in jconv.KINDS:
        assert jconv.compiler_options(kind) is None
    with pytest.raises(ValueError, match="unknown conv kind"):
        jconv.compiler_options("cudnn")


# Runs in a fresh one-device process: the gradients of a conv stack under the single-CPU-device
# options equal lax's under XLA's defaults, and the options do move the convolutions off YNNPACK.
_ONE_DEVICE_DRIVER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jaxsprint import conv as jconv
DN = ("NHWC", "HWIO", "NHWC")
opts = jconv.compiler_options("auto")
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((8, 12, 12, 16)), jnp.float32)
w1 = jnp.asarray(rng.standard_normal((3, 3, 16, 32)) / 12, jnp.float32)
w2 = jnp.asarray(rng.standard_normal((1, 1, 32, 32)) / 6, jnp.float32)
def loss(conv, x, w1, w2):
    h = jax.nn.relu(conv(x, w1, (2, 2), "SAME", dimension_numbers=DN))
    h = h - jnp.mean(h, axis=(0, 1, 2))
    return jnp.sum(jnp.sin(conv(h, w2, (1, 1), "VALID", dimension_numbers=DN)) ** 2)
fast = jax.jit(jax.value_and_grad(lambda *a: loss(jconv.make_conv("auto"), *a), argnums=(0, 1, 2)),
               compiler_options=opts)
ref = jax.jit(jax.value_and_grad(lambda *a: loss(lax.conv_general_dilated, *a), argnums=(0, 1, 2)))
(v, g), (vr, gr) = fast(x, w1, w2), ref(x, w1, w2)
err = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(g, gr))
hlo_opt = fast.lower(x, w1, w2).compile().as_text()
hlo_ref = ref.lower(x, w1, w2).compile().as_text()
conv_in_ynn = lambda t: any("__ynn_fusion" in l and "convolution" in l for l in t.split("fused_computation"))
print(json.dumps({"opts": opts, "value_err": abs(float(v - vr)) / abs(float(vr)), "grad_err": err,
                  "ref_conv_in_ynn": conv_in_ynn(hlo_ref), "opt_conv_in_ynn": conv_in_ynn(hlo_opt)}))
"""


def test_single_device_compiler_options_keep_gradients():
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    r = subprocess.run([sys.executable, "-c", _ONE_DEVICE_DRIVER, root], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["opts"] == jconv.SINGLE_CPU_DEVICE_OPTIONS
    assert out["value_err"] < 1e-5 and out["grad_err"] < 1e-5, out
    assert out["ref_conv_in_ynn"] and not out["opt_conv_in_ynn"], out


# ---------------------------------------------------------------------------------------------------------
# The native filter-gradient kernel (jaxsprint.native): float32, output channels a multiple of 16.

from jaxsprint import native  # noqa: E402

# Odd input channels exercise the kernel's channel-block tails; K = 16/32/48/64/128 each of its lane blocks.
NATIVE_CASES = [
    (4, 9, 7, 5, 16, 3, 1, "SAME"),
    (4, 9, 7, 13, 16, 3, 2, "SAME"),
    (4, 10, 8, 16, 32, 3, 2, "SAME"),
    (4, 9, 7, 5, 48, 3, 1, "VALID"),
    (4, 9, 7, 13, 64, 3, 2, "VALID"),
    (2, 9, 11, 3, 16, 3, 2, ((0, 1), (2, 0))),
    (4, 8, 8, 32, 32, 3, 1, ((1, 1), (1, 1))),
    (4, 9, 7, 5, 16, 1, 1, "SAME"),
    (4, 8, 8, 16, 32, 1, 2, "VALID"),
    (2, 6, 6, 64, 128, 3, 1, "SAME"),
    (2, 15, 13, 3, 16, 7, 2, ((3, 3), (3, 3))),
    (2, 11, 9, 3, 16, 7, 1, "VALID"),
    # 16 -> 16 at stride 1: the native kernel also runs the forward and the input gradient.
    (4, 9, 7, 16, 16, 3, 1, "SAME"),
    (2, 9, 11, 16, 16, 3, 1, ((0, 1), (2, 0))),
    (4, 8, 8, 16, 16, 3, 1, "VALID"),
    (2, 11, 9, 16, 16, 7, 1, ((3, 3), (3, 3))),
    (4, 7, 9, 16, 16, 1, 1, "SAME"),
    (3, 30, 33, 16, 16, 3, 1, "SAME"),
    # Winograd (3x3, stride 1, C and K multiples of 16): odd outputs (half-empty tiles), every register block
    # width (K = 16, 32, 48, 64), several tile blocks with a remainder, asymmetric and over-wide padding.
    (2, 9, 11, 16, 48, 3, 1, ((0, 2), (2, 1))),
    (2, 7, 7, 48, 32, 3, 1, "VALID"),
    (1, 5, 6, 32, 64, 3, 1, ((3, 3), (3, 2))),
    (5, 13, 12, 32, 32, 3, 1, "SAME"),
    # Strided, C a multiple of 16, even input: the input gradient as one native convolution per phase of the
    # stride (1x1, 1x2, 2x1 and 2x2 taps for 3x3 / 2), interleaved; SAME's (0, 1) padding, VALID, asymmetric
    # and over-wide padding, kernels smaller than, equal to and larger than the stride, stride 3.
    (2, 10, 12, 32, 16, 3, 2, "VALID"),
    (2, 8, 10, 16, 32, 3, 2, ((0, 1), (2, 0))),
    (2, 12, 8, 16, 16, 5, 2, ((2, 2), (1, 3))),
    (2, 12, 12, 16, 16, 3, 2, ((5, 0), (0, 4))),
    (2, 8, 8, 16, 16, 2, 2, "VALID"),
    (2, 9, 12, 16, 16, 3, 3, "SAME"),
    (2, 8, 8, 16, 32, 1, 2, "SAME"),
]


def test_native_kernel_builds_where_a_compiler_exists():
    import shutil

    if shutil.which("g++") is None and not __import__("os").environ.get("CXX"):
        pytest.skip("no C++ compiler on this machine: the XLA filter gradient is used instead")
    assert native.available(), native.unavailable_reason()


def test_native_filter_grad_equals_lax():
    if not native.available():
        pytest.skip(native.unavailable_reason())
    for case in NATIVE_CASES:
        n, h, wd, c, k, ks, s, padding = case
        x, w, dy = _inputs(n, h, wd, c, k, ks, ks, (s, s), padding, jnp.float32)
        assert native.supported(x.shape, dy.shape, x.dtype, (ks, ks))

    results = _group_results(NATIVE_CASES, jnp.float32, jnp.float32)
    for case, (fast, ref) in zip(NATIVE_CASES, results):
        _assert_case_close(case, zip(("y", "dx", "dw"), fast, ref))


def test_native_kernels_equal_lax_directly():
    """The kernels themselves, on every case (the router in jaxsprint.conv sends only some shapes there)."""
    if not native.available():
        pytest.skip(native.unavailable_reason())

    def both(data):
        out = []
        for (x, w, dy), (*_, s, padding) in zip(data, NATIVE_CASES):
            pads = lax.padtype_to_pads(x.shape[1:3], w.shape[:2], (s, s), padding) if isinstance(padding, str) \
                else padding
            y_ref, vjp = jax.vjp(lambda a, b: lax.conv_general_dilated(a, b, (s, s), pads, dimension_numbers=DN),
                                 x, w)
            dw_ref = vjp(dy)[1]
            dw = native.filter_grad(x, dy, w.shape[:2], (s, s), pads)
            y = native.conv(x, w, y_ref.shape[1:3], (s, s), (pads[0][0], pads[1][0]))
            named = {"dw": (dw, dw_ref), "y": (y, y_ref)}
            if native.winograd_supported(x.shape, w.shape, x.dtype, (s, s)):
                named["y winograd"] = (native.conv(x, w, y_ref.shape[1:3], (s, s), (pads[0][0], pads[1][0]),
                                                   winograd=True), y_ref)
                named["dw winograd"] = (native.filter_grad(x, dy, w.shape[:2], (s, s), pads, winograd=True), dw_ref)
            out.append(named)
        return out

    data = [_inputs(n, h, wd, c, k, ks, ks, (s, s), padding, jnp.float32, seed=i)
            for i, (n, h, wd, c, k, ks, s, padding) in enumerate(NATIVE_CASES)]
    results = jax.jit(both)(data)
    assert sum("y winograd" in named for named in results) >= 8  # the Winograd cases above
    for case, named in zip(NATIVE_CASES, results):
        _assert_case_close(case, [(name, *pair) for name, pair in named.items()])


def test_winograd_rejects_what_it_cannot_run():
    assert native.winograd_supported((2, 8, 8, 16), (3, 3, 16, 32), jnp.float32, (1, 1))
    assert not native.winograd_supported((2, 8, 8, 16), (3, 3, 16, 32), jnp.float32, (2, 2))  # stride 2
    assert not native.winograd_supported((2, 8, 8, 8), (3, 3, 8, 32), jnp.float32, (1, 1))    # C % 16
    assert not native.winograd_supported((2, 8, 8, 16), (3, 3, 16, 24), jnp.float32, (1, 1))  # K % 16
    assert not native.winograd_supported((2, 8, 8, 16), (5, 5, 16, 32), jnp.float32, (1, 1))  # 5x5
    assert not native.winograd_supported((2, 8, 8, 16), (3, 3, 16, 32), jnp.bfloat16, (1, 1))
    if not native.available():
        pytest.skip(native.unavailable_reason())
    x, w = jnp.ones((1, 6, 6, 16)), jnp.ones((3, 3, 16, 16))
    with pytest.raises(Exception, match="Winograd needs a stride-1 3x3 kernel"):
        jax.block_until_ready(native.conv(x, w, (3, 3), (2, 2), (1, 1), winograd=True))
    with pytest.raises(Exception, match="Winograd needs a stride-1 3x3 kernel"):
        jax.block_until_ready(native.filter_grad(x, jnp.ones((1, 3, 3, 16)), (3, 3), (2, 2), ((1, 1), (1, 1)),
                                                 winograd=True))


def test_native_path_is_taken_only_where_supported():
    if not native.available():
        pytest.skip(native.unavailable_reason())

    def hlo(dtype, k, n=4, c=4):
        x, w, dy = _inputs(n, 8, 8, c, k, 3, 3, (1, 1), "SAME", dtype)
        f = jax.jit(lambda x, w: jax.value_and_grad(lambda b: jnp.sum(
            jconv.conv_general_dilated(x, b, (1, 1), "SAME", dimension_numbers=DN) * dy))(w))
        return f.lower(x, w).as_text()

    assert "jaxsprint_conv_filter_grad_f32" in hlo(jnp.float32, 16)
    assert hlo(jnp.float32, 16).count("jaxsprint_conv_f32") == 1          # the forward (C = 4: no native dx)
    assert "jaxsprint_conv_f32" not in hlo(jnp.float32, 32)               # C = 4, K = 32: neither kernel
    # C = 16, K = 32, 3x3, stride 1: Winograd for the forward and for the input gradient.
    both = jax.jit(lambda x, w: jax.grad(lambda a, b: jnp.sum(
        jconv.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=DN) ** 2), argnums=(0, 1))(x, w))
    text = both.lower(jnp.ones((16, 8, 8, 16)), jnp.ones((3, 3, 16, 32))).as_text()
    assert text.count("winograd = 1") == 3, text  # forward, input gradient, filter gradient
    strided = jax.jit(lambda x, w: jconv.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=DN))
    assert "jaxsprint_conv_f32" not in strided.lower(jnp.ones((2, 8, 8, 16)), jnp.ones((3, 3, 16, 32))).as_text()
    # Its input gradient: four native phase convolutions (1x1, 1x2, 2x1, 2x2 taps), no dilated XLA convolution.
    strided_dx = jax.jit(lambda x, w: jax.grad(lambda a: jnp.sum(
        jconv.conv_general_dilated(a, w, (2, 2), "SAME", dimension_numbers=DN) ** 2))(x))
    text = strided_dx.lower(jnp.ones((2, 8, 8, 16)), jnp.ones((3, 3, 16, 32))).compile().as_text()
    assert text.count("custom_call_target=\"jaxsprint_conv_f32\"") == 4 and "lhs_dilate" not in text, text
    # An odd input size keeps XLA's transposed convolution (the phases would not interleave evenly).
    text = strided_dx.lower(jnp.ones((2, 9, 8, 16)), jnp.ones((3, 3, 16, 32))).compile().as_text()
    assert "custom_call_target=\"jaxsprint_conv_f32\"" not in text
    assert "jaxsprint_conv_filter_grad_f32" not in hlo(jnp.float32, 8)    # K not a multiple of 16
    assert "jaxsprint_conv_filter_grad_f32" not in hlo(jnp.bfloat16, 16)  # float32 only
    # A reduction short against the output (2 * 8 * 8 rows for 3 * 3 * 64 * 64 values): XLA's is faster there.
    assert "jaxsprint_conv_filter_grad_f32" not in hlo(jnp.float32, 64, n=2, c=64)
    assert not native.supported((2, 8, 8, 4), (2, 8, 8, 16), jnp.float16, (3, 3))
    assert not native.supported((2, 8, 8, 4), (3, 8, 8, 16), jnp.float32, (3, 3))  # batch mismatch


def test_native_filter_grad_batch_sharded_is_summed_not_gathered():
    """With the batch sharded over the fake devices, each device reduces its own examples, then a psum."""
    if not native.available():
        pytest.skip(native.unavailable_reason())
    strides, padding = (2, 2), ((1, 1), (1, 1))
    mesh, xs, dys, ref = _check_batch_sharded(5, 16, strides, padding)

    def dw(x, dy):
        return native.filter_grad(x, dy, (3, 3), strides, padding)

    compiled = jax.jit(dw, out_shardings=NamedSharding(mesh, P())).lower(xs, dys).compile().as_text()
    assert "all-gather" not in compiled and "all-reduce" in compiled
    _assert_close(jax.jit(dw)(xs, dys), ref[2], rtol=1e-5)


def test_native_off_switch(tmp_path):
    """JAXSPRINT_NATIVE=off: nothing is built or used, and the XLA path gives the same gradients."""
    import os
    import subprocess
    import sys

    code = (
        "import jax, jax.numpy as jnp\n"
        "from jaxsprint import conv, native\n"
        "assert not native.available() and 'JAXSPRINT_NATIVE' in native.unavailable_reason()\n"
        "x = jnp.ones((2, 6, 6, 3)); w = jnp.ones((3, 3, 3, 16))\n"
        "g = jax.grad(lambda b: jnp.sum(conv.conv_general_dilated(x, b, (1, 1), 'SAME',\n"
        "    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))))(w)\n"
        "assert float(g[1, 1, 0, 0]) == 72.0, g[1, 1, 0, 0]\n"
        "print('ok')\n")
    env = dict(os.environ, JAXSPRINT_NATIVE="off", JAXSPRINT_NATIVE_CACHE=str(tmp_path), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_channel_stats_equal_float64_two_pass():
    """Moments and products against float64 numpy, on row counts that leave partial blocks and remainders of
    four rows, with a mean 500 standard deviations from zero (a one-pass sum of squares would lose it all)."""
    if not native.available():
        pytest.skip(native.unavailable_reason())
    rng = np.random.default_rng(7)
    for shape in [(3, 5, 7, 16), (130, 48), (1, 1, 1, 32), (64, 16), (2, 129, 16)]:
        a = (rng.normal(size=shape) * 2 + 1000).astype(np.float32)
        b = rng.normal(size=shape).astype(np.float32)
        axes = tuple(range(len(shape) - 1))
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        got = np.asarray(jax.jit(native.channel_moments)(a), np.float64)
        np.testing.assert_allclose(got[0], a64.sum(axes), rtol=1e-6)
        np.testing.assert_allclose(got[1], ((a64 - a64.mean(axes)) ** 2).sum(axes), rtol=2e-5, atol=1e-6)
        got = jax.jit(native.channel_products)(a, b)
        np.testing.assert_allclose(got, np.stack([a64.sum(axes), (a64 * b64).sum(axes)]), rtol=1e-6, atol=2e-3)
    assert native.channel_stats_supported((4, 32), jnp.float32)
    assert not native.channel_stats_supported((4, 24), jnp.float32)
    assert not native.channel_stats_supported((4, 32), jnp.bfloat16)
    a = jnp.ones((4, 16))
    with pytest.raises(ValueError, match=r"b has shape \(16,\), expected a's \(4, 16\)"):
        native.channel_products(a, a[0])


def test_channel_stats_batch_sharded_are_merged_not_gathered():
    """Rows sharded over the fake devices: each device reduces its own rows; the products are then psummed,
    the moments' per-shard (sum, M2) gathered (2 x C floats a device, never the rows) and merged with Chan et
    al.'s correction for the shards' different means."""
    if not native.available():
        pytest.skip(native.unavailable_reason())
    n_dev = jax.device_count()
    mesh = jax.make_mesh((n_dev,), ("data",))
    rng = np.random.default_rng(3)
    # Each shard has its own mean, so the shards' M2 alone would miss most of the total.
    a = (rng.normal(size=(2 * n_dev, 3, 3, 32)) + np.repeat(np.arange(n_dev) * 5.0, 2)[:, None, None, None])
    a = a.astype(np.float32)
    b = rng.normal(size=a.shape).astype(np.float32)
    dat, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    a_s, b_s = jax.device_put(a, dat), jax.device_put(b, dat)
    moments = jax.jit(native.channel_moments, out_shardings=rep)
    products = jax.jit(native.channel_products, out_shardings=rep)
    if n_dev > 1:
        text = moments.lower(a_s).compile().as_text()
        gathered = re.findall(r"= (\w+\[[\d,]*\])\S* all-gather\(", text)
        assert gathered == [f"f32[{n_dev},2,32]"], gathered
        text = products.lower(a_s, b_s).compile().as_text()
        assert "all-gather" not in text and "all-reduce" in text
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    axes = (0, 1, 2)
    np.testing.assert_allclose(moments(a_s), np.stack([a64.sum(axes), ((a64 - a64.mean(axes)) ** 2).sum(axes)]),
                               rtol=2e-6, atol=1e-4)
    np.testing.assert_allclose(products(a_s, b_s), np.stack([a64.sum(axes), (a64 * b64).sum(axes)]),
                               rtol=2e-6, atol=1e-4)


def test_affine_act_equals_numpy():
    """x * a + b (+ r), with and without ReLU, on an odd number of rows; and the shape checks."""
    if not native.available():
        pytest.skip(native.unavailable_reason())
    rng = np.random.default_rng(9)
    x = rng.normal(size=(3, 5, 7, 32)).astype(np.float32)
    r = rng.normal(size=x.shape).astype(np.float32)
    a, b = rng.normal(size=32).astype(np.float32), rng.normal(size=32).astype(np.float32)
    for relu in (False, True):
        for res in (None, r):
            got = jax.jit(lambda x, a, b, r: native.affine_act(x, a, b, r, relu=relu))(x, a, b, res)
            want = x.astype(np.float64) * a + b + (0.0 if res is None else res)
            np.testing.assert_allclose(got, np.maximum(want, 0.0) if relu else want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"a and b must have shape \(32,\)"):
        native.affine_act(x, a[:16], b, relu=True)
    with pytest.raises(ValueError, match=r"residual has shape \(3, 5, 7, 16\)"):
        native.affine_act(x, a, b, r[..., :16], relu=True)
