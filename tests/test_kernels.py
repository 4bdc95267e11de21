"""jaxsprint.train.cpu.kernels: the native CPU kernels against lax and float64 numpy, their partitioning over a sharded
batch, and the off switch."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsprint.train.cpu import kernels as native

from conv_util import (DN, NATIVE_CASES, _assert_case_close, _assert_close, _check_batch_sharded, _inputs,  # noqa: E402
                       require_kernels)


def test_native_kernel_builds_where_a_compiler_exists():
    import shutil

    if shutil.which("g++") is None and not __import__("os").environ.get("CXX"):
        require_kernels()  # skips (or fails under JAXSPRINT_CPU_KERNELS=require): no compiler here
    assert native.available(), native.unavailable_reason()


def test_native_kernels_equal_lax_directly():
    """The kernels themselves, on every case (the router in jaxsprint.train.cpu.conv sends only some shapes there)."""
    require_kernels()

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
    require_kernels()
    x, w = jnp.ones((1, 6, 6, 16)), jnp.ones((3, 3, 16, 16))
    with pytest.raises(Exception, match="Winograd needs a stride-1 3x3 kernel"):
        jax.block_until_ready(native.conv(x, w, (3, 3), (2, 2), (1, 1), winograd=True))
    with pytest.raises(Exception, match="Winograd needs a stride-1 3x3 kernel"):
        jax.block_until_ready(native.filter_grad(x, jnp.ones((1, 3, 3, 16)), (3, 3), (2, 2), ((1, 1), (1, 1)),
                                                 winograd=True))


def test_native_filter_grad_batch_sharded_is_summed_not_gathered():
    """With the batch sharded over the fake devices, each device reduces its own examples, then a psum."""
    require_kernels()
    strides, padding = (2, 2), ((1, 1), (1, 1))
    mesh, xs, dys, ref = _check_batch_sharded(5, 16, strides, padding)

    def dw(x, dy):
        return native.filter_grad(x, dy, (3, 3), strides, padding)

    compiled = jax.jit(dw, out_shardings=NamedSharding(mesh, P())).lower(xs, dys).compile().as_text()
    assert "all-gather" not in compiled and "all-reduce" in compiled
    _assert_close(jax.jit(dw)(xs, dys), ref[2], rtol=1e-5)


def test_native_off_switch(tmp_path):
    """JAXSPRINT_CPU_KERNELS=off: nothing is built or used, and the XLA path gives the same gradients."""
    import os
    import subprocess
    import sys

    code = (
        "import jax, jax.numpy as jnp\n"
        "from jaxsprint.train.cpu import conv, kernels as native\n"
        "assert not native.available() and 'JAXSPRINT_CPU_KERNELS' in native.unavailable_reason()\n"
        "x = jnp.ones((2, 6, 6, 3)); w = jnp.ones((3, 3, 3, 16))\n"
        "g = jax.grad(lambda b: jnp.sum(conv.conv_general_dilated(x, b, (1, 1), 'SAME',\n"
        "    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))))(w)\n"
        "assert float(g[1, 1, 0, 0]) == 72.0, g[1, 1, 0, 0]\n"
        "print('ok')\n")
    env = dict(os.environ, JAXSPRINT_CPU_KERNELS="off", JAXSPRINT_NATIVE_CACHE=str(tmp_path), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_channel_stats_equal_float64_two_pass():
    """Moments and products against float64 numpy, on row counts that leave partial blocks and remainders of
    four rows, with a mean 500 standard deviations from zero (a one-pass sum of squares would lose it all)."""
    require_kernels()
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
    require_kernels()
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
    require_kernels()
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
