"""ResNet family (CIFAR-style and ImageNet-style) with a BatchNorm whose reduction is a choice.

BatchNorm reduction (`bn_group_size`):
  * ``None``: statistics over the whole (global) batch. Under ``jax.jit`` with a batch sharded along the
    ``data`` mesh axis, XLA all-reduces the sums, so this is synchronised BN over all devices.
  * ``n``: the batch is reshaped to ``[B / n, n, ...]`` and every group of ``n`` consecutive examples is
    normalised with its own statistics ("ghost" BN). With ``n`` = per-device batch this is exactly
    per-device BN as in the large-batch records, because a batch sharded along ``data`` gives each device a
    contiguous block of examples; the reshape keeps every group on one device, so no communication is added.
Running statistics are updated from the mean over groups of the group means and (biased) variances, so they
are one array, identical on every device.

With ``native_stats`` (the CPU fast path: ``jaxsprint.train.native_stats``), the global batch, no mask and
float32 with channels a multiple of 16 on the CPU backend, BatchNorm's training pass runs in
``jaxsprint.native``: the mean and second central moment in one pass over the input, the output
``relu(x * a + b + residual)`` in one pass (blocks hand BatchNorm their shortcut and ReLU), and in the backward
pass the two sums of the gradient (``sum g`` and ``sum g * x``) in one pass. XLA:CPU reads its operands once
per sum, materializes ``x - mean``, and re-fuses each block's output into every ReLU mask of the backward
pass, recomputing the residual stream from the stage's first convolution. The values are those of the
two-pass formula either way (up to float rounding).

When the ``bn_moments`` collection is mutable, every BatchNorm sows the exact sufficient statistics of its
input over the (masked) batch -- ``(count, mean, M2)`` in float32 -- which `jaxsprint.polish` merges into
population statistics.

References:
  He et al., "Deep Residual Learning for Image Recognition", CVPR 2016.
  Goyal et al., "Accurate, Large Minibatch SGD", 2017 (zero-init of the last BN scale in each block).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxsprint.errors import ConfigError

Array = jax.Array
ModuleDef = Any


def _masked_moments(x: Array, axes: tuple[int, ...], mask: Array | None) -> tuple[Array, Array, Array]:
    """Count, mean and M2 = sum (x - mean)^2 over `axes`, two-pass, float32; `mask` weights the batch axis."""
    x = x.astype(jnp.float32)
    per_example = 1
    for a in axes[1:]:
        per_example *= x.shape[a]
    if mask is None:
        count = jnp.asarray(x.shape[axes[0]] * per_example, jnp.float32)
        mean = jnp.mean(x, axis=axes)
        m2 = jnp.sum(jnp.square(x - mean), axis=axes)
        return count, mean, m2
    w = mask.astype(jnp.float32).reshape(mask.shape + (1,) * (x.ndim - 1))
    count = jnp.sum(mask.astype(jnp.float32)) * per_example
    safe = jnp.maximum(count, 1.0)
    mean = jnp.sum(x * w, axis=axes) / safe
    m2 = jnp.sum(jnp.square(x - mean) * w, axis=axes)
    return count, mean, m2


def _native_stats_ok(x: Array) -> bool:
    """Whether BatchNorm's sums over ``x`` can run in jaxsprint.native (CPU backend, float32, C % 16 == 0)."""
    from jaxsprint import native

    return (jax.default_backend() == "cpu" and native.channel_stats_supported(x.shape, x.dtype)
            and native.available())


@jax.custom_vjp
def _native_moments(x: Array) -> tuple[Array, Array]:
    """(mean, biased variance) of float32 ``x`` over every axis but the last, in one native pass."""
    from jaxsprint import native

    n = x.size // x.shape[-1]
    stats = native.channel_moments(x) / n
    return stats[0], stats[1]


def _native_moments_fwd(x):
    mean, var = _native_moments(x)
    return (mean, var), (x, mean)


def _native_moments_bwd(res, g):
    x, mean = res
    g_mean, g_var = g
    n = x.size // x.shape[-1]
    # d mean / dx = 1 / n, d var / dx = 2 (x - mean) / n: fused by XLA into the rest of x's gradient.
    return (g_mean / n + (2.0 / n) * g_var * (x - mean),)


_native_moments.defvjp(_native_moments_fwd, _native_moments_bwd)


def _native_bn_act_fwd(x, a, b, r, relu):
    from jaxsprint import native

    y = native.affine_act(x, a, b, r, relu=relu)
    return y, (x, a, y if relu else None)


def _native_bn_act_bwd(relu, res, g, with_residual):
    from jaxsprint import native

    x, a, y = res
    g = jnp.where(y > 0, g, 0.0) if relu else g  # the ReLU's mask, read from its stored output
    sums = native.channel_products(g, x)  # (sum g, sum g * x) in one pass
    grads = (g * a, sums[1], sums[0])
    return grads + (g,) if with_residual else grads


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _native_bn_act(x: Array, a: Array, b: Array, relu: bool) -> Array:
    """``x * a + b`` per channel, through ReLU if ``relu``: BatchNorm's training output, natively."""
    return _native_bn_act_fwd(x, a, b, None, relu)[0]


_native_bn_act.defvjp(lambda x, a, b, relu: _native_bn_act_fwd(x, a, b, None, relu),
                      lambda relu, res, g: _native_bn_act_bwd(relu, res, g, False))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _native_bn_add_act(x: Array, a: Array, b: Array, r: Array, relu: bool) -> Array:
    """``x * a + b + r``, through ReLU if ``relu`` (a residual block's output), natively."""
    return _native_bn_act_fwd(x, a, b, r, relu)[0]


_native_bn_add_act.defvjp(_native_bn_act_fwd, lambda relu, res, g: _native_bn_act_bwd(relu, res, g, True))


class BatchNorm(nn.Module):
    """BatchNorm over the global batch or over groups of `group_size` examples (see module docstring).

    Attributes:
      momentum: EMA decay of the running statistics (running = momentum * running + (1 - momentum) * batch).
      epsilon: added to the variance.
      dtype: output dtype; statistics are always computed in float32.
      group_size: None for global statistics, else the number of examples per normalisation group.
      scale_init: initialiser of the scale (zeros for the last BN of a residual block when asked).
      native_stats: run the sums of the global-batch statistics and of their gradient in jaxsprint.native
        where they can run (see the module docstring); the same values either way, up to float rounding.
    """

    momentum: float = 0.9
    epsilon: float = 1e-5
    dtype: Any = jnp.float32
    group_size: int | None = None
    scale_init: Callable = nn.initializers.ones
    native_stats: bool = False

    @nn.compact
    def __call__(self, x: Array, *, use_running_average: bool, mask: Array | None = None,
                 residual: Array | None = None, relu: bool = False) -> Array:
        """The normalised ``x``, plus ``residual`` if given, through ReLU if ``relu`` (a residual block's
        ``relu(bn(y) + shortcut)`` in one call, so that the native path can compute it in one pass)."""
        c = x.shape[-1]
        ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((c,), jnp.float32))
        ra_var = self.variable("batch_stats", "var", lambda: jnp.ones((c,), jnp.float32))
        scale = self.param("scale", self.scale_init, (c,), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (c,), jnp.float32)

        # Exact moments of this layer's input over the whole (masked) batch, for Final Polishing. Under jit
        # with a sharded batch these are global sums, so the split over devices does not change them.
        if self.is_mutable_collection("bn_moments"):
            self.sow("bn_moments", "moments", _masked_moments(x, tuple(range(x.ndim - 1)), mask),
                     reduce_fn=lambda prev, new: new, init_fn=lambda: ())

        def finish(y: Array) -> Array:
            y = y.astype(self.dtype)
            if residual is not None:
                y = residual + y
            return nn.relu(y) if relu else y

        if use_running_average:
            mean, var = ra_mean.value, ra_var.value
            inv = scale * jax.lax.rsqrt(var + self.epsilon)
            return finish(x.astype(jnp.float32) * inv + (bias - mean * inv))

        reduce_axes = tuple(range(x.ndim - 1))
        xf = x.astype(jnp.float32)
        n = x.shape[0]
        native = False
        if self.group_size is None or self.group_size >= n:
            native = (mask is None and self.native_stats and _native_stats_ok(x)
                      and jnp.dtype(self.dtype) == jnp.float32
                      and (residual is None or residual.dtype == jnp.float32))
            if native:
                mean, var = _native_moments(xf)
            elif mask is None:
                mean = jnp.mean(xf, axis=reduce_axes)
                var = jnp.mean(jnp.square(xf - mean), axis=reduce_axes)
            else:
                count, mean, m2 = _masked_moments(xf, reduce_axes, mask)
                var = m2 / jnp.maximum(count, 1.0)
            inv = scale * jax.lax.rsqrt(var + self.epsilon)
            shift = bias - mean * inv
            if not native:
                y = xf * inv + shift
            elif residual is None:
                y = _native_bn_act(xf, inv, shift, relu)
            else:
                y = _native_bn_add_act(xf, inv, shift, residual, relu)
            batch_mean, batch_var = mean, var
        else:
            if mask is not None:
                raise ValueError("a mask is only supported with global BatchNorm statistics")
            g = self.group_size
            if n % g:
                raise ValueError(f"batch {n} is not a multiple of the BatchNorm group size {g}")
            xg = xf.reshape((n // g, g) + x.shape[1:])
            gaxes = tuple(range(1, xg.ndim - 1))
            mean = jnp.mean(xg, axis=gaxes, keepdims=True)
            var = jnp.mean(jnp.square(xg - mean), axis=gaxes, keepdims=True)
            inv = scale * jax.lax.rsqrt(var + self.epsilon)
            y = (xg * inv + (bias - mean * inv)).reshape(x.shape)
            batch_mean = jnp.mean(mean.reshape(n // g, c), axis=0)
            batch_var = jnp.mean(var.reshape(n // g, c), axis=0)

        if not self.is_initializing():
            m = self.momentum
            ra_mean.value = m * ra_mean.value + (1.0 - m) * batch_mean
            ra_var.value = m * ra_var.value + (1.0 - m) * batch_var
        return y if native else finish(y)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34 and the CIFAR ResNets)."""

    filters: int
    strides: int
    conv: ModuleDef
    norm: ModuleDef
    zero_init_last_bn: bool = False

    @nn.compact
    def __call__(self, x, *, train: bool, mask=None):
        residual = x
        y = self.conv(self.filters, (3, 3), (self.strides, self.strides))(x)
        y = self.norm()(y, use_running_average=not train, mask=mask, relu=True)
        y = self.conv(self.filters, (3, 3))(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), (self.strides, self.strides), name="proj_conv")(x)
            residual = self.norm(name="proj_bn")(residual, use_running_average=not train, mask=mask)
        last_init = nn.initializers.zeros if self.zero_init_last_bn else nn.initializers.ones
        return self.norm(scale_init=last_init)(y, use_running_average=not train, mask=mask, residual=residual,
                                               relu=True)


class BottleneckBlock(nn.Module):
    """1x1 -> 3x3 (stride here, as in torchvision's v1.5) -> 1x1 x4, with a residual connection."""

    filters: int
    strides: int
    conv: ModuleDef
    norm: ModuleDef
    zero_init_last_bn: bool = False

    @nn.compact
    def __call__(self, x, *, train: bool, mask=None):
        residual = x
        y = self.conv(self.filters, (1, 1))(x)
        y = self.norm()(y, use_running_average=not train, mask=mask, relu=True)
        y = self.conv(self.filters, (3, 3), (self.strides, self.strides))(y)
        y = self.norm()(y, use_running_average=not train, mask=mask, relu=True)
        y = self.conv(self.filters * 4, (1, 1))(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters * 4, (1, 1), (self.strides, self.strides), name="proj_conv")(x)
            residual = self.norm(name="proj_bn")(residual, use_running_average=not train, mask=mask)
        last_init = nn.initializers.zeros if self.zero_init_last_bn else nn.initializers.ones
        return self.norm(scale_init=last_init)(y, use_running_average=not train, mask=mask, residual=residual,
                                               relu=True)


class ResNet(nn.Module):
    """ResNet for CIFAR-size inputs (`stem="cifar"`: 3x3 stem, no pooling) or ImageNet (`stem="imagenet"`).

    Attributes:
      stage_sizes: blocks per stage.
      block_cls: BasicBlock or BottleneckBlock.
      widths: filters of each stage.
      num_classes: logits.
      stem: "cifar" (3x3 conv, stride 1) or "imagenet" (7x7 conv stride 2, 3x3 max-pool stride 2).
      dtype: compute dtype of convolutions and activations (parameters stay float32).
      bn_momentum, bn_epsilon, bn_group_size: see `BatchNorm`.
      zero_init_last_bn: start every residual branch at zero (Goyal et al. 2017).
      conv_general_dilated: the convolution primitive (None = lax.conv_general_dilated); see jaxsprint.conv.
      native_stats: BatchNorm sums in jaxsprint.native where they can run (see `BatchNorm`).
    """

    stage_sizes: Sequence[int]
    block_cls: ModuleDef
    widths: Sequence[int]
    num_classes: int
    stem: str = "cifar"
    dtype: Any = jnp.float32
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    bn_group_size: int | None = None
    zero_init_last_bn: bool = False
    conv_general_dilated: Callable | None = None
    native_stats: bool = False

    @nn.compact
    def __call__(self, x, *, train: bool, mask=None):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype, padding="SAME",
                                 kernel_init=nn.initializers.variance_scaling(2.0, "fan_out", "normal"),
                                 conv_general_dilated=self.conv_general_dilated)
        norm = functools.partial(BatchNorm, momentum=self.bn_momentum, epsilon=self.bn_epsilon,
                                 dtype=self.dtype, group_size=self.bn_group_size, native_stats=self.native_stats)
        x = x.astype(self.dtype)
        if self.stem == "imagenet":
            x = conv(self.widths[0], (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="stem_conv")(x)
            x = norm(name="stem_bn")(x, use_running_average=not train, mask=mask, relu=True)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        else:
            x = conv(self.widths[0], (3, 3), name="stem_conv")(x)
            x = norm(name="stem_bn")(x, use_running_average=not train, mask=mask, relu=True)
        for i, (blocks, width) in enumerate(zip(self.stage_sizes, self.widths)):
            for j in range(blocks):
                strides = 2 if i > 0 and j == 0 else 1
                x = self.block_cls(width, strides, conv=conv, norm=norm,
                                   zero_init_last_bn=self.zero_init_last_bn)(x, train=train, mask=mask)
        x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=jnp.float32, name="head")(x)


class TinyNet(nn.Module):
    """A test model: conv -> BN -> relu -> conv -> BN -> relu -> pool -> dense (or no BN with `use_bn=False`)."""

    num_classes: int
    width: int = 8
    use_bn: bool = True
    dtype: Any = jnp.float32
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    bn_group_size: int | None = None
    zero_init_last_bn: bool = False
    conv_general_dilated: Callable | None = None
    native_stats: bool = False

    @nn.compact
    def __call__(self, x, *, train: bool, mask=None):
        norm = functools.partial(BatchNorm, momentum=self.bn_momentum, epsilon=self.bn_epsilon,
                                 dtype=self.dtype, group_size=self.bn_group_size, native_stats=self.native_stats)
        x = x.astype(self.dtype)
        for i in range(2):
            x = nn.Conv(self.width * (i + 1), (3, 3), strides=(i + 1, i + 1), use_bias=not self.use_bn,
                        dtype=self.dtype, conv_general_dilated=self.conv_general_dilated)(x)
            x = norm()(x, use_running_average=not train, mask=mask, relu=True) if self.use_bn else nn.relu(x)
        x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=jnp.float32)(x)


_CIFAR_WIDTHS = (16, 32, 64)
_IMAGENET_WIDTHS = (64, 128, 256, 512)

# name -> (constructor, fixed keyword arguments)
MODELS: dict[str, tuple[Callable[..., nn.Module], dict[str, Any]]] = {
    "tiny": (TinyNet, {}),
    "tiny_nobn": (TinyNet, {"use_bn": False}),
    "resnet8": (ResNet, dict(stage_sizes=(1, 1, 1), block_cls=BasicBlock, widths=_CIFAR_WIDTHS, stem="cifar")),
    "resnet20": (ResNet, dict(stage_sizes=(3, 3, 3), block_cls=BasicBlock, widths=_CIFAR_WIDTHS, stem="cifar")),
    "resnet32": (ResNet, dict(stage_sizes=(5, 5, 5), block_cls=BasicBlock, widths=_CIFAR_WIDTHS, stem="cifar")),
    "resnet56": (ResNet, dict(stage_sizes=(9, 9, 9), block_cls=BasicBlock, widths=_CIFAR_WIDTHS, stem="cifar")),
    "resnet18": (ResNet, dict(stage_sizes=(2, 2, 2, 2), block_cls=BasicBlock, widths=_IMAGENET_WIDTHS,
                              stem="imagenet")),
    "resnet34": (ResNet, dict(stage_sizes=(3, 4, 6, 3), block_cls=BasicBlock, widths=_IMAGENET_WIDTHS,
                              stem="imagenet")),
    "resnet50": (ResNet, dict(stage_sizes=(3, 4, 6, 3), block_cls=BottleneckBlock, widths=_IMAGENET_WIDTHS,
                              stem="imagenet")),
}

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def create_model(name: str, *, num_classes: int, dtype: str = "float32", bn_momentum: float = 0.9,
                 bn_epsilon: float = 1e-5, bn_group_size: int | None = None, zero_init_last_bn: bool = False,
                 conv_general_dilated: Callable | None = None, native_stats: bool = False) -> nn.Module:
    """Builds a model of the zoo by name.

    Args:
      name: one of `MODELS`.
      num_classes: output logits.
      dtype: "float32" or "bfloat16" (compute dtype; parameters and BN statistics stay float32).
      bn_momentum, bn_epsilon: BatchNorm EMA decay and epsilon.
      bn_group_size: None (global statistics) or examples per BN group (see `BatchNorm`).
      zero_init_last_bn: zero-initialise the last BN scale of each residual block.
      conv_general_dilated: convolution primitive to use (None: XLA's).
      native_stats: BatchNorm's sums in jaxsprint.native on the CPU backend where they can run (see
        `BatchNorm`); ``jaxsprint.train.native_stats(impl)`` says when a conv kind wants them.

    Raises:
      ConfigError: unknown name or dtype.
    """
    if name not in MODELS:
        raise ConfigError("config.model", name, f"allowed: {', '.join(sorted(MODELS))}")
    if dtype not in DTYPES:
        raise ConfigError("config.dtype", dtype, f"allowed: {', '.join(DTYPES)}")
    ctor, fixed = MODELS[name]
    return ctor(num_classes=num_classes, dtype=DTYPES[dtype], bn_momentum=bn_momentum, bn_epsilon=bn_epsilon,
                bn_group_size=bn_group_size, zero_init_last_bn=zero_init_last_bn,
                conv_general_dilated=conv_general_dilated, native_stats=native_stats, **fixed)
