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

The blocks read as the papers write them, ``relu(bn(conv(x)) + shortcut)``, in plain JAX. On the CPU backend
:mod:`jaxsprint.train.cpu` may swap in its fused BatchNorm and blocks (same parameter names, same values up to float
rounding) through `create_model`'s ``norm_cls`` and ``block_overrides``; nothing here depends on it.

When the ``bn_moments`` collection is mutable, every BatchNorm sows the exact sufficient statistics of its
input over the (masked) batch -- ``(count, mean, M2)`` in float32 -- which `jaxsprint.train.polish` merges into
population statistics.

References:
  He et al., "Deep Residual Learning for Image Recognition", CVPR 2016.
  Goyal et al., "Accurate, Large Minibatch SGD", 2017 (zero-init of the last BN scale in each block).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

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


class BatchNorm(nn.Module):
    """BatchNorm over the global batch or over groups of `group_size` examples (see module docstring).

    Attributes:
      momentum: EMA decay of the running statistics (running = momentum * running + (1 - momentum) * batch).
      epsilon: added to the variance.
      dtype: output dtype; statistics are always computed in float32.
      group_size: None for global statistics, else the number of examples per normalisation group.
      scale_init: initialiser of the scale (zeros for the last BN of a residual block when asked).
    """

    momentum: float = 0.9
    epsilon: float = 1e-5
    dtype: Any = jnp.float32
    group_size: int | None = None
    scale_init: Callable = nn.initializers.ones

    @nn.compact
    def __call__(self, x: Array, *, use_running_average: bool, mask: Array | None = None) -> Array:
        """``(x - mean) / sqrt(var + epsilon) * scale + bias`` per channel, in `dtype`."""
        ra_mean, ra_var, scale, bias = self._variables(x, mask)
        if use_running_average:
            inv = scale * jax.lax.rsqrt(ra_var.value + self.epsilon)
            return (x.astype(jnp.float32) * inv + (bias - ra_mean.value * inv)).astype(self.dtype)
        xf = x.astype(jnp.float32)
        n = x.shape[0]
        if self.group_size is None or self.group_size >= n:
            if mask is None:
                mean, var = global_moments(xf)
            else:
                count, mean, m2 = _masked_moments(xf, tuple(range(x.ndim - 1)), mask)
                var = m2 / jnp.maximum(count, 1.0)
            inv = scale * jax.lax.rsqrt(var + self.epsilon)
            y = xf * inv + (bias - mean * inv)
        else:
            if mask is not None:
                raise ValueError("a mask is only supported with global BatchNorm statistics")
            g = self.group_size
            if n % g:
                raise ValueError(f"batch {n} is not a multiple of the BatchNorm group size {g}")
            xg = xf.reshape((n // g, g) + x.shape[1:])
            gaxes = tuple(range(1, xg.ndim - 1))
            gmean = jnp.mean(xg, axis=gaxes, keepdims=True)
            gvar = jnp.mean(jnp.square(xg - gmean), axis=gaxes, keepdims=True)
            inv = scale * jax.lax.rsqrt(gvar + self.epsilon)
            y = (xg * inv + (bias - gmean * inv)).reshape(x.shape)
            mean = jnp.mean(gmean.reshape(n // g, -1), axis=0)
            var = jnp.mean(gvar.reshape(n // g, -1), axis=0)
        self._update_running(ra_mean, ra_var, mean, var)
        return y.astype(self.dtype)

    def _variables(self, x: Array, mask: Array | None):
        """The running statistics, scale and bias of a ``[..., C]`` input; sows the input's exact moments when
        the ``bn_moments`` collection is mutable (Final Polishing). Called from ``__call__`` (and from the
        fused BatchNorm of :mod:`jaxsprint.train.cpu.fused`, which shares these variables and their names)."""
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
        return ra_mean, ra_var, scale, bias

    def _update_running(self, ra_mean, ra_var, batch_mean: Array, batch_var: Array) -> None:
        if not self.is_initializing():
            m = self.momentum
            ra_mean.value = m * ra_mean.value + (1.0 - m) * batch_mean
            ra_var.value = m * ra_var.value + (1.0 - m) * batch_var


def global_moments(xf: Array) -> tuple[Array, Array]:
    """(mean, biased variance) of float32 ``xf`` over every axis but the last: the exact two-pass formula."""
    axes = tuple(range(xf.ndim - 1))
    mean = jnp.mean(xf, axis=axes)
    return mean, jnp.mean(jnp.square(xf - mean), axis=axes)


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
        y = nn.relu(self.norm()(y, use_running_average=not train, mask=mask))
        y = self.conv(self.filters, (3, 3))(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), (self.strides, self.strides), name="proj_conv")(x)
            residual = self.norm(name="proj_bn")(residual, use_running_average=not train, mask=mask)
        last_init = nn.initializers.zeros if self.zero_init_last_bn else nn.initializers.ones
        return nn.relu(self.norm(scale_init=last_init)(y, use_running_average=not train, mask=mask) + residual)


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
        y = nn.relu(self.norm()(y, use_running_average=not train, mask=mask))
        y = self.conv(self.filters, (3, 3), (self.strides, self.strides))(y)
        y = nn.relu(self.norm()(y, use_running_average=not train, mask=mask))
        y = self.conv(self.filters * 4, (1, 1))(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters * 4, (1, 1), (self.strides, self.strides), name="proj_conv")(x)
            residual = self.norm(name="proj_bn")(residual, use_running_average=not train, mask=mask)
        last_init = nn.initializers.zeros if self.zero_init_last_bn else nn.initializers.ones
        return nn.relu(self.norm(scale_init=last_init)(y, use_running_average=not train, mask=mask) + residual)


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
      conv_general_dilated: the convolution primitive (None = lax.conv_general_dilated).
      norm_cls: the BatchNorm module (`BatchNorm`; the CPU seam passes its fused one).
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
    norm_cls: ModuleDef = BatchNorm

    @nn.compact
    def __call__(self, x, *, train: bool, mask=None):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype, padding="SAME",
                                 kernel_init=nn.initializers.variance_scaling(2.0, "fan_out", "normal"),
                                 conv_general_dilated=self.conv_general_dilated)
        norm = functools.partial(self.norm_cls, momentum=self.bn_momentum, epsilon=self.bn_epsilon,
                                 dtype=self.dtype, group_size=self.bn_group_size)
        x = x.astype(self.dtype)
        if self.stem == "imagenet":
            x = conv(self.widths[0], (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="stem_conv")(x)
            x = nn.relu(norm(name="stem_bn")(x, use_running_average=not train, mask=mask))
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        else:
            x = conv(self.widths[0], (3, 3), name="stem_conv")(x)
            x = nn.relu(norm(name="stem_bn")(x, use_running_average=not train, mask=mask))
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
    norm_cls: ModuleDef = BatchNorm

    @nn.compact
    def __call__(self, x, *, train: bool, mask=None):
        norm = functools.partial(self.norm_cls, momentum=self.bn_momentum, epsilon=self.bn_epsilon,
                                 dtype=self.dtype, group_size=self.bn_group_size)
        x = x.astype(self.dtype)
        for i in range(2):
            x = nn.Conv(self.width * (i + 1), (3, 3), strides=(i + 1, i + 1), use_bias=not self.use_bn,
                        dtype=self.dtype, conv_general_dilated=self.conv_general_dilated)(x)
            x = nn.relu(norm()(x, use_running_average=not train, mask=mask) if self.use_bn else x)
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
                 conv_general_dilated: Callable | None = None, norm_cls: ModuleDef | None = None,
                 block_overrides: Mapping[type, type] | None = None) -> nn.Module:
    """Builds a model of the zoo by name.

    Args:
      name: one of `MODELS`.
      num_classes: output logits.
      dtype: "float32" or "bfloat16" (compute dtype; parameters and BN statistics stay float32).
      bn_momentum, bn_epsilon: BatchNorm EMA decay and epsilon.
      bn_group_size: None (global statistics) or examples per BN group (see `BatchNorm`).
      zero_init_last_bn: zero-initialise the last BN scale of each residual block.
      conv_general_dilated: convolution primitive to use (None: XLA's).
      norm_cls: BatchNorm module to use (None: `BatchNorm`).
      block_overrides: replacement residual block classes (e.g. ``{BasicBlock: FusedBasicBlock}``).
      The last three come from the CPU seam: ``jaxsprint.train.cpu.acceleration(mode).model_kwargs()``; its blocks
      and BatchNorm keep the parameter names of the plain ones, so checkpoints are interchangeable.

    Raises:
      ConfigError: unknown name or dtype.
    """
    validate_config_fields(name, dtype)
    ctor, fixed = MODELS[name]
    fixed = dict(fixed)
    if block_overrides and "block_cls" in fixed:
        fixed["block_cls"] = block_overrides.get(fixed["block_cls"], fixed["block_cls"])
    return ctor(num_classes=num_classes, dtype=DTYPES[dtype], bn_momentum=bn_momentum, bn_epsilon=bn_epsilon,
                bn_group_size=bn_group_size, zero_init_last_bn=zero_init_last_bn,
                conv_general_dilated=conv_general_dilated, norm_cls=norm_cls or BatchNorm, **fixed)


def validate_config_fields(name: str, dtype: str) -> None:
    """Checks a model name and compute dtype (``config.model``, ``config.dtype``)."""
    if name not in MODELS:
        raise ConfigError("config.model", name, f"allowed: {', '.join(sorted(MODELS))}")
    if dtype not in DTYPES:
        raise ConfigError("config.dtype", dtype, f"allowed: {', '.join(DTYPES)}")


def has_batchnorm(name: str) -> bool:
    """Whether model `name` of `MODELS` has BatchNorm layers (and so statistics that polishing recomputes)."""
    validate_config_fields(name, "float32")
    return bool(MODELS[name][1].get("use_bn", True))


def validate_config(config) -> None:
    """Checks the model part of a training config: ``config.model``, ``config.dtype``, ``config.bn.momentum``
    and ``config.bn.epsilon`` (BatchNorm's reduction is checked by :mod:`jaxsprint.train.parallel`)."""
    validate_config_fields(config.model, config.dtype)
    m, eps = config.bn.momentum, config.bn.epsilon
    if not (isinstance(m, (int, float)) and 0.0 <= m < 1.0):
        raise ConfigError("config.bn.momentum", m, "allowed: a number with 0 <= momentum < 1")
    if not (isinstance(eps, (int, float)) and 0.0 < eps < float("inf")):
        raise ConfigError("config.bn.epsilon", eps, "allowed: a finite number > 0")
    if not isinstance(config.zero_init_last_bn, bool):
        raise ConfigError("config.zero_init_last_bn", config.zero_init_last_bn, "True or False")
