"""WIP."""
from __future__ import annotations
import functools
from typing import NamedTuple
import jax
import jax.numpy as jnp
from jax import lax

_DN = lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


class Impl(NamedTuple):
    dw: str = "xla"
    dx: str = "xla"
    barrier: bool = True
    chunks: int = 1


def _fwd_conv(x, w, strides, pads, precision):
    return lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=_DN, precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _conv(x, w, strides, pads, precision, impl):
    return _fwd_conv(x, w, strides, pads, precision)


def _conv_fwd(x, w, strides, pads, precision, impl):
    y = _fwd_conv(x, w, strides, pads, precision)
    res = (x, w)
    if impl.barrier:
        res = lax.optimization_barrier(res)
    return y, res


def _taps(xp, kh, kw, strides, ho, wo):
    sh, sw = strides
    n, _, _, c = xp.shape
    return [lax.slice(xp, (0, i, j, 0), (n, i + sh * (ho - 1) + 1, j + sw * (wo - 1) + 1, c), (1, sh, sw, 1))
            for i in range(kh) for j in range(kw)]


def _dw_taps(x, w, dy, strides, pads, precision):
    kh, kw, c, k = w.shape
    n, ho, wo, _ = dy.shape
    xp = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    dy2 = dy.reshape(-1, k)
    g = [lax.dot_general(t.reshape(-1, c), dy2, (((0,), (0,)), ((), ())), precision=precision,
                         preferred_element_type=jnp.float32) for t in _taps(xp, kh, kw, strides, ho, wo)]
    return jnp.stack(g).reshape(w.shape).astype(w.dtype)


def _dw_im2col(x, w, dy, strides, pads, precision):
    kh, kw, c, k = w.shape
    n, ho, wo, _ = dy.shape
    xp = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    cols = jnp.concatenate(_taps(xp, kh, kw, strides, ho, wo), axis=-1).reshape(-1, kh * kw * c)
    g = lax.dot_general(cols, dy.reshape(-1, k), (((0,), (0,)), ((), ())), precision=precision,
                        preferred_element_type=jnp.float32)
    return g.reshape(w.shape).astype(w.dtype)


def _chunked(f, nc):
    def g(x, w, dy, *a):
        if nc <= 1 or x.shape[0] % nc:
            return f(x, w, dy, *a)
        xs = x.reshape((nc, -1) + x.shape[1:])
        dys = dy.reshape((nc, -1) + dy.shape[1:])
        def body(acc, xd):
            return acc + f(xd[0], w, xd[1], *a).astype(jnp.float32), None
        return lax.scan(body, jnp.zeros(w.shape, jnp.float32), (xs, dys))[0].astype(w.dtype)
    return g


def _conv_bwd(strides, pads, precision, impl, res, dy):
    x, w = res
    if impl.dx == "xla":
        dx = jax.vjp(lambda a: _fwd_conv(a, w, strides, pads, precision), x)[1](dy)[0]
    if impl.dw == "xla":
        dw = jax.vjp(lambda b: _fwd_conv(x, b, strides, pads, precision), w)[1](dy)[0]
    else:
        f = {"taps": _dw_taps, "im2col": _dw_im2col}[impl.dw]
        dw = _chunked(f, impl.chunks)(x, w, dy, strides, pads, precision)
    return dx, dw


_conv.defvjp(_conv_fwd, _conv_bwd)


def make_conv(kind, **kw):
    if kind == "xla":
        return lax.conv_general_dilated
    impl = Impl(**kw)
    def conv(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
             feature_group_count=1, batch_group_count=1, precision=None, preferred_element_type=None):
        pads = padding
        if isinstance(padding, str):
            pads = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
        pads = tuple(tuple(p) for p in pads)
        return _conv(lhs, rhs, tuple(window_strides), pads, precision, impl)
    return conv
