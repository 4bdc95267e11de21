"""Final Polishing: BatchNorm statistics recomputed from un-augmented training images with the final weights.

Kasagi et al. (HPDC 2020) and Yamazaki et al. (arXiv 1903.12650) "adjust the means and variances in the batch
normalization and mitigate the difference of normalization between validation datasets and augmented training
datasets". Their public implementation switches the last epochs to un-augmented images while training goes
on (offered here as ``polish.mode = "no_augment_epochs"``). This module is the pure form: a pass of forward
computations that returns new population statistics and leaves every parameter untouched.

The statistics are exact population statistics, not an EMA:
  * every forward pass normalises with fixed statistics (no batch statistics), so the input of each
    BatchNorm is a per-example function of the data and its moments do not depend on how the data were
    batched or split over devices;
  * each BatchNorm sows the masked ``(count, mean, M2)`` of its input over the global batch (sums reduced
    exactly across devices and hosts by XLA, padding masked out), and batches are merged with Chan et al.'s
    pairwise update in float32:
        n = n_a + n_b,  d = mean_b - mean_a,  mean = mean_a + d n_b / n,  M2 = M2_a + M2_b + d^2 n_a n_b / n;
  * the variance is the population (biased) variance M2 / n, as BatchNorm uses at inference.
Layer l's input depends on the statistics of the BatchNorms before it, so the pass is a fixed-point
iteration: pass 1 normalises with the given (EMA) statistics and measures every layer; each further pass
normalises with the previous pass's result. After p passes the BatchNorms at depth <= p (counted along the
longest chain of BatchNorms) are exact, so at most (number of BatchNorms + 1) passes reach the
self-consistent population statistics -- the statistics train-mode BatchNorm would use with the whole
polishing set as one batch (tested) -- and the iteration stops as soon as a pass changes no statistic by more
than `tol` (relative). Stopping early is not safe (docs/final-polishing.md: a few passes can be far worse
than the EMA).

References:
  Chan, Golub, LeVeque, "Algorithms for computing the sample variance", 1983 (pairwise merge).
  He et al. 2016 (population statistics after training); Wu & Johnson 2021, "Rethinking 'Batch' in BatchNorm".
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxsprint.train import parallel
from jaxsprint.errors import DataError, check, is_int, is_real

# config.polish.mode: "recompute" runs recompute_batch_stats after training, "no_augment_epochs" trains the last
# config.polish.no_augment_epochs epochs on un-augmented images (Fujitsu's form), "both" does both.
POLISH_MODES = ("none", "recompute", "no_augment_epochs", "both")


def validate_config(config, num_devices: int) -> None:
    """Checks ``config.polish``. Needs no data: call it before anything is read or written.

    Args:
      config: the run's config (see experiments/configs/default.py).
      num_devices: devices along ``data``; the polishing batch is sharded over them.

    Raises:
      ConfigError: naming the first bad field: an unknown ``mode``; ``num_passes`` not an integer >= 0;
        ``num_samples`` neither -1 nor an integer >= 1; ``batch_size`` neither 0 (``eval_batch_size``) nor a
        positive multiple of the devices; ``no_augment_epochs`` not a finite number >= 0.
    """
    p = config.polish
    check(p.mode in POLISH_MODES, "config.polish.mode", p.mode, f"allowed: {', '.join(POLISH_MODES)}")
    check(is_int(p.num_passes) and p.num_passes >= 0, "config.polish.num_passes", p.num_passes,
          "0 (until converged) or a positive number of passes")
    check(is_int(p.num_samples) and (p.num_samples == -1 or p.num_samples >= 1), "config.polish.num_samples",
          p.num_samples, "-1 (the whole training set) or a positive count")
    pb = p.batch_size or config.eval_batch_size
    check(is_int(p.batch_size) and p.batch_size >= 0 and is_int(pb) and pb >= 1 and pb % num_devices == 0,
          "config.polish.batch_size", p.batch_size,
          f"0 (config.eval_batch_size={config.eval_batch_size}) or a positive multiple of the device count "
          f"({num_devices})")
    e = p.no_augment_epochs
    check(is_real(e) and e >= 0,
          "config.polish.no_augment_epochs", e, "a finite number of epochs >= 0")


def merge_moments(a: tuple, b: tuple) -> tuple:
    """Chan et al.'s merge of (count, mean, M2) triples (any matching shapes; float32)."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    safe = jnp.maximum(n, 1.0)
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / safe)
    m2 = m2_a + m2_b + jnp.square(delta) * (n_a * n_b / safe)
    return n, mean, m2


def _is_triple(x) -> bool:
    return isinstance(x, tuple) and len(x) == 3 and not isinstance(x[0], (dict, tuple))


def moments_to_batch_stats(moments: Mapping) -> dict:
    """{'...': {'moments': (n, mean, M2)}} -> {'...': {'mean': mean, 'var': M2 / n}} (batch_stats layout)."""
    if "moments" in moments and _is_triple(moments["moments"]):
        n, mean, m2 = moments["moments"]
        return {"mean": mean, "var": m2 / jnp.maximum(n, 1.0)}
    return {k: moments_to_batch_stats(v) for k, v in moments.items()}


def make_moments_fn(model) -> Callable:
    """``fn(variables, images, mask) -> moments tree`` of every BatchNorm input, normalising with fixed stats."""

    def fn(variables, images, mask):
        _, sown = model.apply(variables, images, train=False, mask=mask, mutable=["bn_moments"])
        return flax.core.unfreeze(sown["bn_moments"])

    return fn


def recompute_batch_stats(model, variables: Mapping[str, Any], batches: Iterable[Mapping[str, np.ndarray]], *,
                          mesh: Mesh | None = None, num_samples: int | None = 10_000, num_passes: int = 0,
                          tol: float = 1e-6, preprocess: Callable | None = None,
                          moments_fn: Callable | None = None, info: dict | None = None) -> dict:
    """Population BatchNorm statistics of un-augmented data under the given weights (Final Polishing).

    Args:
      model: the flax model (its BatchNorm layers must be `jaxsprint.train.models.BatchNorm`).
      variables: ``{"params": ..., "batch_stats": ...}``; never modified.
      batches: an iterable (re-iterable when `num_passes` > 1, e.g. a list or a callable's result) of
        dicts with "image" ([B, ...], already preprocessed for evaluation unless `preprocess` is given) and
        optionally "mask" ([B], 1 for real examples). Every batch must have the same B (pad the last one and
        mask it); B must be divisible by the mesh size.
      mesh: shard batches along ``data`` over this mesh (None: default device placement).
      num_samples: budget in examples, >= 1 (None: every example of `batches`); the batch that crosses it is
        masked.
      num_passes: 0 (default): iterate until no statistic changes by more than `tol` (relative), at most
        number-of-BatchNorms + 1 passes, which is exact (see module docstring); k > 0: exactly k passes.
      tol: relative change that ends the iteration when `num_passes` is 0.
      preprocess: optional jittable ``images -> images`` applied on the devices (e.g. eval preprocessing).
      moments_fn: a pre-jitted `make_moments_fn` result to reuse across calls (compiles once).
      info: if a dict is given, it receives "passes" (passes run) and "change" (max relative change of the
        last pass).

    Returns:
      A new ``batch_stats`` tree with the structure of ``variables["batch_stats"]`` (float32 mean and var).

    Raises:
      ConfigError: a bad ``num_passes`` or ``num_samples``, or a model without BatchNorm statistics.
      DataError: no batches, batches of different shapes, a mask of the wrong shape, or a batch size the mesh
        cannot split.
    """
    check(is_int(num_passes) and num_passes >= 0, "num_passes", num_passes,
          "0 (until converged) or a positive number of passes")
    check(num_samples is None or (is_int(num_samples) and num_samples >= 1), "num_samples", num_samples,
          "None (every example) or a positive budget")
    check(bool(jax.tree.leaves(variables.get("batch_stats", {}))), "variables['batch_stats']",
          variables.get("batch_stats", {}), "the statistics of a model with BatchNorm: nothing to polish")
    batches = batches if isinstance(batches, (list, tuple)) else list(batches)
    check(bool(batches), "batches", batches, "at least one batch: the iterable of batches is empty",
          error=DataError)
    shape = np.shape(batches[0]["image"])
    for i, batch in enumerate(batches):
        check(np.shape(batch["image"]) == shape, f"batches[{i}]['image'].shape", np.shape(batch["image"]),
              f"{shape}, the same shape as batch 0 (pad the last batch and mask it)", error=DataError)
        if "mask" in batch:
            check(np.shape(batch["mask"]) == shape[:1], f"batches[{i}]['mask'].shape", np.shape(batch["mask"]),
                  f"{shape[:1]}, one entry per image", error=DataError)
    if mesh is not None:
        check(shape[0] % mesh.size == 0, "batches[0]['image'].shape[0]", shape[0],
              f"a multiple of the {mesh.size} devices of the mesh", error=DataError)
    if moments_fn is None:
        moments_fn = jit_moments_fn(model, mesh, preprocess)
    params = variables["params"]
    stats = variables["batch_stats"]
    merge = _jitted_merge()
    max_passes = num_passes if num_passes > 0 else len(jax.tree.leaves(stats)) // 2 + 1
    passes, change = 0, float("inf")
    # On XLA:CPU, one multi-device program in flight at a time: programs with all-reduces dispatched while
    # earlier ones were still running deadlocked its in-process collectives now and then (one device's program
    # never reached the rendezvous), also across processes. Elsewhere the batches stay pipelined.
    serial = jax.default_backend() == "cpu" and jax.device_count() > 1
    while passes < max_passes:
        total = None
        used = 0
        for batch in batches:
            images = np.asarray(batch["image"])
            mask = np.asarray(batch.get("mask", np.ones(len(images), np.float32)), np.float32)
            if num_samples is not None:
                room = num_samples - used
                if room <= 0:
                    break
                keep = np.cumsum(mask) <= room
                mask = mask * keep
            used += int(mask.sum())
            if mesh is not None:
                arrays = parallel.shard_batch({"image": images, "mask": mask}, mesh)
                images, mask = arrays["image"], arrays["mask"]
            m = moments_fn({"params": params, "batch_stats": stats}, images, mask)
            total = m if total is None else merge(total, m)
            if serial:
                total = jax.block_until_ready(total)
        total = jax.block_until_ready(total)
        new_stats = moments_to_batch_stats(total)
        change = max(jax.tree.leaves(jax.tree.map(
            lambda a, b: float(jnp.max(jnp.abs(a - b) / jnp.maximum(jnp.abs(b), 1e-12))), new_stats, stats)))
        stats = new_stats
        passes += 1
        if num_passes == 0 and change <= tol:
            break
    if info is not None:
        info.update(passes=passes, change=change)
    return jax.tree.map(lambda x: x.astype(jnp.float32), stats)


def jit_moments_fn(model, mesh: Mesh | None = None, preprocess: Callable | None = None,
                   compiler_options: dict[str, str] | None = None) -> Callable:
    """The jitted per-batch moments function (replicated outputs; batch sharded along ``data`` if `mesh`).

    ``compiler_options`` go to ``jax.jit`` (e.g. ``jaxsprint.train.cpu.acceleration(mode).compiler_options``).
    """
    base = make_moments_fn(model)
    fn = base if preprocess is None else (lambda v, x, m: base(v, preprocess(x), m))
    if mesh is None:
        return jax.jit(fn, compiler_options=compiler_options)
    rep, dat = parallel.replicated(mesh), parallel.data_sharding(mesh)
    return jax.jit(fn, in_shardings=(rep, dat, dat), out_shardings=rep, compiler_options=compiler_options)


_MERGE = None


def _jitted_merge():
    global _MERGE
    if _MERGE is None:
        _MERGE = jax.jit(lambda a, b: jax.tree.map(merge_moments, a, b, is_leaf=_is_triple))
    return _MERGE
