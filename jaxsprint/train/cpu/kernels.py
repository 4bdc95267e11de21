"""Native CPU kernels for convolutions (the filter gradient, and a forward convolution), called from XLA
through the FFI.

``filter_grad(x, dy, kernel_size, strides, pads)`` computes

    dW[i, j, c, k] = sum_{n, h, w} x_p[n, s_h h + i, s_w w + j, c] * dy[n, h, w, k]

for float32 NHWC ``x`` and ``dy`` (``x_p``: x zero-padded by ``pads``), as one XLA custom call, and
``conv(x, w, out_hw, strides, pads_lo, winograd=...)`` the forward convolution, directly or, for 3x3 stride-1
kernels with input channels a multiple of 16, with Winograd's F(2x2, 3x3). Output channels must be a
multiple of 16 (the kernels' vector width). Both run on XLA's intra-op thread pool.

Why: XLA:CPU has no fast filter-gradient kernel for small channel counts (it runs the filter gradient as a
convolution whose "kernel" is the whole output gradient), and jaxlib does not expose oneDNN's convolutions.

The kernels (``conv_kernels.cc``, ``bn_kernels.cc``, ``kernels_common.h``: one library) are compiled on first
use with ``$CXX`` (else ``g++``) for this CPU (``-march=native``) into a per-user cache
(``$JAXSPRINT_NATIVE_CACHE``, else ``~/.cache/jaxsprint``, else a per-user temp folder), keyed by the source,
the flags, the jaxlib version and the CPU's feature flags, so a cached library never runs on a CPU it was not
built for. A machine without a compiler does not get them: :func:`available` says why, and callers use XLA's
convolution. Under ``jit`` with a sharded batch the calls are partitioned with ``custom_partitioning``
(each device works on its own examples; filter gradients are summed over the batch's mesh axes). With
``cpu_kernels`` or ``JAXSPRINT_CPU_KERNELS`` "off" nothing is built or used (:mod:`jaxsprint.train.cpu`).
Measured speed: ``docs/cpu-speed.md``.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsprint.train.cpu import switch

__all__ = ["affine_act", "available", "channel_moments", "channel_products", "channel_stats_supported", "conv",
           "conv_supported", "filter_grad", "supported", "unavailable_reason", "winograd_supported"]

_DIR = os.path.dirname(os.path.abspath(__file__))
_SOURCES = tuple(os.path.join(_DIR, f) for f in ("conv_kernels.cc", "bn_kernels.cc"))  # one library
_HEADERS = (os.path.join(_DIR, "kernels_common.h"),)
_TARGET = "jaxsprint_conv_filter_grad_f32"
_SYMBOL = "JaxsprintConvFilterGradF32"
_CONV_TARGET = "jaxsprint_conv_f32"
_CONV_SYMBOL = "JaxsprintConvF32"
_MOMENTS_TARGET = "jaxsprint_channel_moments_f32"
_MOMENTS_SYMBOL = "JaxsprintChannelMomentsF32"
_PRODUCTS_TARGET = "jaxsprint_channel_products_f32"
_PRODUCTS_SYMBOL = "JaxsprintChannelProductsF32"
_AFFINE_TARGET = "jaxsprint_affine_act_f32"
_AFFINE_SYMBOL = "JaxsprintAffineActF32"
_AFFINE_ADD_TARGET = "jaxsprint_affine_add_act_f32"
_AFFINE_ADD_SYMBOL = "JaxsprintAffineAddActF32"
_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC")
_LANES = 16  # the kernel's vector width: output channels must be a multiple of it

_lock = threading.Lock()
_state: dict[str, object] = {}


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    import platform

    return platform.machine() + platform.processor()


def _cache_dir() -> str:
    """$JAXSPRINT_NATIVE_CACHE, else the user cache (~/.cache/jaxsprint), else a per-user temp folder."""
    d = os.environ.get("JAXSPRINT_NATIVE_CACHE")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for d in (os.path.join(base, "jaxsprint"), os.path.join(tempfile.gettempdir(), f"jaxsprint-{os.getuid()}")):
        try:
            os.makedirs(d, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d
    raise RuntimeError(f"no writable cache folder for the native kernels (tried {base}/jaxsprint and the "
                       "temp folder; set JAXSPRINT_NATIVE_CACHE)")


def _build() -> str:
    """Compiles the kernel if no matching library is cached; returns the library's path."""
    import jaxlib

    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler: {cxx!r} is not on PATH (set CXX)")
    source = b""
    for path in _SOURCES + _HEADERS:
        with open(path, "rb") as fh:
            source += fh.read() + b"\0"
    key = hashlib.sha256(b"\0".join([source, " ".join(_FLAGS).encode(), cxx.encode(),
                                     jaxlib.__version__.encode(), _cpu_flags().encode()])).hexdigest()[:16]
    out_dir = _cache_dir()
    lib = os.path.join(out_dir, f"libjaxsprint_conv_{key}.so")
    if os.path.exists(lib):
        return lib
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [cxx, *_FLAGS, "-I", jax.ffi.include_dir(), "-I", _DIR, *_SOURCES, "-o", tmp, "-lpthread"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode:
            names = ", ".join(map(os.path.basename, _SOURCES))
            # The errors first: the compiler's warnings (jaxlib's headers give many) would push them out of the tail.
            errors = [line for line in r.stderr.splitlines() if "error" in line]
            raise RuntimeError(f"compiling {names} failed: " + ("\n".join(errors) or r.stderr.strip())[-2000:])
        os.replace(tmp, lib)  # atomic: a concurrent build of the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _load() -> bool:
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])

        if switch.env_mode() == "off":
            _state.update(ok=False, reason=f"disabled by {switch.ENV_VAR}=off")
            return False
        try:
            lib = ctypes.cdll.LoadLibrary(_build())
            jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(getattr(lib, _SYMBOL)), platform="cpu")
            jax.ffi.register_ffi_target(_CONV_TARGET, jax.ffi.pycapsule(getattr(lib, _CONV_SYMBOL)), platform="cpu")
            for target, symbol in ((_MOMENTS_TARGET, _MOMENTS_SYMBOL), (_PRODUCTS_TARGET, _PRODUCTS_SYMBOL),
                                   (_AFFINE_TARGET, _AFFINE_SYMBOL), (_AFFINE_ADD_TARGET, _AFFINE_ADD_SYMBOL)):
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
            _state.update(ok=True, reason="", lib=lib)
        except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as e:
            _state.update(ok=False, reason=str(e))
        return bool(_state["ok"])


def suits_this_cpu() -> tuple[bool, str]:
    """Whether the kernels are worth using on this CPU, and if not why (for ``cpu_kernels=auto``).

    They are written for 16-float vectors, one AVX-512 register. Without AVX-512 they still build and give the
    same values (``require`` uses them, so their tests run everywhere), but GCC splits every vector over
    narrower registers and the step gets far slower than XLA's own: ResNet-20 at batch 128 on 8 fake devices,
    2,941 ms against 747 ms, on a 2-core AMD EPYC with AVX2 only (``scripts/bench_step.py --rows=resnet20:128``).
    """
    flags = _cpu_flags().split()
    if "avx512f" in flags:
        return True, ""
    return False, "this CPU has no AVX-512, for whose 16-float vectors the native kernels are written"


def available() -> bool:
    """Whether the kernel is built and registered (builds it on the first call; a few seconds)."""
    return _load()


def _require() -> None:
    if not _load():
        raise RuntimeError(f"the native convolution kernels are unavailable: {_state.get('reason', '')}")


def unavailable_reason() -> str:
    """Why :func:`available` is False ("" when it is True)."""
    _load()
    return str(_state.get("reason", ""))


def supported(x_shape, dy_shape, dtype, kernel_size) -> bool:
    """Whether :func:`filter_grad` handles these operands (shapes and dtype only; does not build)."""
    return (len(x_shape) == 4 and len(dy_shape) == 4 and x_shape[0] == dy_shape[0]
            and jnp.dtype(dtype) == jnp.dtype(jnp.float32) and dy_shape[-1] % _LANES == 0
            and len(kernel_size) == 2 and min(kernel_size) >= 1)


def _threads() -> int:
    """Kernel threads: the usable cores with one local device, else 1 (the devices already run concurrently)."""
    if jax.local_device_count() > 1:
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _call(x, dy, kernel_size, strides, pads, winograd, threads):
    shape = jax.ShapeDtypeStruct((*kernel_size, x.shape[-1], dy.shape[-1]), jnp.float32)
    return jax.ffi.ffi_call(_TARGET, shape)(
        x, dy, kh=np.int64(kernel_size[0]), kw=np.int64(kernel_size[1]), sh=np.int64(strides[0]),
        sw=np.int64(strides[1]), ph=np.int64(pads[0][0]), pw=np.int64(pads[1][0]), winograd=np.int64(winograd),
        threads=np.int64(threads))


def _batch_axes(sharding):
    spec = getattr(sharding, "spec", None)
    return spec[0] if spec is not None and len(spec) else None


def _filter_grad_infer(kernel_size, strides, pads, winograd, threads, mesh, arg_shapes, result_shape):
    """The result (dW) is replicated: every device holds the sum over all examples."""
    return NamedSharding(mesh, P())


def _partition(kernel_size, strides, pads, winograd, threads, mesh, arg_shapes, result_shape):
    axes = _batch_axes(arg_shapes[0].sharding)
    in_sharding = NamedSharding(mesh, P(axes))

    def lower(x, dy):
        g = _call(x, dy, kernel_size, strides, pads, winograd, threads)
        return lax.psum(g, axes) if axes else g

    return mesh, lower, NamedSharding(mesh, P()), (in_sharding, in_sharding)


@functools.partial(custom_partitioning, static_argnums=(2, 3, 4, 5, 6))
def _filter_grad(x, dy, kernel_size, strides, pads, winograd, threads):
    return _call(x, dy, kernel_size, strides, pads, winograd, threads)


_filter_grad.def_partition(
    infer_sharding_from_operands=_filter_grad_infer, partition=_partition,
    sharding_rule="n h w c, n a b k -> p q c k", reduction_factors=("n", "h", "w", "a", "b"),
    need_replication_factors=("c", "k", "p", "q"))


def filter_grad(x: jax.Array, dy: jax.Array, kernel_size: tuple[int, int], strides: tuple[int, int],
                pads: tuple[tuple[int, int], tuple[int, int]], *, winograd: bool = False) -> jax.Array:
    """dW of a NHWC/HWIO convolution (see the module docstring), float32 [k_h, k_w, C, K].

    The caller checks :func:`supported` first, and :func:`winograd_supported` (on x's and dW's shapes) for
    ``winograd=True``: Winograd's F(2x2, 3x3) algorithm, 2.25x fewer multiplications than the direct sum.
    Only the low padding enters the formula: with the output size fixed by ``dy``, high padding only decides
    which zeros are read.

    Raises:
      RuntimeError: the kernel could not be built or is switched off (the message says why).
    """
    _require()
    return _filter_grad(x, dy, tuple(kernel_size), tuple(strides), tuple(tuple(p) for p in pads),
                        int(bool(winograd)), _threads())


# ---------------------------------------------------------------------------------------------------------
# The forward convolution (also the input gradient of a stride-1 convolution: see jaxsprint.train.cpu.conv).


def conv_supported(x_shape, w_shape, dtype) -> bool:
    """Whether :func:`conv` handles these operands (shapes and dtype only; does not build)."""
    return (len(x_shape) == 4 and len(w_shape) == 4 and x_shape[-1] == w_shape[2]
            and jnp.dtype(dtype) == jnp.dtype(jnp.float32) and w_shape[-1] % _LANES == 0)


def _conv_call(x, w, out_hw, strides, pads_lo, winograd, threads):
    shape = jax.ShapeDtypeStruct((x.shape[0], *out_hw, w.shape[-1]), jnp.float32)
    return jax.ffi.ffi_call(_CONV_TARGET, shape)(
        x, w, sh=np.int64(strides[0]), sw=np.int64(strides[1]), ph=np.int64(pads_lo[0]), pw=np.int64(pads_lo[1]),
        winograd=np.int64(winograd), threads=np.int64(threads))


def _conv_infer(out_hw, strides, pads_lo, winograd, threads, mesh, arg_shapes, result_shape):
    return NamedSharding(mesh, P(_batch_axes(arg_shapes[0].sharding)))


def _conv_partition(out_hw, strides, pads_lo, winograd, threads, mesh, arg_shapes, result_shape):
    batch = NamedSharding(mesh, P(_batch_axes(arg_shapes[0].sharding)))

    def lower(x, w):
        return _conv_call(x, w, out_hw, strides, pads_lo, winograd, threads)

    return mesh, lower, batch, (batch, NamedSharding(mesh, P()))


@functools.partial(custom_partitioning, static_argnums=(2, 3, 4, 5, 6))
def _conv(x, w, out_hw, strides, pads_lo, winograd, threads):
    return _conv_call(x, w, out_hw, strides, pads_lo, winograd, threads)


_conv.def_partition(
    infer_sharding_from_operands=_conv_infer, partition=_conv_partition,
    sharding_rule="n h w c, p q c k -> n a b k", need_replication_factors=("h", "w", "c", "p", "q", "k", "a", "b"))


def winograd_supported(x_shape, w_shape, dtype, strides) -> bool:
    """Whether :func:`conv` can run these operands with ``winograd=True`` (3x3, stride 1, C % 16 == 0)."""
    return (conv_supported(x_shape, w_shape, dtype) and tuple(w_shape[:2]) == (3, 3)
            and tuple(strides) == (1, 1) and x_shape[-1] % _LANES == 0)


def conv(x: jax.Array, w: jax.Array, out_hw: tuple[int, int], strides: tuple[int, int],
         pads_lo: tuple[int, int], *, winograd: bool = False) -> jax.Array:
    """y[n, ho, wo, k] = sum_{i, j, c} x[n, s_h ho + i - p_h, s_w wo + j - p_w, c] w[i, j, c, k], float32.

    NHWC ``x``, HWIO ``w``; ``out_hw`` is the output's (H, W) and ``pads_lo`` the low padding (x reads zero
    outside its bounds, so the high padding is implied by ``out_hw``). The caller checks :func:`conv_supported`
    first, and :func:`winograd_supported` for ``winograd=True``: Winograd's F(2x2, 3x3) algorithm, 2.25x fewer
    multiplications than the direct sum, with a different rounding (a few float32 ulps of the largest term).

    Raises:
      RuntimeError: the kernel could not be built or is switched off (the message says why).
    """
    _require()
    return _conv(x, w, tuple(out_hw), tuple(strides), tuple(pads_lo), int(bool(winograd)), _threads())


# ---------------------------------------------------------------------------------------------------------
# Per-channel statistics (BatchNorm's, and the sums of its gradient: see jaxsprint.train.models).


def channel_stats_supported(shape, dtype) -> bool:
    """Whether :func:`channel_moments` and :func:`channel_products` take an operand of this shape and dtype
    (float32, last axis a multiple of 16; does not build)."""
    return len(shape) >= 1 and jnp.dtype(dtype) == jnp.dtype(jnp.float32) and shape[-1] % _LANES == 0


def _stats_shape(a):
    return jax.ShapeDtypeStruct((2, a.shape[-1]), jnp.float32)


def _moments_call(a, threads):
    return jax.ffi.ffi_call(_MOMENTS_TARGET, _stats_shape(a))(a, threads=np.int64(threads))


def _products_call(a, b, threads):
    return jax.ffi.ffi_call(_PRODUCTS_TARGET, _stats_shape(a))(a, b, threads=np.int64(threads))


def _replicated_infer(threads, mesh, arg_shapes, result_shape):
    return NamedSharding(mesh, P())


def _moments_partition(threads, mesh, arg_shapes, result_shape):
    axes = _batch_axes(arg_shapes[0].sharding)

    def lower(a):
        out = _moments_call(a, threads)
        if not axes:
            return out
        # Every device gathers the shards' (sum, M2) (2 x C floats each: one collective, where a psum of the
        # sums and then of the corrected M2 would be two in a row) and merges them as Chan et al.:
        # M2 = sum_i (M2_i + n_i (mean_i - mean)^2), the shards being of equal size n_i.
        n_i = a.size // a.shape[-1]
        shards = lax.all_gather(out, axes)  # [shards, 2, C]
        total = jnp.sum(shards[:, 0], axis=0)
        mean = total / (n_i * shards.shape[0])
        m2 = jnp.sum(shards[:, 1] + n_i * jnp.square(shards[:, 0] / n_i - mean), axis=0)
        return jnp.stack([total, m2])

    return mesh, lower, NamedSharding(mesh, P()), (NamedSharding(mesh, P(axes)),)


def _products_partition(threads, mesh, arg_shapes, result_shape):
    axes = _batch_axes(arg_shapes[0].sharding)

    def lower(a, b):
        out = _products_call(a, b, threads)
        return lax.psum(out, axes) if axes else out

    sharding = NamedSharding(mesh, P(axes))
    return mesh, lower, NamedSharding(mesh, P()), (sharding, sharding)


@functools.lru_cache(maxsize=None)
def _stats_fn(kind: str, ndim: int):
    rows = " ".join(f"r{i}" for i in range(ndim - 1))
    if kind == "moments":
        @functools.partial(custom_partitioning, static_argnums=(1,))
        def fn(a, threads):
            return _moments_call(a, threads)

        rule, partition = f"{rows} c -> t c", _moments_partition
    else:
        @functools.partial(custom_partitioning, static_argnums=(2,))
        def fn(a, b, threads):
            return _products_call(a, b, threads)

        rule, partition = f"{rows} c, {rows} c -> t c", _products_partition
    fn.def_partition(infer_sharding_from_operands=_replicated_infer, partition=partition, sharding_rule=rule,
                     reduction_factors=tuple(f"r{i}" for i in range(ndim - 1)), need_replication_factors=("c", "t"))
    return fn


def channel_moments(a: jax.Array) -> jax.Array:
    """``(sum a, sum (a - mean)^2)`` over every axis of ``a`` but the last, float32 [2, C], in one pass.

    Matches a two-pass computation: each block of 64 rows is summed in float32 about its first row and the
    blocks are merged in float64 (Chan et al.). The shards of an ``a`` sharded over devices along its first
    axis under ``jit`` are merged the same way, in float32 (equal shards; each device gathers the shards'
    2 x C results, never their rows). The caller checks :func:`channel_stats_supported`.

    Raises:
      RuntimeError: the kernels could not be built or are switched off (the message says why).
    """
    _require()
    return _stats_fn("moments", a.ndim)(a, _threads())


def channel_products(a: jax.Array, b: jax.Array) -> jax.Array:
    """``(sum a, sum a * b)`` over every axis but the last, float32 [2, C], in one pass over ``a`` and ``b``.

    Blocks of 64 rows are summed in float32, the blocks in float64; shards are summed (a psum).

    Raises:
      ValueError: ``b``'s shape differs from ``a``'s.
      RuntimeError: the kernels could not be built or are switched off (the message says why).
    """
    if tuple(b.shape) != tuple(a.shape):
        raise ValueError(f"channel_products: b has shape {tuple(b.shape)}, expected a's {tuple(a.shape)}")
    _require()
    return _stats_fn("products", a.ndim)(a, b, _threads())


def _affine_call(x, a, b, r, relu, threads):
    out = jax.ShapeDtypeStruct(x.shape, jnp.float32)
    if r is None:
        return jax.ffi.ffi_call(_AFFINE_TARGET, out)(x, a, b, relu=np.int64(relu), threads=np.int64(threads))
    return jax.ffi.ffi_call(_AFFINE_ADD_TARGET, out)(x, a, b, r, relu=np.int64(relu), threads=np.int64(threads))


@functools.lru_cache(maxsize=None)
def _affine_fn(ndim: int, residual: bool):
    rows = " ".join(f"r{i}" for i in range(ndim - 1))

    def infer(relu, threads, mesh, arg_shapes, result_shape):
        return NamedSharding(mesh, P(_batch_axes(arg_shapes[0].sharding)))

    def partition(relu, threads, mesh, arg_shapes, result_shape):
        batch = NamedSharding(mesh, P(_batch_axes(arg_shapes[0].sharding)))
        channel = NamedSharding(mesh, P())

        def lower(x, a, b, *r):
            return _affine_call(x, a, b, r[0] if r else None, relu, threads)

        return mesh, lower, batch, (batch, channel, channel) + ((batch,) if residual else ())

    if residual:
        @functools.partial(custom_partitioning, static_argnums=(4, 5))
        def fn(x, a, b, r, relu, threads):
            return _affine_call(x, a, b, r, relu, threads)

        rule = f"{rows} c, c, c, {rows} c -> {rows} c"
    else:
        @functools.partial(custom_partitioning, static_argnums=(3, 4))
        def fn(x, a, b, relu, threads):
            return _affine_call(x, a, b, None, relu, threads)

        rule = f"{rows} c, c, c -> {rows} c"
    fn.def_partition(infer_sharding_from_operands=infer, partition=partition, sharding_rule=rule,
                     need_replication_factors=("c",))
    return fn


def affine_act(x: jax.Array, a: jax.Array, b: jax.Array, residual: jax.Array | None = None, *,
               relu: bool) -> jax.Array:
    """``x * a + b`` (per-channel ``a``, ``b`` of shape [C]), plus ``residual``, through ReLU if ``relu``; float32.

    BatchNorm's training output (jaxsprint.train.models). As a custom call its result is computed once: XLA would
    fuse the same loop, and also duplicate it into every consumer. The caller checks
    :func:`channel_stats_supported`. Under ``jit`` with ``x`` sharded along its first axis, each device
    computes its own rows.

    Raises:
      ValueError: mismatched shapes.
      RuntimeError: the kernels could not be built or are switched off (the message says why).
    """
    c = x.shape[-1]
    if tuple(a.shape) != (c,) or tuple(b.shape) != (c,):
        raise ValueError(f"affine_act: a and b must have shape ({c},), got {tuple(a.shape)} and {tuple(b.shape)}")
    if residual is not None and tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"affine_act: residual has shape {tuple(residual.shape)}, expected x's {tuple(x.shape)}")
    _require()
    if residual is None:
        return _affine_fn(x.ndim, False)(x, a, b, int(bool(relu)), _threads())
    return _affine_fn(x.ndim, True)(x, a, b, residual, int(bool(relu)), _threads())
