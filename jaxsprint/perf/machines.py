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
``experiments/calibrate.py`` to the stored step times of ``docs/perf-calibration.json``
(:data:`CPU_CALIBRATION_COMMAND`), and the same launcher measures and fits any machine it runs on.

Every figure of every preset has an entry in ``sources``: a datasheet or paper, "assumed" with the
reasoning, "chosen" (a modelling decision), or the command that fitted it and the file it was fitted on.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxsprint.errors import ConfigError

GB = 1e9
Gbit = 1e9 / 8


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
      cores_per_node: Compute units the node's learners run on (physical cores for CPU learners, the
        accelerators for GPU ones), shared by every learner of the node and by its updaters while they work
        (see :func:`jaxsprint.perf.times.runtime_times`). Default: ``gpus_per_node``.
      learner_overhead_s: Per-cycle host cost of one learner besides its device step (the weight fetch,
        the gradient's hand-off into the node buffer, Python dispatch), done under the host process's
        interpreter lock: the learners of one process do it one at a time. Default 0.
      learner_step_cores: Compute units one learner's device step takes when the learners keep every unit
        busy, at large sub-batches (a CPU step may spread over more than one core, and its memory traffic
        slows its neighbours'; 1 for an accelerator). Default 1.
      updater_per_learner_s: The updater's own cost per cycle for each learner of its host (taking in
        that learner's gradients and statistics). Default 0.
      updater_queue: Once the learners fill the cores, the updater's own work per cycle also waits this
        fraction of one learner's device step (its computations queue behind the learners' on the shared
        compute units). Default 0.
      updater_hosts_stretch: With several co-located hosts (processes of one machine), the updater's own
        work takes ``1 + updater_hosts_stretch`` times as long (each cycle's all-reduce waits for the slower
        process). Default 0.
      updater_cores: Compute units an updater takes while it works (its busy fraction of the cycle), which
        the learners then lack. Default 0.
      updater_apply_s: The updater's own cost of applying an update (the optimizer step), which a cycle that
        gathered no gradient skips. Default 0.
      learner_step_cores_half_batch: Sub-batch at which a step on busy cores takes half of its excess over
        one compute unit, ``1 + (learner_step_cores - 1) b / (b + this)``; 0: ``learner_step_cores`` at every
        sub-batch. Default 0.
      learner_cv: Coefficient of variation of a learner's cycle (the jitter of ``T_c``) in the model's
        distributions. Default 0.05.
      updater_cv: Coefficient of variation of the updater's cycle (``update_cv`` of
        :func:`jaxsprint.perf.sprint.distributions`). Default 0 (a deterministic cycle).
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
    cores_per_node: jax.Array
    learner_overhead_s: jax.Array
    learner_step_cores: jax.Array
    updater_per_learner_s: jax.Array
    updater_queue: jax.Array
    updater_hosts_stretch: jax.Array
    updater_cores: jax.Array
    updater_apply_s: jax.Array
    learner_step_cores_half_batch: jax.Array
    learner_cv: jax.Array
    updater_cv: jax.Array
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


# Figures of the real runtime on a node (learners sharing compute units, the updater's own cost, the
# jitter of both cycles), added after the presets were made: a preset or a preset file that lacks them
# gets these values, which leave the SPRINT model of separate accelerators unchanged (None: the
# figure named instead, i.e. as many units as learners).
RUNTIME_DEFAULTS: dict[str, float | str] = dict(
    cores_per_node="gpus_per_node", learner_overhead_s=0.0, learner_step_cores=1.0, updater_per_learner_s=0.0,
    updater_queue=0.0, updater_hosts_stretch=0.0, updater_cores=0.0, updater_apply_s=0.0,
    learner_step_cores_half_batch=0.0, learner_cv=0.05, updater_cv=0.0)
# Runtime figures of an earlier form of the runtime model (a sharing exponent per cycle, a queue fraction for
# several hosts): a preset file saved with them still loads, without them.
RETIRED_FIELDS = ("learner_contention", "updater_contention", "updater_queue_hosts")
_RUNTIME_DEFAULT_SOURCES = {
    "cores_per_node": "default: gpus_per_node (every learner has its own accelerator)",
    "learner_overhead_s": "default: 0 (host cost of a learner cycle not modelled)",
    "learner_step_cores": "default: 1 (a step keeps one compute unit busy)",
    "updater_per_learner_s": "default: 0 (the updater's cost does not grow with the learners)",
    "updater_queue": "default: 0 (the updater's work never waits for the learners')",
    "updater_hosts_stretch": "default: 0 (co-located hosts do not slow each other's updater)",
    "updater_cores": "default: 0 (the updater takes no compute unit from the learners)",
    "updater_apply_s": "default: 0 (an empty updater cycle costs as much as one that applies an update)",
    "learner_step_cores_half_batch": "default: 0 (a step takes learner_step_cores on busy cores at every sub-batch)",
    "learner_cv": "default: 0.05 (assumed compute jitter)",
    "updater_cv": "default: 0 (a deterministic updater cycle, the protocol's assumption)",
}


def _check_field(field: str) -> None:
    if field not in FIELDS:
        raise ConfigError("field", field, f"a machine figure: one of {', '.join(FIELDS)}")


def make_machine(name: str, description: str, sources: dict[str, str], **figures: float) -> Machine:
    """Builds a :class:`Machine` from keyword figures (all fields of the dataclass are required).

    The runtime figures (:data:`RUNTIME_DEFAULTS`) may be left out: they then take their defaults, with a
    source that says so.

    Raises:
      ConfigError: a missing, unknown, non-finite or non-positive figure (zero allowed for overheads,
        cache-miss slowdowns, ``half_efficiency_batch`` and the two cvs, where it means "off").
    """
    figures = {k: v for k, v in figures.items() if k not in RETIRED_FIELDS}
    sources = {k: v for k, v in sources.items() if k not in RETIRED_FIELDS}
    for field, default in RUNTIME_DEFAULTS.items():
        if field not in figures:
            figures[field] = figures.get(default) if isinstance(default, str) else default
            sources.setdefault(field, _RUNTIME_DEFAULT_SOURCES[field])
    missing = [f for f in FIELDS if f not in figures or figures[f] is None]
    if missing:
        raise ConfigError(f"machine {name!r} figures", tuple(missing), "present: every figure of a Machine")
    for field, value in figures.items():
        _check_field(field)
        allow_zero = (field.endswith("overhead_s") or field.startswith("cache_miss_slowdown")
                      or field in ("half_efficiency_batch", "learner_cv", "updater_cv", "updater_queue",
                                   "updater_per_learner_s", "updater_hosts_stretch", "updater_cores",
                                   "updater_apply_s", "learner_step_cores_half_batch"))
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


# The command that fitted the cpu preset's compute figures: the small-CNN calibration set (40 plain-SGD train
# steps of 16-32 px VGG-like CNNs, single-threaded XLA:CPU, CPU time, the per-shape minimum of two measuring
# runs; docs/perf-model.md), a random half held out, nine figures fitted with a robust loss inside the bounds
# the set was first fitted in (efficiencies at most 1: XLA's direct convolutions). It starts from this preset,
# so a rerun reproduces the numbers below to a few percent (more for the weakly identified ones).
CPU_CALIBRATION_COMMAND = (
    "python experiments/calibrate.py --measurements=docs/perf-calibration.json --base=cpu "
    "--holdout_batches= --holdout_fraction=0.5 --holdout_seed=1 --loss=soft_l1 --loss_scale=0.1 "
    "--fit_fields=efficiency_fwd,efficiency_bwd_weight,half_efficiency_rows,half_efficiency_cols,"
    "half_efficiency_depth,cache_bytes,cache_miss_slowdown_weight_grad,norm_memory_efficiency,"
    "maxpool_backward_memory_efficiency "
    "--bounds=efficiency_fwd=0.01:1,efficiency_bwd_weight=0.01:1,half_efficiency_rows=1:1e4,"
    "half_efficiency_cols=0.1:1e3,half_efficiency_depth=0.1:1e3,cache_bytes=1e5:1e9,"
    "cache_miss_slowdown_weight_grad=1e-3:10,norm_memory_efficiency=1e-3:1,maxpool_backward_memory_efficiency=1e-3:1"
)
_FITTED = ("fitted by `python experiments/calibrate.py --measurements=docs/perf-calibration.json ...` on "
           "docs/perf-calibration.json (the whole command: machines.CPU_CALIBRATION_COMMAND; held-out median "
           "error 6.1%)")
_CHOSEN = "chosen before the fit and held fixed by it (the fit of CPU_CALIBRATION_COMMAND keeps it)"

# The cpu preset's compute figures: fitted ones rounded to 4 significant digits.
CPU_CALIBRATION = dict(
    efficiency_fwd=0.9877, efficiency_bwd_data=0.9877, efficiency_bwd_weight=0.9911,
    half_efficiency_rows=86.71, half_efficiency_cols=7.896, half_efficiency_depth=51.14, half_efficiency_batch=0.0,
    efficiency_sharpness=2.0, cache_bytes=55.38e6, cache_miss_slowdown=0.0,
    cache_miss_slowdown_weight_grad=9.824, memory_efficiency=1.0, norm_memory_efficiency=0.4023,
    maxpool_backward_memory_efficiency=0.9841, per_layer_overhead_s=2e-6, step_overhead_s=2e-5)
_CPU_CALIBRATION_SOURCES = {
    **{f: _FITTED for f in ("efficiency_fwd", "efficiency_bwd_weight", "half_efficiency_rows",
                            "half_efficiency_cols", "half_efficiency_depth", "cache_bytes",
                            "cache_miss_slowdown_weight_grad", "norm_memory_efficiency",
                            "maxpool_backward_memory_efficiency")},
    "efficiency_bwd_data": "tied to efficiency_fwd (XLA:CPU runs the input gradient with the forward "
                           f"convolution kernel), {_FITTED}",
    "half_efficiency_batch": "chosen: 0 (off); experiments/calibrate.py fits it for presets of this "
                             "project's ResNets on the native CPU kernels",
    "efficiency_sharpness": f"{_CHOSEN}: 2, a sharper knee than the hyperbolic form (SIMD width)",
    "cache_miss_slowdown": f"{_CHOSEN}: 0, the forward passes showed no working-set slowdown",
    "memory_efficiency": f"{_CHOSEN}: 1, memory_bandwidth_bytes_per_s is the effective stream rate",
    "per_layer_overhead_s": f"{_CHOSEN}: 2 us per layer call",
    "step_overhead_s": f"{_CHOSEN}: 20 us per step",
}


def _cpu() -> Machine:
    return make_machine(
        "cpu", "the calibration CPU: one learner per core of a 2-core AMD EPYC (XLA:CPU, one thread each)",
        {
            "peak_flops_per_s": "measured once when the preset was made (not stored, cannot be regenerated "
                                "from a file; kept): a single-threaded 512x512 fp32 matmul (XLA:CPU) ran "
                                "104 GFLOP per CPU-second (boost clock)",
            "memory_bandwidth_bytes_per_s": "chosen: 20 GB/s, below the about 30 GB/s (read + write) a "
                                            "single-threaded numpy copy of 200 MB moved when the preset was made "
                                            "(not stored; kept); the fitted memory efficiencies are relative "
                                            "to it",
            "device_memory_bytes": "assumed: 8 GB of host RAM available to JAX",
            "host_device_bandwidth_bytes_per_s": "chosen: a host memory copy, same as memory bandwidth",
            "host_memory_bandwidth_bytes_per_s": "assumed: 10 GB/s for one updater thread",
            "network_bandwidth_bytes_per_s": "single node: loopback, assumed 10 GB/s (experiments/calibrate.py "
                                             "fits it from local all-reduces)",
            "network_latency_s": "single node: assumed 5 us (experiments/calibrate.py fits it)",
            "intra_node_bandwidth_bytes_per_s": "fake devices share memory: assumed 10 GB/s",
            "intra_node_latency_s": "assumed 5 us",
            "storage_bandwidth_bytes_per_s": "in-memory data: assumed 10 GB/s",
            "max_nodes": "one node",
            "gpus_per_node": "2 cores = 2 learners (more fake CPU devices would share the cores, "
                             "which the model does not describe)",
            "updater_passes": "protocol: read the gradient, read + write the momentum, read + write the weights",
            "updater_overhead_s": "assumed: 0.1 ms per updater cycle (experiments/calibrate.py fits it)",
            **_CPU_CALIBRATION_SOURCES,
        },
        peak_flops_per_s=104e9, memory_bandwidth_bytes_per_s=20 * GB, device_memory_bytes=8 * GB,
        host_device_bandwidth_bytes_per_s=20 * GB, host_memory_bandwidth_bytes_per_s=10 * GB,
        network_bandwidth_bytes_per_s=10 * GB, network_latency_s=5e-6,
        intra_node_bandwidth_bytes_per_s=10 * GB, intra_node_latency_s=5e-6,
        storage_bandwidth_bytes_per_s=10 * GB, max_nodes=1, gpus_per_node=2,
        updater_passes=5.0, updater_overhead_s=1e-4, **CPU_CALIBRATION)


# The command that measures and fits the cpu_runtime preset's figures (jaxsprint.runtime on this machine: one
# learner's gradient step at five sub-batches, runtime runs of 1-8 learners with and without an emulated
# network, gloo all-reduces over 2 processes; about 10 minutes on a quiet machine). It writes
# docs/runtime-calibration.json and prints CPU_RUNTIME_CALIBRATION as below.
CPU_RUNTIME_CALIBRATION_COMMAND = (
    "python experiments/calibrate_runtime.py --out=docs/runtime-calibration.json")
CPU_RUNTIME_CALIBRATION_FILE = "docs/runtime-calibration.json"
_RUNTIME_FITTED = (f"fitted by `{CPU_RUNTIME_CALIBRATION_COMMAND}` (stored in {CPU_RUNTIME_CALIBRATION_FILE}; "
                   "experiments/calibrate_runtime.py --fit_only refits the stored measurements)")
_RUNTIME_PROVISIONAL = ("provisional: not measured yet; a round figure near the first probe of the runtime "
                        f"(2 cores, 2-8 learners), to be replaced by the fit of `{CPU_RUNTIME_CALIBRATION_COMMAND}`")
# The fitted figures of the cpu_runtime preset (4 significant digits) and whether they come from the fit.
CPU_RUNTIME_FITTED = True
CPU_RUNTIME_CALIBRATION = dict(
    efficiency_fwd=0.6033, half_efficiency_batch=2.329, step_overhead_s=1.013e-06,
    learner_overhead_s=0.001136, learner_step_cores=1.147, updater_overhead_s=1e-06, updater_per_learner_s=5.235e-05,
    updater_cores=0.07875, updater_hosts_stretch=4.624, updater_queue=0.0001, network_latency_s=0.0001542,
    network_bandwidth_bytes_per_s=1703000000.0, learner_cv=0.2731, updater_cv=1.649, updater_apply_s=0.001183,
    learner_step_cores_half_batch=0.5)


def _cpu_runtime() -> Machine:
    """This machine running :mod:`jaxsprint.runtime`: the ``cpu`` preset with the runtime's figures.

    The compute figures are fitted to the runtime network's XLA cost table (a two-row table of
    :func:`jaxsprint.perf.networks.from_flax`, as :func:`jaxsprint.calibration.timing.runtime_network` builds it),
    so use this preset with that table, not with the layer tables of the zoo.
    """
    base = _cpu()
    figures = {f: float(getattr(base, f)) for f in FIELDS}
    sources = dict(base.sources)
    note = _RUNTIME_FITTED if CPU_RUNTIME_FITTED else _RUNTIME_PROVISIONAL
    figures.update(CPU_RUNTIME_CALIBRATION, efficiency_bwd_data=CPU_RUNTIME_CALIBRATION["efficiency_fwd"],
                   efficiency_bwd_weight=CPU_RUNTIME_CALIBRATION["efficiency_fwd"], cores_per_node=2.0)
    sources.update({f: note for f in CPU_RUNTIME_CALIBRATION})
    sources.update({
        "efficiency_bwd_data": f"tied to efficiency_fwd (one figure for the whole XLA table), {note}",
        "efficiency_bwd_weight": f"tied to efficiency_fwd (one figure for the whole XLA table), {note}",
        "cores_per_node": "2 physical cores (the learners of every process on this machine share them)",
        "gpus_per_node": "2 cores; the runtime's learners_per_host is given per prediction",
    })
    return make_machine(
        "cpu_runtime", "this 2-core machine running jaxsprint.runtime: learner threads on fake CPU devices "
        "sharing the cores, one updater thread, gloo between processes", sources, **figures)


PRESETS = {
    "tsubame25": _tsubame25,
    "tsubame_kfc_dl": _tsubame_kfc_dl,
    "abci": _abci,
    "dgx_h100": lambda: _dgx("h100"),
    "dgx_h200": lambda: _dgx("h200"),
    "cpu": _cpu,
    "cpu_runtime": _cpu_runtime,
}


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


__all__ = ["CPU_CALIBRATION", "CPU_CALIBRATION_COMMAND", "CPU_RUNTIME_CALIBRATION",
           "CPU_RUNTIME_CALIBRATION_COMMAND", "CPU_RUNTIME_CALIBRATION_FILE", "CPU_RUNTIME_FITTED", "FIELDS",
           "RETIRED_FIELDS", "RUNTIME_DEFAULTS", "Machine", "PRESETS", "describe", "get",
           "make_machine", "with_figures"]
