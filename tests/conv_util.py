"""Shared helpers of the convolution and kernel tests (tests/test_conv.py, tests/test_kernels.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsprint.train import cpu
from jaxsprint.train.cpu import conv as jconv
from jaxsprint.train.cpu import kernels as native

DN = ("NHWC", "HWIO", "NHWC")


def require_kernels() -> None:
    """Skips the calling test where the native kernels cannot be built, unless JAXSPRINT_CPU_KERNELS=require
    (as in CI), where that is a failure: kernel tests never skip silently there."""
    if native.available():
        return
    if cpu.env_mode() == "require":
        pytest.fail(f"{cpu.ENV_VAR}=require, but the native kernels are unavailable: {native.unavailable_reason()}")
    pytest.skip(native.unavailable_reason())


def kernels_mode() -> str:
    """The switch value that puts the native kernels in a model on any CPU that builds them: "require" there
    ("auto" keeps XLA's paths on a CPU without AVX-512), else "auto"."""
    return "require" if native.available() else "auto"


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
