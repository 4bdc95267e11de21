"""Machine presets with units: accelerators, host, links and the calibrated efficiency terms.

A :class:`Machine` is a pytree of float scalars (so ``jax.grad`` can take derivatives w.r.t. any
figure, e.g. bandwidth or peak FLOP/s) plus static metadata: the name and, for every number, where
it comes from (``sources``). Bandwidths are per direction, in bytes per second; NVIDIA's NVLink
figures (300 GB/s for V100, 900 GB/s for H100/H200) are bidirectional totals, so half of them is
used. "Data" rates of InfiniBand are after line coding (QDR 8b/10b: 32 of 40 Gb/s; FDR 64b/66b:
54.5 of 56 Gb/s; EDR/NDR 64b/66b).

The efficiency fields describe how close a layer gets to the roofline (see
:func:`jaxsprint.perf.times.compute_time_s`). For the GPU presets they are *assumed* values
(documented in ``sources``); the paper used measured cuDNN per-layer times, which calibrating these
fields to measured step times plays the role of: the ``cpu`` preset's were fitted by
``experiments/calibrate.py`` to the stored step times of ``docs/perf-calibration.json`` (the command is in its
file), and the same launcher measures and fits any machine it runs on.

The datasheet presets are code (their figures are cited arithmetic: GB, Gbit, halved bidirectional totals);
the fitted ones are data, JSON files in ``jaxsprint/perf/data/`` (:data:`DATA_DIR`) read by
:func:`from_preset` (any preset file: :func:`jaxsprint.perf.presets.load_preset`). The runtime's figures of a host (learners sharing cores, the
updater's own costs, the cycles' jitter) are not a machine's: :class:`jaxsprint.calibration.host.HostFigures`.

Every figure of every preset has an entry in ``sources``: a datasheet or paper, "assumed" with the
reasoning, "chosen" (a modelling decision), or the command that fitted it and the file it was fitted on.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxsprint.errors import ConfigError

GB = 1e9
Gbit = 1e9 / 8
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")  # the presets that are data


@struct.dataclass
class Machine:
    """One machine: a node with ``gpus_per_node`` accelerators, a host CPU and a network.

    Attributes:
      peak_flops_per_s: fp32 peak of one accelerator (non-tensor-core, as SPRINT computed in fp32).
      memory_bandwidth_bytes_per_s: Accelerator memory bandwidth.
      device_memory_bytes: Accelerator memory (the sub-batch must fit).
      host_device_bandwidth_bytes_per_s: Host <-> accelerator copies (PCIe), per direction.
      host_memory_bandwidth_bytes_per_s: Effective bandwidth of the updater thread streaming over
        host memory (gather and momentum update), not the socket peak.
      network_bandwidth_bytes_per_s: Inter-node bandwidth per node, all rails, per direction.
      network_latency_s: Inter-node latency (alpha) of one message, MPI level.
      intra_node_bandwidth_bytes_per_s: Accelerator-to-accelerator bandwidth per accelerator inside
        a node (NVLink or PCIe peer), per direction; used by hierarchical collectives.
      intra_node_latency_s: Latency of one intra-node message.
      storage_bandwidth_bytes_per_s: Node-local storage read bandwidth, shared by the node's learners.
      max_nodes: Nodes of the real machine (larger requests are hypothetical; allowed with a warning).
      gpus_per_node: Accelerators per node.
      efficiency_fwd: Saturated fraction of peak reached by conv/dense forward passes, counted in direct
        multiply-accumulates (above 1 where a fast algorithm does fewer, e.g. Winograd convolutions).
      efficiency_bwd_data: Same for the gradient w.r.t. the layer input.
      efficiency_bwd_weight: Same for the gradient w.r.t. the weights.
      half_efficiency_rows: GEMM rows (batch x output pixels) at which a pass reaches half of its
        saturated efficiency, ``eff = eff_max * s(rows) s(cols) s(depth)`` with
        ``s(x) = x / (x + half)``: efficiency grows with the batch and saturates.
      half_efficiency_cols: The same for GEMM columns (output channels).
      half_efficiency_depth: The same for the GEMM reduction depth (``k^2`` input channels).
      half_efficiency_batch: The same for the sub-batch itself, ``1 / s(b) = 1 + (half / b)^g``
        (CPU convolution kernels block the batch dimension and run small batches far below their
        saturated speed whatever the image size). 0 switches the factor off (the presets'
        default; ``experiments/calibrate.py`` fits it).
      efficiency_sharpness: Exponent ``g`` of the saturation, ``s(x) = x^g / (x^g + half^g)``
        (1: the plain hyperbolic form; larger: a sharper knee, e.g. SIMD width on CPUs).
      cache_bytes: Size of the last-level cache a layer's working set should fit in.
      cache_miss_slowdown: Extra relative time of a forward or input-gradient GEMM pass whose
        working set ``ws`` (activations in and out, weights) is much larger than the cache: the
        pass is slowed by ``1 + cache_miss_slowdown * ws / (ws + cache_bytes)`` (0 disables it).
      cache_miss_slowdown_weight_grad: The same for the weight-gradient pass.
      memory_efficiency: Fraction of the memory bandwidth reached by memory-bound layers
        (activations, residual adds, pooling forward).
      norm_memory_efficiency: The same for normalisation layers (reductions + element-wise).
      maxpool_backward_memory_efficiency: The same for the backward pass of max pooling.
      per_layer_overhead_s: Launch / dispatch overhead per layer call (forward; backward counts 2).
      step_overhead_s: Fixed overhead per learner step (framework, synchronisation).
      updater_passes: Passes of the momentum update over the 4P bytes of parameters
        (read gradient, read+write momentum, read+write weights: 5).
      updater_overhead_s: Fixed overhead per updater cycle.
      name: Preset name (static).
      description: One line (static).
      sources: ``(field, source)`` pairs saying where each number comes from (static).
    """

    peak_flops_per_s: jax.Array
    memory_bandwidth_bytes_per_s: jax.Array
    device_memory_bytes: jax.Array
    host_device_bandwidth_bytes_per_s: jax.Array
    host_memory_bandwidth_bytes_per_s: jax.Array
    network_bandwidth_bytes_per_s: jax.Array
    network_latency_s: jax.Array
    intra_node_bandwidth_bytes_per_s: jax.Array
    intra_node_latency_s: jax.Array
    storage_bandwidth_bytes_per_s: jax.Array
    max_nodes: jax.Array
    gpus_per_node: jax.Array
    efficiency_fwd: jax.Array
    efficiency_bwd_data: jax.Array
    efficiency_bwd_weight: jax.Array
    half_efficiency_rows: jax.Array
    half_efficiency_cols: jax.Array
    half_efficiency_depth: jax.Array
    half_efficiency_batch: jax.Array
    efficiency_sharpness: jax.Array
    cache_bytes: jax.Array
    cache_miss_slowdown: jax.Array
    cache_miss_slowdown_weight_grad: jax.Array
    memory_efficiency: jax.Array
    norm_memory_efficiency: jax.Array
    maxpool_backward_memory_efficiency: jax.Array
    per_layer_overhead_s: jax.Array
    step_overhead_s: jax.Array
    updater_passes: jax.Array
    updater_overhead_s: jax.Array
    name: str = struct.field(pytree_node=False, default="machine")
    description: str = struct.field(pytree_node=False, default="")
    sources: tuple[tuple[str, str], ...] = struct.field(pytree_node=False, default=())


# The numeric figures of a Machine, in declaration order (the metadata fields are not figures).
FIELDS = tuple(f for f in Machine.__dataclass_fields__ if f not in ("name", "description", "sources"))

# Assumed efficiency terms for GPUs running cuDNN-era fp32 training (no public per-layer data, no GPU
# measurements here).
_GPU_EFFICIENCY = dict(
    efficiency_fwd=0.6, efficiency_bwd_data=0.55, efficiency_bwd_weight=0.5,
    half_efficiency_rows=512.0, half_efficiency_cols=8.0, half_efficiency_depth=8.0, half_efficiency_batch=0.0,
    efficiency_sharpness=1.0, cache_bytes=4e6, cache_miss_slowdown=0.0,
    cache_miss_slowdown_weight_grad=0.0,
    memory_efficiency=0.8, norm_memory_efficiency=0.7,
    maxpool_backward_memory_efficiency=0.5, per_layer_overhead_s=10e-6,
    step_overhead_s=1e-3, updater_passes=5.0, updater_overhead_s=1e-3)
_GPU_PASS_NOTE = ("assumed: cuDNN-era fp32 convolutions reach 50-60% of peak on large layers (this gives "
                  "ResNet-50 at sub-batch 32 about 50 images/s on a K80 die, near published benchmarks); "
                  "not calibrated")
_GPU_OTHER_NOTE = "assumed, not calibrated (no GPU measurements): fit it with experiments/calibrate.py"
_GPU_EFFICIENCY_SOURCES = {
    **{f: _GPU_PASS_NOTE for f in ("efficiency_fwd", "efficiency_bwd_data", "efficiency_bwd_weight")},
    **{f: _GPU_OTHER_NOTE for f in _GPU_EFFICIENCY if not f.startswith(("efficiency_", "updater_"))},
    "efficiency_sharpness": "chosen: 1, the plain hyperbolic saturation",
    "half_efficiency_batch": "chosen: 0 (off)",
    "cache_miss_slowdown": "chosen: 0 (off)",
    "cache_miss_slowdown_weight_grad": "chosen: 0 (off)",
    "updater_passes": "protocol: read the gradient, read + write the momentum, read + write the weights",
    "updater_overhead_s": "assumed: 1 ms per updater cycle (thread hand-off, MPI call), not measured",
}


def _check_field(field: str) -> None:
    if field not in FIELDS:
        raise ConfigError("field", field, f"a machine figure: one of {', '.join(FIELDS)}")


def make_machine(name: str, description: str, sources: dict[str, str], **figures: float) -> Machine:
    """Builds a :class:`Machine` from keyword figures (all fields of the dataclass are required).

    Raises:
      ConfigError: a missing, unknown, non-finite or non-positive figure (zero allowed for overheads,
        cache-miss slowdowns and ``half_efficiency_batch``, where it means "off").
    """
    missing = [f for f in FIELDS if f not in figures or figures[f] is None]
    if missing:
        raise ConfigError(f"machine {name!r} figures", tuple(missing), "present: every figure of a Machine")
    for field, value in figures.items():
        _check_field(field)
        allow_zero = (field.endswith("overhead_s") or field.startswith("cache_miss_slowdown")
                      or field == "half_efficiency_batch")
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = float("nan")
        if not (v == v and abs(v) != float("inf")) or v < 0 or (v == 0 and not allow_zero):
            raise ConfigError(field, value, f"a finite number {'>= 0' if allow_zero else '> 0'} "
                                            f"(machine {name!r})")
    return Machine(**{k: jnp.float32(v) for k, v in figures.items()}, name=name,
                   description=description, sources=tuple(sources.items()))


def _tsubame25() -> Machine:
    return make_machine(
        "tsubame25", "TSUBAME 2.5: 3 x Tesla K20X per node, dual-rail QDR InfiniBand",
        {
            "peak_flops_per_s": "NVIDIA Tesla K20X datasheet: 3.95 TFLOP/s fp32",
            "memory_bandwidth_bytes_per_s": "K20X datasheet: 250 GB/s",
            "device_memory_bytes": "K20X datasheet: 6 GB",
            "host_device_bandwidth_bytes_per_s": "PCIe 2.0 x16: 8 GB/s per direction",
            "host_memory_bandwidth_bytes_per_s": "assumed: one updater thread streams about 8 GB/s "
                                                 "on Westmere-EP (2 x Xeon X5670, 3 x DDR3-1333 per socket)",
            "network_bandwidth_bytes_per_s": "dual-rail QDR InfiniBand: 2 x 32 Gb/s data = 8 GB/s",
            "network_latency_s": "assumed MPI small-message latency over QDR: 2 us",
            "intra_node_bandwidth_bytes_per_s": "PCIe 2.0 peer copies: 8 GB/s",
            "intra_node_latency_s": "assumed: 10 us",
            "storage_bandwidth_bytes_per_s": "assumed node-local SSD: 250 MB/s",
            "max_nodes": "1,408 nodes (TSUBAME 2.5 system description)",
            "gpus_per_node": "3 x K20X per node",
            **_GPU_EFFICIENCY_SOURCES,
        },
        peak_flops_per_s=3.95e12, memory_bandwidth_bytes_per_s=250 * GB, device_memory_bytes=6 * GB,
        host_device_bandwidth_bytes_per_s=8 * GB, host_memory_bandwidth_bytes_per_s=8 * GB,
        network_bandwidth_bytes_per_s=2 * 32 * Gbit, network_latency_s=2e-6,
        intra_node_bandwidth_bytes_per_s=8 * GB, intra_node_latency_s=10e-6,
        storage_bandwidth_bytes_per_s=0.25 * GB, max_nodes=1408, gpus_per_node=3,
        **_GPU_EFFICIENCY)


def _tsubame_kfc_dl() -> Machine:
    return make_machine(
        "tsubame_kfc_dl", "TSUBAME-KFC/DL: 4 x Tesla K80 (8 GPU dies) per node, FDR InfiniBand",
        {
            "peak_flops_per_s": "NVIDIA Tesla K80 datasheet: 8.74 TFLOP/s fp32 per board with GPU "
                                "Boost = 4.37 per die (2.8 per die at base clock)",
            "memory_bandwidth_bytes_per_s": "K80 datasheet: 480 GB/s per board = 240 GB/s per die",
            "device_memory_bytes": "K80 datasheet: 24 GB per board = 12 GB per die",
            "host_device_bandwidth_bytes_per_s": "PCIe 3.0 x16: 15.75 GB/s per board, shared by its "
                                                 "2 dies: 7.9 GB/s per die",
            "host_memory_bandwidth_bytes_per_s": "assumed: one updater thread streams about 10 GB/s on "
                                                 "Ivy Bridge-EP (2 x Xeon E5-2620 v2, 4 x DDR3-1600 per socket)",
            "network_bandwidth_bytes_per_s": "FDR InfiniBand 4x: 56 Gb/s, 54.5 Gb/s data = 6.8 GB/s",
            "network_latency_s": "assumed MPI small-message latency over FDR: 1.5 us",
            "intra_node_bandwidth_bytes_per_s": "PCIe 3.0 peer copies: 7.9 GB/s per die",
            "intra_node_latency_s": "assumed: 10 us",
            "storage_bandwidth_bytes_per_s": "assumed node-local SSD: 500 MB/s",
            "max_nodes": "40 nodes (TSUBAME-KFC, upgraded to K80 as KFC/DL), as commonly reported",
            "gpus_per_node": "4 x K80 boards = 8 GPU dies per node",
            **_GPU_EFFICIENCY_SOURCES,
        },
        peak_flops_per_s=4.37e12, memory_bandwidth_bytes_per_s=240 * GB, device_memory_bytes=12 * GB,
        host_device_bandwidth_bytes_per_s=15.75 * GB / 2, host_memory_bandwidth_bytes_per_s=10 * GB,
        network_bandwidth_bytes_per_s=54.5 * Gbit, network_latency_s=1.5e-6,
        intra_node_bandwidth_bytes_per_s=15.75 * GB / 2, intra_node_latency_s=10e-6,
        storage_bandwidth_bytes_per_s=0.5 * GB, max_nodes=40, gpus_per_node=8,
        **_GPU_EFFICIENCY)


def _abci() -> Machine:
    return make_machine(
        "abci", "ABCI: 4 x Tesla V100 SXM2 16 GB per node, NVLink 2, 2 x EDR InfiniBand",
        {
            "peak_flops_per_s": "NVIDIA V100 SXM2 datasheet: 15.7 TFLOP/s fp32 (125 fp16 tensor)",
            "memory_bandwidth_bytes_per_s": "V100 datasheet: 900 GB/s",
            "device_memory_bytes": "ABCI V100 SXM2: 16 GB",
            "host_device_bandwidth_bytes_per_s": "PCIe 3.0 x16: 15.75 GB/s per direction",
            "host_memory_bandwidth_bytes_per_s": "assumed: one updater thread streams about 12 GB/s on "
                                                 "2 x Xeon Gold 6148 (6 x DDR4-2666 per socket)",
            "network_bandwidth_bytes_per_s": "2 x EDR InfiniBand: 2 x 100 Gb/s = 25 GB/s",
            "network_latency_s": "assumed MPI small-message latency over EDR: 1.2 us",
            "intra_node_bandwidth_bytes_per_s": "NVLink 2: 300 GB/s per GPU bidirectional = 150 per direction",
            "intra_node_latency_s": "assumed: 5 us",
            "storage_bandwidth_bytes_per_s": "node-local NVMe SSD (Intel DC P4600 1.6 TB): about 3.2 GB/s read",
            "max_nodes": "1,088 compute nodes (ABCI system description)",
            "gpus_per_node": "4 x V100 SXM2 per node",
            **_GPU_EFFICIENCY_SOURCES,
        },
        peak_flops_per_s=15.7e12, memory_bandwidth_bytes_per_s=900 * GB, device_memory_bytes=16 * GB,
        host_device_bandwidth_bytes_per_s=15.75 * GB, host_memory_bandwidth_bytes_per_s=12 * GB,
        network_bandwidth_bytes_per_s=2 * 100 * Gbit, network_latency_s=1.2e-6,
        intra_node_bandwidth_bytes_per_s=150 * GB, intra_node_latency_s=5e-6,
        storage_bandwidth_bytes_per_s=3.2 * GB, max_nodes=1088, gpus_per_node=4,
        **_GPU_EFFICIENCY)


def _dgx(gpu: str) -> Machine:
    h200 = gpu == "h200"
    return make_machine(
        f"dgx_{gpu}", f"DGX {gpu.upper()}: 8 x {gpu.upper()} SXM, NVLink 4, 8 x 400 Gb/s InfiniBand NDR",
        {
            "peak_flops_per_s": f"NVIDIA {gpu.upper()} SXM datasheet: 67 TFLOP/s fp32 "
                                "(989 bf16 dense tensor; set peak_flops_per_s to it for bf16 training)",
            "memory_bandwidth_bytes_per_s": f"{gpu.upper()} SXM datasheet: {'4.8' if h200 else '3.35'} TB/s",
            "device_memory_bytes": f"{gpu.upper()} SXM datasheet: {'141' if h200 else '80'} GB",
            "host_device_bandwidth_bytes_per_s": "PCIe 5.0 x16: about 63 GB/s per direction",
            "host_memory_bandwidth_bytes_per_s": "assumed: one updater thread streams about 20 GB/s on "
                                                 "2 x Xeon Platinum 8480C (8 x DDR5-4800 per socket)",
            "network_bandwidth_bytes_per_s": "8 x ConnectX-7 400 Gb/s NDR = 400 GB/s per node",
            "network_latency_s": "assumed MPI small-message latency over NDR: 1 us",
            "intra_node_bandwidth_bytes_per_s": "NVLink 4: 900 GB/s per GPU bidirectional = 450 per direction",
            "intra_node_latency_s": "assumed: 3 us",
            "storage_bandwidth_bytes_per_s": "assumed: 8 x NVMe U.2 in RAID 0, about 25 GB/s read",
            "max_nodes": "a DGX SuperPOD scalable unit has 32 nodes; larger counts are hypothetical",
            "gpus_per_node": "8 GPUs per DGX node",
            **_GPU_EFFICIENCY_SOURCES,
        },
        peak_flops_per_s=67e12, memory_bandwidth_bytes_per_s=(4.8e12 if h200 else 3.35e12),
        device_memory_bytes=(141 if h200 else 80) * GB,
        host_device_bandwidth_bytes_per_s=63 * GB, host_memory_bandwidth_bytes_per_s=20 * GB,
        network_bandwidth_bytes_per_s=8 * 400 * Gbit, network_latency_s=1e-6,
        intra_node_bandwidth_bytes_per_s=450 * GB, intra_node_latency_s=3e-6,
        storage_bandwidth_bytes_per_s=25 * GB, max_nodes=32, gpus_per_node=8,
        **_GPU_EFFICIENCY)


def from_preset(data: dict[str, Any]) -> Machine:
    """The machine of a preset file's JSON object (its ``name``, ``description``, ``figures``, ``sources``).

    Raises:
      ConfigError: a missing or invalid figure.
    """
    figures = dict(data["figures"])
    return make_machine(str(data.get("name", "machine")), str(data.get("description", "")),
                        {str(k): str(v) for k, v in data.get("sources", {}).items()}, **figures)


def _packaged(name: str) -> Machine:
    """A preset shipped as data (``DATA_DIR/<name>.json``, written by a calibration launcher)."""
    with open(os.path.join(DATA_DIR, f"{name}.json")) as fh:
        return from_preset(json.load(fh))


PRESETS = {
    "tsubame25": _tsubame25,
    "tsubame_kfc_dl": _tsubame_kfc_dl,
    "abci": _abci,
    "dgx_h100": lambda: _dgx("h100"),
    "dgx_h200": lambda: _dgx("h200"),
}
PRESETS.update({name[:-5]: functools.partial(_packaged, name[:-5])
                for name in sorted(os.listdir(DATA_DIR)) if name.endswith(".json")})


def get(name: str) -> Machine:
    """A machine preset by name.

    Raises:
      ConfigError: an unknown name (the message lists the allowed ones).
    """
    if name not in PRESETS:
        raise ConfigError("machine", name, f"one of {', '.join(PRESETS)}")
    return PRESETS[name]()


def with_figures(machine: Machine, **figures: Any) -> Machine:
    """A copy of ``machine`` with some figures replaced (e.g. a calibration result).

    Raises:
      ConfigError: an unknown figure.
    """
    for field in figures:
        _check_field(field)
    return machine.replace(**{k: jnp.asarray(v, jnp.float32) for k, v in figures.items()})


def describe(machine: Machine) -> str:
    """A table of the machine's figures with their sources.

    A preset file saved before every figure had its own source may carry one shared ``efficiency_*``
    entry; it is shown for the figures that lack their own.
    """
    src = dict(machine.sources)
    lines = [f"{machine.name}: {machine.description}"]
    for field in FIELDS:
        note = src.get(field, src.get("efficiency_*", ""))
        lines.append(f"  {field:36s} {float(getattr(machine, field)):12.4g}  {note}")
    return "\n".join(lines)


__all__ = ["DATA_DIR", "FIELDS", "Machine", "PRESETS", "describe", "from_preset", "get", "make_machine", "with_figures"]
