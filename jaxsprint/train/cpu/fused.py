"""The fused BatchNorm of the CPU seam: BatchNorm's training pass and a residual block's output in native kernels.

On XLA:CPU, a ResNet's BatchNorm is slow in two ways: XLA reads its operand once per sum and materializes
``x - mean``, and it re-fuses each residual block's output ``relu(bn(y) + shortcut)`` into every ReLU mask of the
backward pass, recomputing the stage's residual stream from its first convolution. Here, for the global batch,
no mask and float32 with channels a multiple of 16 (:mod:`.kernels`):

  * the mean and second central moment come from one native pass over the input (block sums merged with
    Chan et al.'s update in float64, so they match the two-pass formula);
  * the output ``relu(x * a + b [+ residual])`` is one native pass, and the backward pass reads the ReLU's
    mask from that stored output;
  * the backward pass's two sums, ``sum g`` and ``sum g * x``, are one native pass.

`BatchNorm` subclasses :class:`jaxsprint.train.models.BatchNorm` and keeps its class name and variables, and
`BasicBlock` / `BottleneckBlock` subclass the plain blocks (same names, same submodule order), so parameter
trees and checkpoints are the same with and without the seam. Everything that does not qualify (masked or
grouped statistics, evaluation, bfloat16, a non-CPU backend) runs the plain BatchNorm's code.

Only :func:`jaxsprint.train.cpu.acceleration` hands these classes to a model (``model_kwargs()``).
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxsprint.train import models
from jaxsprint.train.cpu import kernels as native

__all__ = ["BLOCKS", "BasicBlock", "BatchNorm", "BottleneckBlock"]

Array = jax.Array


def _native_stats_ok(x: Array) -> bool:
    """Whether BatchNorm's sums over ``x`` can run in the native kernels (CPU backend, float32, C % 16 == 0)."""
    return (jax.default_backend() == "cpu" and native.channel_stats_supported(x.shape, x.dtype)
            and native.available())


@jax.custom_vjp
def _native_moments(x: Array) -> tuple[Array, Array]:
    """(mean, biased variance) of float32 ``x`` over every axis but the last, in one native pass."""
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
    y = native.affine_act(x, a, b, r, relu=relu)
    return y, (x, a, y if relu else None)


def _native_bn_act_bwd(relu, res, g, with_residual):
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


class BatchNorm(models.BatchNorm):
    """:class:`jaxsprint.train.models.BatchNorm` that can also add a residual and apply the ReLU, in one native pass
    where the kernels apply (see the module docstring); the same values as ``relu(bn(x) + residual)``."""

    @nn.compact
    def __call__(self, x: Array, residual: Array | None = None, *, use_running_average: bool,
                 mask: Array | None = None, relu: bool = False) -> Array:
        fused = (not use_running_average and mask is None
                 and (self.group_size is None or self.group_size >= x.shape[0])
                 and jnp.dtype(self.dtype) == jnp.float32 and _native_stats_ok(x)
                 and (residual is None or residual.dtype == jnp.float32))
        if not fused:
            y = models.BatchNorm.__call__(self, x, use_running_average=use_running_average, mask=mask)
            if residual is not None:
                y = residual + y
            return nn.relu(y) if relu else y
        ra_mean, ra_var, scale, bias = self._variables(x, mask)
        xf = x.astype(jnp.float32)
        mean, var = _native_moments(xf)
        inv = scale * jax.lax.rsqrt(var + self.epsilon)
        shift = bias - mean * inv
        if residual is None:
            y = _native_bn_act(xf, inv, shift, relu)
        else:
            y = _native_bn_add_act(xf, inv, shift, residual, relu)
        self._update_running(ra_mean, ra_var, mean, var)
        return y


class BasicBlock(models.BasicBlock):
    """:class:`jaxsprint.train.models.BasicBlock` with its BatchNorm-ReLU and BatchNorm-add-ReLU fused."""

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
        return self.norm(scale_init=last_init)(y, residual, use_running_average=not train, mask=mask, relu=True)


class BottleneckBlock(models.BottleneckBlock):
    """:class:`jaxsprint.train.models.BottleneckBlock` with its BatchNorm-ReLU and BatchNorm-add-ReLU fused."""

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
        return self.norm(scale_init=last_init)(y, residual, use_running_average=not train, mask=mask, relu=True)


# Plain block -> fused block, for models.create_model(block_overrides=...).
BLOCKS = {models.BasicBlock: BasicBlock, models.BottleneckBlock: BottleneckBlock}
