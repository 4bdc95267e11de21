"""A 2-D convolution whose backward pass is fast on XLA:CPU, as a drop-in for lax.conv_general_dilated.

Why: on CPU a plain ``jax.grad`` of ``lax.conv_general_dilated`` spends most of a ResNet step outside the
convolutions. XLA computes the filter gradient over "batch as feature" layouts, and the transposes it inserts
are fused with the elementwise producers of x and dy (BatchNorm, residual add, ReLU), so each recomputes a
whole elementwise chain while reading with the stride of an image; and XLA:CPU has no fast filter-gradient
kernel for few channels.

What it does (values and gradients equal to lax's up to summation order; tested), in float32 on CPU:

* forward and stride-1 input gradient: Winograd F(2x2, 3x3) for 3x3 stride-1 layers with channels multiples
  of 16, the native direct kernel for 16-output-channel layers (the ResNet-20 stem), else lax itself;
* strided input gradient: one native stride-1 convolution per phase of the stride, without the zeros a
  transposed convolution dilates dy with; elsewhere ``jax.vjp`` of the same call;
* filter gradient ``dW[i, j, c, k] = sum_{n,h,w} x_p[n, s_h h + i, s_w w + j, c] dy[n, h, w, k]``: the native
  kernel (Winograd for 3x3 stride 1) where the reduction is long against the output, one matmul for 1x1
  kernels, else XLA's own convolution on operands this module transposes inside a ``lax.cond`` (a boundary
  XLA's fusion cannot cross, so each transpose reads a materialised buffer once).

The native kernels are compiled on first use (a C++ compiler is needed; without one, or with
``JAXSPRINT_CPU_KERNELS=off``, the XLA paths are used). The fast path covers NHWC input, HWIO kernel, no
groups or dilation, any stride, kernel size and padding, float32/bfloat16/float16; everything else, and
forward-mode differentiation (as for any ``jax.custom_vjp``), is ``lax.conv_general_dilated`` (kind "xla").
:func:`compiler_options` jits with YNNPACK for reductions only, so that the convolutions go to Eigen, which
uses every core of a single device. Measured speed-ups per layer and per step: ``docs/cpu-speed.md``.

    conv = jaxsprint.train.cpu.conv.make_conv("auto")  # "auto" | "fast" | "xla"
    y = nn.Conv(64, (3, 3), conv_general_dilated=conv)(x)

Models and training get it through :func:`jaxsprint.train.cpu.acceleration`, which decides once per run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxsprint.train.cpu import kernels as native

__all__ = ["ConvFn", "KINDS", "compiler_options", "conv_general_dilated", "fast_path_supported", "make_conv"]

ConvFn = Callable[..., jax.Array]
KINDS = ("xla", "fast", "auto")

# NHWC input, HWIO kernel, NHWC output: lhs_spec, rhs_spec, out_spec as lax stores them.
_NHWC_DN = lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))
_FAST_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))

Pads = tuple[tuple[int, int], tuple[int, int]]


def _lax_conv(x: jax.Array, w: jax.Array, strides: tuple[int, int], pads: Pads, precision: Any) -> jax.Array:
    """The reference NHWC/HWIO convolution."""
    return lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=_NHWC_DN, precision=precision)


def _materialized_transpose(a: jax.Array, perm: tuple[int, ...], w: jax.Array) -> jax.Array:
    """``jnp.transpose(a, perm)`` behind a fusion boundary.

    Both branches of the conditional are the same transpose, so the result never depends on the
    predicate; the predicate only has to be unknown at compile time so XLA keeps the conditional,
    and with it a materialized operand (XLA cannot fuse the producers of ``a`` into the branch).
    """
    flat = w.reshape(-1)[0]
    pred = flat == flat

    def t(b: jax.Array) -> jax.Array:
        return jnp.transpose(b, perm)

    return lax.cond(pred, t, t, a)


def _filter_grad_1x1(x: jax.Array, w: jax.Array, dy: jax.Array, strides: tuple[int, int], pads: Pads,
                     precision: Any) -> jax.Array:
    """dW[0, 0, c, k] = sum_{n,h,w} x_p[n, s_h h, s_w w, c] dy[n, h, w, k], as one matmul.

    The strided input is transposed to [C, N*H_o*W_o] behind a fusion boundary so that the product
    [C, M] @ [M, K] has the row-major operands XLA's YNNPACK matmul takes.
    """
    n, ho, wo, k = dy.shape
    c = x.shape[-1]
    xp = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0))) if any(p for pp in pads for p in pp) else x
    xs = lax.slice(xp, (0, 0, 0, 0), (n, strides[0] * (ho - 1) + 1, strides[1] * (wo - 1) + 1, c),
                   (1, strides[0], strides[1], 1))
    xt = _materialized_transpose(xs.reshape(-1, c), (1, 0), w)
    g = lax.dot_general(xt, dy.reshape(-1, k), (((1,), (0,)), ((), ())), precision=precision,
                        preferred_element_type=jnp.float32)
    return g.reshape(w.shape).astype(w.dtype)


def _filter_grad_conv(x: jax.Array, w: jax.Array, dy: jax.Array, strides: tuple[int, int], pads: Pads,
                      precision: Any) -> jax.Array:
    """dW as XLA's own filter-gradient convolution, on operands transposed behind a fusion boundary.

    With x_t[c, h, w, n] = x[n, h, w, c] and dy_t[h, w, n, k] = dy[n, h, w, k], the gradient is the
    convolution of x_t (batch c, feature n) with dy_t as a kernel dilated by the stride (input
    feature n, output feature k): dW_t[c, i, j, k] = sum_{h,w,n} x_tp[c, i + s_h h, j + s_w w, n]
    dy_t[h, w, n, k]. The high padding is trimmed so the output is exactly k_h x k_w.
    """
    kh, kw = w.shape[:2]
    _, h, wd, _ = x.shape
    xt = _materialized_transpose(x, (3, 1, 2, 0), w)
    dyt = _materialized_transpose(dy, (1, 2, 0, 3), w)
    pads_t = []
    for (lo, hi), size, k, s in ((pads[0], h, kh, strides[0]), (pads[1], wd, kw, strides[1])):
        pads_t.append((lo, hi - (size + lo + hi - k) % s))
    g = lax.conv_general_dilated(xt, dyt, (1, 1), pads_t, rhs_dilation=strides, dimension_numbers=_NHWC_DN,
                                 precision=precision, preferred_element_type=jnp.float32)
    return jnp.transpose(g, (1, 2, 0, 3)).astype(w.dtype)


def _native_forward_algo(x: jax.Array, w: jax.Array, strides: tuple[int, int]) -> str | None:
    """Which native CPU kernel runs this forward convolution: "winograd", "direct" or None (XLA's).

    Only where it measured faster than XLA's convolution on this project's CPU
    (``scripts/bench_conv_layers.py``): Winograd's F(2x2, 3x3) for every float32 3x3 stride-1 convolution
    with input and output channels multiples of 16 (ResNet-20's and ResNet-50's 3x3 layers: 1.3-3x faster than
    XLA's and 1.5x faster than the direct kernel); the direct kernel for the other layers with 16 output
    channels from at most 16 input channels (ResNet-20's stem).
    """
    if not (jax.default_backend() == "cpu" and x.dtype == w.dtype
            and native.conv_supported(x.shape, w.shape, x.dtype)):
        return None
    if native.winograd_supported(x.shape, w.shape, x.dtype, strides):
        algo = "winograd"
    elif w.shape[-1] == 16 and x.shape[-1] <= 16:
        algo = "direct"
    else:
        return None
    return algo if native.available() else None


def _forward(x: jax.Array, w: jax.Array, strides: tuple[int, int], pads: Pads, precision: Any) -> jax.Array:
    algo = _native_forward_algo(x, w, strides)
    if algo:
        out_hw = tuple((x.shape[1 + d] + pads[d][0] + pads[d][1] - w.shape[d]) // strides[d] + 1 for d in (0, 1))
        return native.conv(x, w, out_hw, strides, (pads[0][0], pads[1][0]), winograd=algo == "winograd")
    return _lax_conv(x, w, strides, pads, precision)


def _phase_taps(k: int, s: int, pad_lo: int, r: int) -> tuple[int, int, int]:
    """For input rows h = s m + r of a stride-s convolution: (first tap i0, tap count t, low padding p).

    dx[s m + r] = sum over taps i = i0 + s u (u < t) of dy[m + q - u] w[i], with q = (r + pad_lo - i0) / s;
    as a correlation with the reversed taps w'[v] = w[i0 + s (t - 1 - v)] that is a stride-1 convolution of
    dy with low padding t - 1 - q (negative: the first rows of dy are skipped).
    """
    i0 = (r + pad_lo) % s
    t = max(0, -(-(k - i0) // s))
    return i0, t, t - 1 - (r + pad_lo - i0) // s


def _strided_input_grad_native(x_shape: tuple[int, ...], w: jax.Array, dy: jax.Array, strides: tuple[int, int],
                               pads: Pads) -> jax.Array | None:
    """dx of a strided convolution as s_h * s_w stride-1 native convolutions, one per phase (r_h, r_w) of
    the input rows and columns, interleaved; None where the native kernels do not apply.

    The rows h = s_h m + r_h of dx receive only the taps i = r_h + p_h (mod s_h), so each phase is a small
    stride-1 convolution of dy (a 3x3 stride-2 kernel splits into 1x1, 1x2, 2x1 and 2x2 ones): the same
    multiplications as XLA's transposed convolution, without the zeros it dilates dy with.
    """
    kh, kw, c, k = w.shape
    n, h, wd = x_shape[:3]
    sh, sw = strides
    if (jax.default_backend() != "cpu" or h % sh or wd % sw or w.dtype != jnp.float32 or dy.dtype != jnp.float32
            or not native.conv_supported(dy.shape, (kh, kw, k, c), dy.dtype) or not native.available()):
        return None
    mh, mw = h // sh, wd // sw
    rows = []
    for rh in range(sh):
        ih, th, ph = _phase_taps(kh, sh, pads[0][0], rh)
        cols = []
        for rw in range(sw):
            iw, tw, pw = _phase_taps(kw, sw, pads[1][0], rw)
            if th == 0 or tw == 0:
                cols.append(jnp.zeros((n, mh, mw, c), dy.dtype))
                continue
            sub = w[ih::sh, iw::sw][::-1, ::-1]  # taps i0, i0 + s, ... (th x tw of them), reversed
            cols.append(native.conv(dy, jnp.transpose(sub, (0, 1, 3, 2)), (mh, mw), (1, 1), (ph, pw)))
        rows.append(jnp.stack(cols, axis=3))  # [n, mh, mw, sw, c]
    return jnp.stack(rows, axis=2).reshape(n, h, wd, c)  # [n, mh, sh, mw, sw, c] -> [n, h, w, c]


def _input_grad(x: jax.Array, w: jax.Array, dy: jax.Array, strides: tuple[int, int], pads: Pads,
                precision: Any) -> jax.Array:
    """dx. With stride 1 it is a stride-1 convolution of dy with the flipped, transposed kernel
    (low padding k - 1 - p), which the native kernels run where they are faster; with a larger stride, one
    such convolution per phase of the stride (``_strided_input_grad_native``); else XLA's own."""
    kh, kw, c, k = w.shape
    algo = None
    if strides == (1, 1):
        algo = _native_forward_algo(dy, jax.ShapeDtypeStruct((kh, kw, k, c), w.dtype), (1, 1))
    if algo:
        wt = jnp.transpose(jnp.flip(w, (0, 1)), (0, 1, 3, 2))
        return native.conv(dy, wt, x.shape[1:3], (1, 1), (kh - 1 - pads[0][0], kw - 1 - pads[1][0]),
                           winograd=algo == "winograd")
    if strides != (1, 1):
        dx = _strided_input_grad_native(x.shape, w, dy, strides, pads)
        if dx is not None:
            return dx
    _, vjp_x = jax.vjp(lambda a: _lax_conv(a, w, strides, pads, precision), x)
    return vjp_x(dy)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _fast_conv(x: jax.Array, w: jax.Array, strides: tuple[int, int], pads: Pads, precision: Any) -> jax.Array:
    return _forward(x, w, strides, pads, precision)


def _fast_conv_fwd(x, w, strides, pads, precision):
    return _forward(x, w, strides, pads, precision), (x, w)


# The native filter gradient beats XLA's when the reduction (N * H_out * W_out rows) is long against the
# output (k_h * k_w * C * K values); measured on this project's CPU, ``scripts/bench_conv_layers.py`` and the
# ResNet-50 shapes of the README: all ResNet-20 layers (ratio 0.22 and up) and ResNet-50 at 56x56 (2.7 and
# up) ran 1.5-2.5x faster, ResNet-50's 3x3 layers at 28x28 and below (0.17 and below) 1.1-1.4x slower.
_NATIVE_DW_MIN_ROWS_PER_OUTPUT = 0.2


def _native_filter_grad_ok(x: jax.Array, w: jax.Array, dy: jax.Array) -> bool:
    """Whether the filter gradient goes to the native CPU kernel (jaxsprint.train.cpu.kernels)."""
    if not (jax.default_backend() == "cpu" and x.dtype == w.dtype == dy.dtype
            and native.supported(x.shape, dy.shape, x.dtype, w.shape[:2])):
        return False
    rows = dy.shape[0] * dy.shape[1] * dy.shape[2]
    if rows < _NATIVE_DW_MIN_ROWS_PER_OUTPUT * w.size:
        return False
    return native.available()


# Winograd's filter gradient measured faster than the direct native one for 3x3 stride-1 layers up to 256 x 256
# channels (1.1-1.4x: ResNet-20's layers at batch 16 and 128, ResNet-50's at batch 32), slower at 512 x 512.
_WINOGRAD_DW_MAX_CHANNELS = 256


def _winograd_filter_grad_ok(x: jax.Array, w: jax.Array, strides: tuple[int, int]) -> bool:
    return (native.winograd_supported(x.shape, w.shape, x.dtype, strides)
            and max(w.shape[2], w.shape[3]) <= _WINOGRAD_DW_MAX_CHANNELS)


def _fast_conv_bwd(strides, pads, precision, res, dy):
    x, w = res
    dx = _input_grad(x, w, dy, strides, pads, precision)
    if _native_filter_grad_ok(x, w, dy):
        dw = native.filter_grad(x, dy, w.shape[:2], strides, pads, winograd=_winograd_filter_grad_ok(x, w, strides))
    elif w.shape[0] == w.shape[1] == 1:
        dw = _filter_grad_1x1(x, w, dy, strides, pads, precision)
    else:
        dw = _filter_grad_conv(x, w, dy, strides, pads, precision)
    return dx, dw


_fast_conv.defvjp(_fast_conv_fwd, _fast_conv_bwd)


def _fast_plan(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
               feature_group_count, batch_group_count, preferred_element_type,
               out_sharding) -> tuple[tuple[int, int], Pads] | None:
    """Returns (strides, explicit pads) when the fast path applies, else None."""
    if getattr(lhs, "ndim", None) != 4 or getattr(rhs, "ndim", None) != 4:
        return None
    if feature_group_count != 1 or batch_group_count != 1 or out_sharding is not None:
        return None
    if lhs.dtype != rhs.dtype or jnp.dtype(lhs.dtype) not in _FAST_DTYPES:
        return None
    if preferred_element_type is not None and jnp.dtype(preferred_element_type) != jnp.dtype(lhs.dtype):
        return None
    for dil in (lhs_dilation, rhs_dilation):
        if dil is not None and tuple(dil) != (1, 1):
            return None
    if dimension_numbers is None:
        return None
    try:
        dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    except (TypeError, ValueError):
        return None
    if dn != _NHWC_DN:
        return None
    strides = tuple(int(s) for s in window_strides)
    if len(strides) != 2 or min(strides) < 1:
        return None
    if isinstance(padding, str):
        try:
            pads = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], strides, padding)
        except (TypeError, ValueError, RuntimeError):  # unknown padding: let lax report it
            return None
    else:
        pads = padding
    try:
        pads = tuple((int(lo), int(hi)) for lo, hi in pads)
    except (TypeError, ValueError):
        return None
    if len(pads) != 2 or min(min(p) for p in pads) < 0:
        return None
    for size, (lo, hi), k in zip(lhs.shape[1:3], pads, rhs.shape[:2]):
        if size + lo + hi < k:
            return None
    if lhs.shape[3] != rhs.shape[2] or 0 in lhs.shape or 0 in rhs.shape:
        return None
    return strides, pads  # type: ignore[return-value]


def fast_path_supported(lhs: Any, rhs: Any, window_strides: Sequence[int], padding: str | Sequence[tuple[int, int]],
                        lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                        dimension_numbers: Any = None, feature_group_count: int = 1, batch_group_count: int = 1,
                        preferred_element_type: Any = None) -> bool:
    """Whether :func:`conv_general_dilated` takes its fast path for these arguments (shapes suffice)."""
    return _fast_plan(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                      feature_group_count, batch_group_count, preferred_element_type, None) is not None


def conv_general_dilated(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int],
                         padding: str | Sequence[tuple[int, int]], lhs_dilation: Sequence[int] | None = None,
                         rhs_dilation: Sequence[int] | None = None, dimension_numbers: Any = None,
                         feature_group_count: int = 1, batch_group_count: int = 1, precision: Any = None,
                         preferred_element_type: Any = None, out_sharding: Any = None, *,
                         batch_split: int = 1) -> jax.Array:
    """Drop-in for ``lax.conv_general_dilated`` with a CPU-friendly custom VJP.

    Same signature and forward values as ``lax.conv_general_dilated``. For NHWC/HWIO/NHWC
    convolutions without groups or dilation (see the module docstring) the gradient is computed by
    :func:`_fast_conv_bwd`; otherwise this simply calls ``lax.conv_general_dilated``.

    Args:
        lhs: input, [N, H, W, C] on the fast path.
        rhs: kernel, [k_h, k_w, C, K] on the fast path.
        window_strides: (s_h, s_w).
        padding: "SAME", "VALID", "SAME_LOWER" or ((lo_h, hi_h), (lo_w, hi_w)).
        lhs_dilation: must be None or ones for the fast path.
        rhs_dilation: must be None or ones for the fast path.
        dimension_numbers: e.g. ("NHWC", "HWIO", "NHWC") or flax's ConvDimensionNumbers.
        feature_group_count: must be 1 for the fast path.
        batch_group_count: must be 1 for the fast path.
        precision: passed to every convolution and matmul.
        preferred_element_type: must be None or lhs.dtype for the fast path.
        out_sharding: must be None for the fast path.
        batch_split: on the fast path, run the convolution (and its gradients) on this many
            contiguous slices of the batch, independent ops that XLA:CPU can run concurrently
            (its YNNPACK convolutions are single-threaded). Only for a batch that is not sharded
            over devices; used when it divides the batch.

    Returns:
        y[n, h, w, k] = sum_{i, j, c} x_p[n, s_h h + i, s_w w + j, c] * W[i, j, c, k].
    """
    plan = _fast_plan(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                      feature_group_count, batch_group_count, preferred_element_type, out_sharding)
    if plan is None:
        kwargs = {} if out_sharding is None else {"out_sharding": out_sharding}
        return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation,
                                        rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
                                        feature_group_count=feature_group_count,
                                        batch_group_count=batch_group_count, precision=precision,
                                        preferred_element_type=preferred_element_type, **kwargs)
    strides, pads = plan
    if isinstance(precision, list):
        precision = tuple(precision)
    n = lhs.shape[0]
    if batch_split > 1 and n % batch_split == 0 and n > batch_split:
        m = n // batch_split
        return jnp.concatenate([_fast_conv(lhs[i * m:(i + 1) * m], rhs, strides, pads, precision)
                                for i in range(batch_split)], axis=0)
    return _fast_conv(lhs, rhs, strides, pads, precision)


def _auto_conv_general_dilated(*args: Any, batch_split: int = 1, **kwargs: Any) -> jax.Array:
    """The fast convolution when tracing for the CPU backend, lax's everywhere else."""
    if jax.default_backend() != "cpu":
        return lax.conv_general_dilated(*args, **kwargs)
    return conv_general_dilated(*args, batch_split=batch_split, **kwargs)


# XLA options of a jitted function whose convolutions run on a single CPU device (see the module
# docstring): YNNPACK keeps the reductions (BatchNorm statistics), Eigen takes the convolutions.
SINGLE_CPU_DEVICE_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}


def compiler_options(kind: str = "auto") -> dict[str, str] | None:
    """XLA compiler options for ``jax.jit(..., compiler_options=...)`` of a function using ``make_conv(kind)``.

    Returns :data:`SINGLE_CPU_DEVICE_OPTIONS` when ``kind`` is "auto" or "fast", the default backend
    is CPU and the process has one JAX device; None (XLA's defaults) otherwise, and always for "xla",
    which stays XLA's plain behaviour. Decided when called (it initialises the JAX backend).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown conv kind {kind!r}; expected one of {KINDS}")
    if kind == "xla" or jax.default_backend() != "cpu" or jax.device_count() != 1:
        return None
    return dict(SINGLE_CPU_DEVICE_OPTIONS)


def make_conv(kind: str = "auto", *, batch_split: int | None = None) -> ConvFn:
    """Selects the convolution that models pass to ``flax.linen.Conv(conv_general_dilated=...)``.

    Args:
        kind: "xla" (``lax.conv_general_dilated``, XLA's own gradient), "fast" (this module's
            custom-VJP convolution on every backend) or "auto" (fast when the default JAX backend
            is CPU, decided each time a function is traced; XLA's own elsewhere).
        batch_split: see :func:`conv_general_dilated`. None means 1. Ignored by "xla".

    Returns:
        A function with the signature of ``lax.conv_general_dilated``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown conv kind {kind!r}; expected one of {KINDS}")
    if batch_split is not None and (not isinstance(batch_split, int) or batch_split < 1):
        raise ValueError(f"batch_split must be a positive int or None, got {batch_split!r}")
    if kind == "xla":
        return lax.conv_general_dilated
    if kind == "fast":
        if batch_split is None or batch_split == 1:
            return conv_general_dilated
        return functools.partial(conv_general_dilated, batch_split=batch_split)
    if batch_split is None:
        return _auto_conv_general_dilated
    return functools.partial(_auto_conv_general_dilated, batch_split=batch_split)
