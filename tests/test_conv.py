"""jaxsprint.train.cpu.conv: values and gradients equal jax.grad of lax.conv_general_dilated."""

from __future__ import annotations


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxsprint.train.cpu import conv as jconv
from jaxsprint.train.cpu import kernels as native

from conv_util import (DN, NATIVE_CASES, _assert_case_close, _assert_close, _check_batch_sharded, _inputs,  # noqa: E402
                       _value_and_grads, require_kernels)



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
from jaxsprint.train.cpu import conv as jconv
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


def test_native_filter_grad_equals_lax():
    require_kernels()
    for case in NATIVE_CASES:
        n, h, wd, c, k, ks, s, padding = case
        x, w, dy = _inputs(n, h, wd, c, k, ks, ks, (s, s), padding, jnp.float32)
        assert native.supported(x.shape, dy.shape, x.dtype, (ks, ks))

    results = _group_results(NATIVE_CASES, jnp.float32, jnp.float32)
    for case, (fast, ref) in zip(NATIVE_CASES, results):
        _assert_case_close(case, zip(("y", "dx", "dw"), fast, ref))


def _native_calls(monkeypatch):
    """Records the native kernel calls made while tracing: ("conv" | "filter_grad", winograd) pairs."""
    calls = []
    for name in ("conv", "filter_grad"):
        real = getattr(native, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append((_name, bool(kwargs.get("winograd", False))))
            return _real(*args, **kwargs)

        monkeypatch.setattr(native, name, spy)
    return calls


def test_native_path_is_taken_only_where_supported(monkeypatch):
    """The router sends exactly the supported shapes to the native kernels (checked by which kernels the
    traced function calls, not by its HLO text)."""
    require_kernels()
    calls = _native_calls(monkeypatch)

    def traced(fn, *args):
        calls.clear()
        jax.eval_shape(fn, *args)
        return sorted(calls)

    def filter_grad_case(dtype, k, n=4, c=4):
        x, w, dy = _inputs(n, 8, 8, c, k, 3, 3, (1, 1), "SAME", dtype)
        return traced(lambda x, w: jax.value_and_grad(lambda b: jnp.sum(
            jconv.conv_general_dilated(x, b, (1, 1), "SAME", dimension_numbers=DN) * dy))(w), x, w)

    # C = 4, K = 16: the native forward (direct) and filter gradient; no native dx (C = 4).
    assert filter_grad_case(jnp.float32, 16) == [("conv", False), ("filter_grad", False)]
    assert filter_grad_case(jnp.float32, 32) == [("filter_grad", False)]  # C = 4, K = 32: no native forward
    # C = 16, K = 32, 3x3, stride 1: Winograd for the forward, the input gradient and the filter gradient.
    both = lambda x, w: jax.grad(lambda a, b: jnp.sum(  # noqa: E731
        jconv.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=DN) ** 2), argnums=(0, 1))(x, w)
    assert traced(both, jnp.ones((16, 8, 8, 16)), jnp.ones((3, 3, 16, 32))) == [
        ("conv", True), ("conv", True), ("filter_grad", True)]
    strided = lambda x, w: jconv.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=DN)  # noqa: E731
    assert traced(strided, jnp.ones((2, 8, 8, 16)), jnp.ones((3, 3, 16, 32))) == []
    # Its input gradient: four native phase convolutions (1x1, 1x2, 2x1, 2x2 taps).
    strided_dx = lambda x, w: jax.grad(lambda a: jnp.sum(  # noqa: E731
        jconv.conv_general_dilated(a, w, (2, 2), "SAME", dimension_numbers=DN) ** 2))(x)
    assert traced(strided_dx, jnp.ones((2, 8, 8, 16)), jnp.ones((3, 3, 16, 32))) == [("conv", False)] * 4
    # An odd input size keeps XLA's transposed convolution (the phases would not interleave evenly).
    assert traced(strided_dx, jnp.ones((2, 9, 8, 16)), jnp.ones((3, 3, 16, 32))) == []
    assert ("filter_grad", False) not in filter_grad_case(jnp.float32, 8)     # K not a multiple of 16
    assert ("filter_grad", False) not in filter_grad_case(jnp.bfloat16, 16)  # float32 only
    # A reduction short against the output (2 * 8 * 8 rows for 3 * 3 * 64 * 64 values): XLA's is faster there.
    assert ("filter_grad", False) not in filter_grad_case(jnp.float32, 64, n=2, c=64)
    assert not native.supported((2, 8, 8, 4), (2, 8, 8, 16), jnp.float16, (3, 3))
    assert not native.supported((2, 8, 8, 4), (3, 8, 8, 16), jnp.float32, (3, 3))  # batch mismatch