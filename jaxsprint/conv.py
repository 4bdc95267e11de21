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
    barrier: bool = False
    mat: str = "none"
    chunks: int = 1


def _materialize(x, w, how):
    if how == "none":
        return x
    if how == "cond":
        p = jnp.isfinite(w.reshape(-1)[0])
        return lax.cond(p, lambda a: a, lambda a: jnp.zeros_like(a), x)
    if how == "while":
        n = jnp.isfinite(w.reshape(-1)[0]).astype(jnp.int32)
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.where(c[0] < 0, 0, c[1])),
                              (jnp.int32(0), x))[1]
    if how == "conv":
        c = x.shape[-1]
        return lax.conv_general_dilated(x, jnp.eye(c, dtype=x.dtype)[None, None], (1, 1), "VALID",
                                        dimension_numbers=_DN)
    raise ValueError(how)


def _fwd_conv(x, w, strides, pads, precision):
    return lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=_DN, precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _conv(x, w, strides, pads, precision, impl):
    return _fwd_conv(x, w, strides, pads, precision)


def _conv_fwd(x, w, strides, pads, precision, impl):
    y = _fwd_conv(x, w, strides, pads, precision)
    res = (_materialize(x, w, impl.mat), w)
    if impl.barrier:
        res = lax.optimization_barrier(res)
    return y, res


def _taps(xp, kh, kw, strides, ho, wo):
    sh, sw = strides
    n, _, _, c = xp.shape
    return [lax.slice(xp, (0, i, j, 0), (n, i + sh * (ho - 1) + 1, j + sw * (wo - 1) + 1, c), (1, sh, sw, 1))
            for i in range(kh) for j in range(kw)]


def _dw_xla(x, w, dy, strides, pads, precision):
    return jax.vjp(lambda b: _fwd_conv(x, b, strides, pads, precision), w)[1](dy)[0]


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
    dy = _materialize(dy, w, impl.mat)
    if impl.dx == "xla":
        dx = jax.vjp(lambda a: _fwd_conv(a, w, strides, pads, precision), x)[1](dy)[0]
    f = {"taps": _dw_taps, "im2col": _dw_im2col, "xla": _dw_xla}[impl.dw]
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
