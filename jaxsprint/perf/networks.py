"""Per-layer costs of a CNN: FLOPs, bytes moved and parameters, forward and backward.

A network is reduced to a table with one row per distinct layer (identical layers are merged and counted with
a multiplicity). Every per-sample quantity is multiplied by the sub-batch size in :mod:`jaxsprint.perf.times`,
so the table itself does not depend on the batch.

Conventions (used everywhere in :mod:`jaxsprint.perf`):

* A multiply-accumulate (MAC) is **2 FLOPs**. Published "FLOPs" of CNNs are often MACs (ResNet-50's
  "4.1 GFLOPs" is 4.1 G MACs = 8.2 GFLOP). ``fwd_macs`` counts MACs of convolutions and dense layers only;
  every ``*_flops`` field counts floating-point operations.
* Convolution forward: ``MACs = k_h * k_w * (C_in / groups) * C_out * H_out * W_out`` per sample. The input
  and the weight gradient each cost the forward MACs again (forward + backward about 3x the forward); the
  first layer needs no input gradient, so its ``bwd_data_flops`` is 0.
* Element-wise layers (batch norm, ReLU, pooling, residual add) are memory bound: their bytes matter.
* Bytes are fp32: forward reads the input and writes the output (batch norm reads its input twice), backward
  reads the output gradient and the saved input and writes the input gradient. Weight traffic is per step,
  not per sample, and is added in :mod:`jaxsprint.perf.times`.

Three sources of a table: :func:`from_spec` (a sequential layer spec such as ``[("conv", 64, 3), ("relu",),
("maxpool", 2), ("gap",), ("dense", 10)]``) or :class:`Builder` for branching networks; the zoo
(:mod:`jaxsprint.perf.zoo`, ``zoo.get`` by name); :func:`from_flax`, any flax model from XLA's cost analysis
of its jitted forward and forward+backward (totals only, one "forward" and one "backward" row).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsprint.errors import ConfigError

BYTES_PER_VALUE = 4  # fp32 activations, weights and gradients

# Layer kinds. Matmul-like kinds run at a compute efficiency; the others are memory bound.
# "maxpool" is separate from "pool" (average / global pooling) because its backward pass is a
# select-and-scatter, much slower than a broadcast on some back ends (XLA:CPU).
KINDS = ("conv", "dense", "norm", "act", "pool", "maxpool", "add", "xla")
KIND_CONV, KIND_DENSE, KIND_NORM, KIND_ACT, KIND_POOL, KIND_MAXPOOL, KIND_ADD, KIND_XLA = range(len(KINDS))


class LayerCost(NamedTuple):
    """Costs of one layer, per sample unless stated. See the module docstring for conventions.

    Attributes:
      name: Layer name, for tables.
      kind: One of :data:`KINDS`.
      fwd_macs: Forward multiply-accumulates per sample (conv / dense only).
      fwd_flops: Forward FLOPs per sample.
      bwd_data_flops: FLOPs per sample of the gradient w.r.t. the layer input.
      bwd_weight_flops: FLOPs per sample of the gradient w.r.t. the weights.
      fwd_bytes: Activation bytes per sample read and written by the forward pass.
      bwd_bytes: Activation bytes per sample read and written by the backward pass.
      params: Trainable parameters (per network, not per sample).
      out_elems: Output elements per sample (kept for the backward pass: memory).
      rows: GEMM rows per sample of the forward pass (``H_out W_out``; 1 for dense; 0 = unknown).
      cols: GEMM columns of the forward pass (``C_out / groups``).
      depth: GEMM reduction depth of the forward pass (``k^2 C_in / groups``).
      in_rows, in_cols, in_depth: The same for the input-gradient pass (``H_in W_in``,
        ``C_in / groups``, ``k^2 C_out / groups``). The weight-gradient pass is the GEMM
        ``[depth x (b rows)] x [(b rows) x cols]``.
      count: How many identical copies of this layer the network has.
    """

    name: str
    kind: str
    fwd_macs: float
    fwd_flops: float
    bwd_data_flops: float
    bwd_weight_flops: float
    fwd_bytes: float
    bwd_bytes: float
    params: float
    out_elems: float
    rows: float = 0.0
    cols: float = 0.0
    depth: float = 0.0
    in_rows: float = 0.0
    in_cols: float = 0.0
    in_depth: float = 0.0
    count: int = 1


@struct.dataclass
class NetworkCost:
    """A network's cost table as jnp arrays (a pytree, so it can be vmapped over or traced).

    All array fields have shape ``[num_rows]``; ``count`` is the multiplicity of each row.
    Per-sample fields are multiplied by the sub-batch size by the time model.

    Attributes:
      name: Network name (static).
      layer_names: Row names (static).
      kind: int32 kind id per row (index into :data:`KINDS`).
      count: float32 multiplicity per row.
      fwd_macs, fwd_flops, bwd_data_flops, bwd_weight_flops, fwd_bytes, bwd_bytes: per sample.
      params: parameters per row (per copy).
      out_elems: output elements per sample per row (per copy).
      rows, cols, depth, in_rows, in_cols, in_depth: GEMM shapes (see :class:`LayerCost`).
      input_elems: input elements per sample (e.g. 224*224*3).
      input_bytes_per_sample: bytes read from storage per sample (uint8 image: H*W*C).
    """

    kind: jax.Array
    count: jax.Array
    fwd_macs: jax.Array
    fwd_flops: jax.Array
    bwd_data_flops: jax.Array
    bwd_weight_flops: jax.Array
    fwd_bytes: jax.Array
    bwd_bytes: jax.Array
    params: jax.Array
    out_elems: jax.Array
    rows: jax.Array
    cols: jax.Array
    depth: jax.Array
    in_rows: jax.Array
    in_cols: jax.Array
    in_depth: jax.Array
    input_elems: jax.Array
    input_bytes_per_sample: jax.Array
    name: str = struct.field(pytree_node=False, default="network")
    layer_names: tuple[str, ...] = struct.field(pytree_node=False, default=())

    # Totals (per sample where it applies); cheap jnp reductions.
    @property
    def total_params(self) -> jax.Array:
        """Trainable parameter count."""
        return jnp.sum(self.count * self.params)

    @property
    def total_fwd_macs(self) -> jax.Array:
        """Forward multiply-accumulates per sample."""
        return jnp.sum(self.count * self.fwd_macs)

    @property
    def total_fwd_flops(self) -> jax.Array:
        """Forward FLOPs per sample (2 per MAC plus element-wise work)."""
        return jnp.sum(self.count * self.fwd_flops)

    @property
    def total_bwd_flops(self) -> jax.Array:
        """Backward FLOPs per sample (input and weight gradients)."""
        return jnp.sum(self.count * (self.bwd_data_flops + self.bwd_weight_flops))

    @property
    def total_train_flops(self) -> jax.Array:
        """Forward + backward FLOPs per sample (about 3x the forward)."""
        return self.total_fwd_flops + self.total_bwd_flops

    @property
    def activation_elems(self) -> jax.Array:
        """Activation elements per sample kept for the backward pass (input included)."""
        return jnp.sum(self.count * self.out_elems) + self.input_elems

    @property
    def num_layers(self) -> int:
        """Number of layers, counting repeats (static)."""
        return int(np.sum(np.asarray(self.count)))

    def summary(self) -> dict[str, float]:
        """Totals as Python floats: params, MACs and FLOPs per sample."""
        return {
            "params": float(self.total_params),
            "fwd_macs": float(self.total_fwd_macs),
            "fwd_flops": float(self.total_fwd_flops),
            "train_flops": float(self.total_train_flops),
            "activation_elems": float(self.activation_elems),
        }


def network_from_layers(
    layers: Sequence[LayerCost],
    input_shape: Sequence[int],
    *,
    name: str = "network",
    input_bytes_per_sample: float | None = None,
    merge: bool = True,
) -> NetworkCost:
    """Builds a :class:`NetworkCost` from layer rows, merging identical rows.

    Args:
      layers: Layer costs.
      input_shape: Per-sample input shape, e.g. ``(224, 224, 3)``.
      name: Network name.
      input_bytes_per_sample: Bytes read from storage per sample; default one byte per input
        element (a decoded uint8 image).
      merge: Merge rows that are identical except for their name (exact; fewer rows to evaluate).

    Returns:
      The cost table.
    """
    rows: dict[tuple, list] = {}
    order: list[tuple] = []
    for i, layer in enumerate(layers):
        if layer.kind not in KINDS:
            raise ConfigError(f"layers[{i}].kind", layer.kind, f"one of {', '.join(KINDS)}")
        key = tuple(layer[1:-1]) if merge else (i,) + tuple(layer[1:-1])
        if key in rows:
            rows[key][1] += layer.count
        else:
            rows[key] = [layer, layer.count]
            order.append(key)
    table = [rows[k][0]._replace(count=rows[k][1]) for k in order]
    input_elems = float(np.prod(input_shape))
    col = lambda f: jnp.asarray([float(getattr(r, f)) for r in table], jnp.float32)  # noqa: E731
    return NetworkCost(
        kind=jnp.asarray([KINDS.index(r.kind) for r in table], jnp.int32),
        count=col("count"),
        fwd_macs=col("fwd_macs"),
        fwd_flops=col("fwd_flops"),
        bwd_data_flops=col("bwd_data_flops"),
        bwd_weight_flops=col("bwd_weight_flops"),
        fwd_bytes=col("fwd_bytes"),
        bwd_bytes=col("bwd_bytes"),
        params=col("params"),
        out_elems=col("out_elems"),
        rows=col("rows"),
        cols=col("cols"),
        depth=col("depth"),
        in_rows=col("in_rows"),
        in_cols=col("in_cols"),
        in_depth=col("in_depth"),
        input_elems=jnp.float32(input_elems),
        input_bytes_per_sample=jnp.float32(
            input_elems if input_bytes_per_sample is None else input_bytes_per_sample),
        name=name,
        layer_names=tuple(r.name for r in table),
    )


# ----------------------------------------------------------------------------------------------
# Layer spec builder (shape inference)
# ----------------------------------------------------------------------------------------------


def _out_size(size: int, kernel: int, stride: int, padding: str | int) -> int:
    if padding == "same":
        return -(-size // stride)
    if padding == "valid":
        pad = 0
    elif isinstance(padding, int) and padding >= 0:
        pad = padding
    else:
        raise ConfigError("padding", padding, "'same', 'valid' or an int >= 0")
    out = (size + 2 * pad - kernel) // stride + 1
    if out < 1:
        raise ConfigError("kernel", kernel, f"at most the padded input size {size + 2 * pad} (stride {stride})")
    return out


@dataclasses.dataclass
class Builder:
    """Builds a layer list while tracking the activation shape ``(H, W, C)`` (or ``(C,)``).

    Branching networks fork the builder (:meth:`fork`), build each branch, and merge them with
    :meth:`add` (residual sum) or :meth:`concat` (Inception). Example::

        b = Builder((32, 32, 3))
        b.conv(16, 3).bn().relu()
        short = b.fork()
        b.conv(16, 3).bn().relu().conv(16, 3).bn()
        b.add(short).relu()
    """

    shape: tuple[int, ...]
    layers: list[LayerCost] = dataclasses.field(default_factory=list)
    first_conv_done: bool = False
    prefix: str = ""

    def _name(self, kind: str, name: str | None) -> str:
        return name or f"{self.prefix}{kind}{len(self.layers)}"

    def _elems(self) -> int:
        return int(np.prod(self.shape))

    def fork(self, prefix: str = "") -> "Builder":
        """A new builder starting from the current shape; its layers are merged back later."""
        return Builder(self.shape, [], True, prefix or self.prefix)

    def conv(self, out_channels: int, kernel: int, stride: int = 1, padding: str | int = "same",
             groups: int = 1, bias: bool = False, name: str | None = None) -> "Builder":
        """2-D convolution, ``kernel x kernel``, NHWC."""
        if len(self.shape) != 3:
            raise ConfigError("conv input shape", self.shape, "(H, W, C)")
        h, w, c_in = self.shape
        if c_in % groups or out_channels % groups:
            raise ConfigError("groups", groups, f"a divisor of both channel counts {c_in} and {out_channels}")
        h_out, w_out = _out_size(h, kernel, stride, padding), _out_size(w, kernel, stride, padding)
        macs = kernel * kernel * (c_in // groups) * out_channels * h_out * w_out
        in_elems, out_elems = h * w * c_in, h_out * w_out * out_channels
        params = kernel * kernel * (c_in // groups) * out_channels + (out_channels if bias else 0)
        bias_flops = out_elems if bias else 0
        self.layers.append(LayerCost(
            self._name("conv", name), "conv", macs, 2 * macs + bias_flops,
            0.0 if not self.first_conv_done else 2 * macs, 2 * macs + bias_flops,
            BYTES_PER_VALUE * (in_elems + out_elems),
            BYTES_PER_VALUE * (out_elems + 2 * in_elems),
            params, out_elems, h_out * w_out, out_channels // groups,
            kernel * kernel * c_in // groups, h * w, c_in // groups,
            kernel * kernel * out_channels // groups))
        self.first_conv_done = True
        self.shape = (h_out, w_out, out_channels)
        return self

    def dense(self, out_features: int, bias: bool = True, name: str | None = None) -> "Builder":
        """Fully connected layer; flattens its input."""
        n_in = self._elems()
        macs = n_in * out_features
        params = macs + (out_features if bias else 0)
        self.layers.append(LayerCost(
            self._name("dense", name), "dense", macs, 2 * macs + (out_features if bias else 0),
            0.0 if not self.first_conv_done else 2 * macs, 2 * macs + (out_features if bias else 0),
            BYTES_PER_VALUE * (n_in + out_features),
            BYTES_PER_VALUE * (out_features + 2 * n_in),
            params, out_features, 1, out_features, n_in, 1, n_in, out_features))
        self.first_conv_done = True
        self.shape = (out_features,)
        return self

    def bn(self, name: str | None = None) -> "Builder":
        """Batch norm (training mode): about 8 FLOPs per element forward, 12 backward."""
        n, c = self._elems(), self.shape[-1]
        self.layers.append(LayerCost(
            self._name("bn", name), "norm", 0.0, 8.0 * n, 12.0 * n, 2.0 * n,
            BYTES_PER_VALUE * 3 * n, BYTES_PER_VALUE * 4 * n, 2 * c, n))
        return self

    def relu(self, name: str | None = None) -> "Builder":
        """ReLU (or any element-wise activation): 1 FLOP per element each way."""
        n = self._elems()
        self.layers.append(LayerCost(
            self._name("relu", name), "act", 0.0, float(n), float(n), 0.0,
            BYTES_PER_VALUE * 2 * n, BYTES_PER_VALUE * 3 * n, 0, n))
        return self

    def lrn(self, size: int = 5, name: str | None = None) -> "Builder":
        """Local response normalisation across ``size`` channels (AlexNet, GoogLeNet)."""
        n = self._elems()
        self.layers.append(LayerCost(
            self._name("lrn", name), "norm", 0.0, float((2 * size + 4) * n),
            float((3 * size + 6) * n), 0.0,
            BYTES_PER_VALUE * 2 * n, BYTES_PER_VALUE * 4 * n, 0, n))
        return self

    def pool(self, window: int, stride: int | None = None, padding: str | int = "valid",
             kind: str = "max", name: str | None = None) -> "Builder":
        """Max or average pooling."""
        if kind not in ("max", "avg"):
            raise ConfigError("pool kind", kind, "one of max, avg")
        stride = stride or window
        h, w, c = self.shape
        h_out, w_out = _out_size(h, window, stride, padding), _out_size(w, window, stride, padding)
        out = h_out * w_out * c
        self.layers.append(LayerCost(
            self._name(f"{kind}pool", name), "maxpool" if kind == "max" else "pool", 0.0,
            float(window * window * out),
            float(window * window * out), 0.0,
            BYTES_PER_VALUE * (h * w * c + out), BYTES_PER_VALUE * (2 * h * w * c + out), 0, out))
        self.shape = (h_out, w_out, c)
        return self

    def global_avg_pool(self, name: str | None = None) -> "Builder":
        """Mean over H and W."""
        h, w, c = self.shape
        self.layers.append(LayerCost(
            self._name("gap", name), "pool", 0.0, float(h * w * c), float(h * w * c), 0.0,
            BYTES_PER_VALUE * (h * w * c + c), BYTES_PER_VALUE * (h * w * c + c), 0, c))
        self.shape = (c,)
        return self

    def add(self, other: "Builder", name: str | None = None) -> "Builder":
        """Residual sum with another branch (its layers are appended first)."""
        if tuple(other.shape) != tuple(self.shape):
            raise ConfigError("add branch shape", tuple(other.shape), f"the main branch's {tuple(self.shape)}")
        self.layers.extend(other.layers)
        n = self._elems()
        self.layers.append(LayerCost(
            self._name("add", name), "add", 0.0, float(n), 0.0, 0.0,
            BYTES_PER_VALUE * 3 * n, BYTES_PER_VALUE * 2 * n, 0, n))
        return self

    def concat(self, branches: Sequence["Builder"]) -> "Builder":
        """Channel concatenation of branches forked from this builder (no cost: a copy XLA fuses)."""
        hw = {tuple(b.shape[:2]) for b in branches}
        if len(hw) != 1:
            raise ConfigError("concat branch shapes", sorted(hw), "one spatial shape for every branch")
        for b in branches:
            self.layers.extend(b.layers)
        self.shape = tuple(branches[0].shape[:2]) + (sum(b.shape[2] for b in branches),)
        return self

    def build(self, input_shape: Sequence[int], name: str, **kwargs: Any) -> NetworkCost:
        """The cost table of the layers built so far."""
        return network_from_layers(self.layers, input_shape, name=name, **kwargs)


_SPEC_KINDS = ("conv", "dense", "bn", "relu", "lrn", "maxpool", "avgpool", "gap", "flatten",
               "dropout")


def from_spec(spec: Sequence[Sequence[Any]], input_shape: Sequence[int], *,
              name: str = "spec") -> NetworkCost:
    """Cost table of a sequential layer spec.

    Each entry is a tuple ``(kind, *args)``, optionally ending with a dict of keyword arguments:
    ``("conv", out_channels, kernel[, stride])``, ``("dense", out_features)``, ``("bn",)``,
    ``("relu",)``, ``("lrn",)``, ``("maxpool", window[, stride])``, ``("avgpool", window[, stride])``,
    ``("gap",)`` (global average pool), ``("flatten",)`` and ``("dropout",)`` (no cost).

    Args:
      spec: The layers in order.
      input_shape: Per-sample input shape ``(H, W, C)``.
      name: Network name.

    Returns:
      The cost table.

    Raises:
      ConfigError: an unknown kind or a layer that does not fit its input.
    """
    b = Builder(tuple(int(s) for s in input_shape))
    for i, entry in enumerate(spec):
        if not entry:
            raise ConfigError(f"spec[{i}]", entry, "a tuple (kind, *args)")
        kind, *args = entry
        kwargs = args.pop() if args and isinstance(args[-1], dict) else {}
        if kind == "conv":
            b.conv(*args, **kwargs)
        elif kind == "dense":
            b.dense(*args, **kwargs)
        elif kind == "bn":
            b.bn(**kwargs)
        elif kind == "relu":
            b.relu(**kwargs)
        elif kind == "lrn":
            b.lrn(*args, **kwargs)
        elif kind in ("maxpool", "avgpool"):
            b.pool(*args, kind=kind[:3], **kwargs)
        elif kind == "gap":
            b.global_avg_pool(**kwargs)
        elif kind in ("flatten", "dropout"):
            pass
        else:
            raise ConfigError(f"spec[{i}] kind", kind, f"one of {', '.join(_SPEC_KINDS)}")
    return b.build(input_shape, name)


# ----------------------------------------------------------------------------------------------
# From a flax model, via XLA's cost analysis
# ----------------------------------------------------------------------------------------------


def _xla_cost(fn: Callable, *args: Any) -> tuple[float, float]:
    compiled = jax.jit(fn).lower(*args).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax returns one dict per device program
        cost = cost[0]
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def from_flax(model: Any, input_shape: Sequence[int], *, name: str | None = None,
              apply_kwargs: dict[str, Any] | None = None, batch_sizes: tuple[int, int] = (2, 4),
              seed: int = 0) -> NetworkCost:
    """Cost table of a flax linen model from XLA's cost analysis of its jitted passes.

    XLA reports totals for a whole program, so the table has two rows: "forward" (the jitted
    ``model.apply``) and "backward" (``jax.grad`` of the summed output w.r.t. ``params``, minus the
    forward). Costs are measured at two batch sizes and split into a per-sample slope and a fixed
    part; the fixed part of the bytes (weights) is attributed per step by the time model through
    ``params``. XLA counts a multiply-add as 2 FLOPs; ``fwd_macs`` is reported as half of the
    forward FLOPs (an upper bound on the true MACs, since element-wise FLOPs are included).

    Args:
      model: A flax linen module; called as ``model.apply(variables, x, **apply_kwargs)``.
      input_shape: Per-sample input shape, e.g. ``(32, 32, 3)``.
      name: Network name (default: the class name).
      apply_kwargs: Extra keyword arguments for ``apply`` (e.g. ``{"train": True}``); mutable
        collections other than ``params`` (batch statistics) are made mutable automatically.
      batch_sizes: Two batch sizes for the linear fit.
      seed: PRNG seed for ``init``.

    Returns:
      A two-row :class:`NetworkCost` of kind ``"xla"``.
    """
    apply_kwargs = dict(apply_kwargs or {})
    x0 = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
    variables = model.init(jax.random.PRNGKey(seed), x0, **apply_kwargs)
    params = variables["params"]
    others = {k: v for k, v in variables.items() if k != "params"}
    mutable = list(others)

    def forward(p, x):
        out = model.apply({"params": p, **others}, x, mutable=mutable or False, **apply_kwargs)
        out = out[0] if mutable else out
        return jnp.sum(out)

    def forward_backward(p, x):
        return jax.value_and_grad(forward)(p, x)

    fwd, tot = [], []
    for bs in batch_sizes:
        x = jnp.zeros((bs,) + tuple(input_shape), jnp.float32)
        fwd.append(_xla_cost(forward, params, x))
        tot.append(_xla_cost(forward_backward, params, x))
    db = float(batch_sizes[1] - batch_sizes[0])
    f_flops = (fwd[1][0] - fwd[0][0]) / db
    f_bytes = (fwd[1][1] - fwd[0][1]) / db
    t_flops = (tot[1][0] - tot[0][0]) / db
    t_bytes = (tot[1][1] - tot[0][1]) / db
    n_params = float(sum(np.prod(v.shape) for v in jax.tree_util.tree_leaves(params)))
    b_flops, b_bytes = max(t_flops - f_flops, 0.0), max(t_bytes - f_bytes, 0.0)
    # Activation memory: forward output bytes per sample as a proxy (XLA does not report it).
    rows = [
        LayerCost("forward", "xla", f_flops / 2, f_flops, 0.0, 0.0, f_bytes, 0.0, n_params,
                  f_bytes / BYTES_PER_VALUE / 2),
        LayerCost("backward", "xla", 0.0, 0.0, b_flops, 0.0, 0.0, b_bytes, 0.0, 0.0),
    ]
    return network_from_layers(rows, input_shape, name=name or type(model).__name__, merge=False)


def conv_flops(h_out: int, w_out: int, c_in: int, c_out: int, kernel: int, groups: int = 1) -> int:
    """Forward FLOPs of one convolution per sample: ``2 k^2 (C_in / groups) C_out H_out W_out``."""
    return 2 * kernel * kernel * (c_in // groups) * c_out * h_out * w_out


def describe(net: NetworkCost) -> str:
    """A short human-readable summary line (params, MACs, GFLOP per sample)."""
    s = net.summary()
    return (f"{net.name}: {s['params'] / 1e6:.3f} M params, {s['fwd_macs'] / 1e9:.3f} G MACs "
            f"({s['fwd_flops'] / 1e9:.3f} GFLOP) forward, {s['train_flops'] / 1e9:.3f} GFLOP "
            f"forward+backward per sample, {net.num_layers} layers ({len(net.layer_names)} distinct)")


__all__ = [
    "BYTES_PER_VALUE", "KINDS", "Builder", "LayerCost", "NetworkCost", "conv_flops", "describe", "from_flax",
    "from_spec", "network_from_layers",
]
