"""Input pipelines on grain: which examples every host reads, in which order, read ahead of the step.

Training order (`train_index_batches`, `train_iterator`). With n training examples, global batch B and P
hosts (b = B / P per host), epoch e is a permutation of 0..n-1 (grain's ``index_shuffle``, a Feistel-network
bijection, seeded with ``h(seed) + e``, where ``h`` spreads neighbouring run seeds apart) cut into
S = n // B global batches; the last n - S B examples of the permutation are dropped in that epoch (other
ones in the next). Global step k is batch k mod S of epoch k // S; host p reads its contiguous part
[p b, (p + 1) b) of it. Hence:

  * every global batch is full and holds distinct examples; an epoch is exactly ``steps_per_epoch = n // B``
    steps, as the schedules count it;
  * the hosts' parts of a global batch are disjoint and together are exactly what one host would read
    with the same seed and B, so a multi-host run trains on the same batches as a single-host one;
  * the order depends on (seed, n, B) only: not on the host count, the reader threads or worker processes.

In grain terms: ``MapDataset.range(n).shuffle(seed)[:S B].repeat().batch(b)[p::P].map(read)``, then
``to_iter_dataset`` (reader threads, prefetch) and optionally ``mp_prefetch``; the elements are whole host
batches, so worker processes never change a batch's composition. (``grain.DataLoader`` with
``ShardByJaxProcess`` would give each host a fixed 1/P of the dataset and batch within each worker.)

Evaluation and polishing (`eval_iterator`): one pass over a split (or a given index subset) in order, the
last global batch padded with mask 0 so that sums over the split count every example exactly once; grain
reads it in a background thread. The index arithmetic there is a few lines; grain adds the read-ahead.

Checkpointing: the training iterator's state is its position (``{"next_index": steps read}`` without
worker processes). `checkpoint_args` / `restore_args` give the orbax arguments of grain's handler, for an
item of ``ocp.args.Composite`` next to the train state (one JSON file per host). Because the order is a
function of the step, ``train_iterator(..., start_step=s)`` reproduces the restored iterator exactly.
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol

import grain
import numpy as np

from jaxsprint.errors import ConfigError, check

__all__ = ["RandomAccessSource", "checkpoint_args", "eval_iterator", "polish_indices", "position",
           "restore_args", "train_index_batches", "train_iterator"]


class RandomAccessSource(Protocol):
    """What the pipelines read: ``len`` and a batched gather (`jaxsprint.train.data.ArraySource`, ``TfdsSource``)."""

    def __len__(self) -> int: ...

    def get_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]: ...


def _hosts(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    check(process_count >= 1, "process_count", process_count, "must be >= 1")
    check(0 <= process_index < process_count, "process_index", process_index,
          f"must be in [0, process_count={process_count})")
    return process_index, process_count


def _shuffle_seed(seed: int) -> int:
    # grain reseeds epoch e with (seed + e) mod 2^32; hashing the run seed first keeps the epoch orders of
    # runs with neighbouring seeds (0, 1, 2 ... in a study) unrelated instead of shifted copies of each other.
    check(isinstance(seed, (int, np.integer)) and seed >= 0, "seed", seed, "must be an integer >= 0")
    return int(np.random.SeedSequence(int(seed)).generate_state(1, np.uint32)[0])


def train_index_batches(num_examples: int, *, seed: int, global_batch: int, process_index: int | None = None,
                        process_count: int | None = None, shuffle: bool = True) -> grain.MapDataset:
    """This host's training indices: element k is an int64 array [global_batch / process_count].

    Element k is host p's part [p b, (p + 1) b) of global batch k mod S of epoch k // S, S = n // B (see the
    module docstring; B = `global_batch`, p = `process_index`, b = B / process_count). Endless.

    Args:
      num_examples: size n of the training split.
      seed: run seed (>= 0); the order is a function of (seed, n, B) only.
      global_batch: B, divisible by the process count.
      process_index, process_count: this host and the host count (default: jax's).
      shuffle: False reads 0..n-1 in order, epoch after epoch.

    Raises:
      ConfigError: B < 1, B > n, B not divisible by the process count, or a bad seed or host index.
    """
    p, count = _hosts(process_index, process_count)
    check(global_batch >= 1 and global_batch % count == 0, "global_batch", global_batch,
          f"must be a positive multiple of the process count ({count})")
    check(global_batch <= num_examples, "global_batch", global_batch,
          f"must be at most the size of the training split ({num_examples})")
    ds = grain.MapDataset.range(num_examples)
    if shuffle:
        ds = ds.shuffle(seed=_shuffle_seed(seed))  # reshuffles every epoch (index // n) with seed + epoch
    else:
        _shuffle_seed(seed)  # same argument check either way
    per_epoch = (num_examples // global_batch) * global_batch
    # Slicing maps position j to parent index (j // per_epoch) n + j % per_epoch, so epoch e keeps reading
    # permutation e and drops its tail; repeat() makes the dataset endless.
    return ds[:per_epoch].repeat().batch(global_batch // count)[p::count]


class _Read:
    """Gathers one host batch from `source` (a class, not a lambda, so worker processes can pickle it)."""

    def __init__(self, source: RandomAccessSource):
        self._source = source

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        batch = self._source.get_batch(np.asarray(indices))
        return {"image": np.asarray(batch["image"], np.uint8), "label": np.asarray(batch["label"], np.int32)}


def _ensure_absl_flags_parsed() -> None:
    # grain's worker processes read grain's absl flags; outside an absl app (a notebook, a test) nothing has
    # parsed them and the first read fails. Parsing no arguments sets every flag to its default.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["jaxsprint"], known_only=True)


def train_iterator(source: RandomAccessSource, *, seed: int, global_batch: int, process_index: int | None = None,
                   process_count: int | None = None, start_step: int = 0, shuffle: bool = True,
                   num_threads: int = 2, prefetch: int = 2, num_workers: int = 0) -> grain.DatasetIterator:
    """Endless iterator of this host's training batches ``{"image": uint8 [b, H, W, C], "label": int32 [b]}``.

    Batch k is `train_index_batches` element k read from `source` (see the module docstring for the order
    and its guarantees); b = global_batch / process_count. The iterator has grain's ``get_state`` /
    ``set_state`` and checkpoints with `checkpoint_args` / `restore_args`.

    Args:
      source: the training split.
      seed, global_batch, process_index, process_count, shuffle: as in `train_index_batches`.
      start_step: the first batch to read (resuming at step s without an iterator checkpoint gives the
        same batches as restoring one).
      num_threads: reader threads in this process (0: read in the caller's thread, no read-ahead).
      prefetch: host batches read ahead by those threads.
      num_workers: worker processes (0: none); each reads whole batches, the order does not change. A state
        saved with workers restores into an iterator with the same number of workers.

    Raises:
      ConfigError: see `train_index_batches`; negative start_step, threads, prefetch or workers.
    """
    check(start_step >= 0, "start_step", start_step, "must be >= 0")
    check(num_threads >= 0 and prefetch >= 0, "num_threads/prefetch", (num_threads, prefetch), "must be >= 0")
    check(num_workers >= 0, "num_workers", num_workers, "must be >= 0")
    indices = train_index_batches(len(source), seed=seed, global_batch=global_batch, process_index=process_index,
                                  process_count=process_count, shuffle=shuffle)
    ds = indices.map(_Read(source)).to_iter_dataset(
        grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch))
    if num_workers:
        _ensure_absl_flags_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers,
                                                         per_worker_buffer_size=max(prefetch, 1)))
    it = iter(ds)
    if start_step:
        grain.experimental.set_next_index(it, int(start_step))
    return it


def position(iterator: grain.DatasetIterator) -> int:
    """How many batches `iterator` has yielded since batch 0 (the step it will serve next)."""
    return int(grain.experimental.get_next_index(iterator))


class _EvalBatch:
    """Global batch k of an in-order pass: this host's part of the padded indices, read, with the mask."""

    def __init__(self, source: RandomAccessSource, order: np.ndarray, global_batch: int, p: int, count: int):
        self._source, self._order = source, order
        self._global_batch, self._p, self._local = global_batch, p, global_batch // count

    def __call__(self, k: int) -> dict[str, np.ndarray]:
        lo = k * self._global_batch + self._p * self._local
        part = self._order[lo:lo + self._local]
        mask = np.zeros(self._local, np.float32)
        mask[:len(part)] = 1.0
        # Padding repeats the pass's first example; its mask is 0, so it never counts.
        idx = np.concatenate([part, np.full(self._local - len(part), self._order[0], self._order.dtype)])
        batch = self._source.get_batch(idx)
        return {"image": np.asarray(batch["image"], np.uint8), "label": np.asarray(batch["label"], np.int32),
                "mask": mask}


def eval_iterator(source: RandomAccessSource, *, global_batch: int, indices: np.ndarray | None = None,
                  process_index: int | None = None, process_count: int | None = None, num_threads: int = 1,
                  prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
    """One in-order pass over `source` (or `indices` of it) as host batches with a mask.

    Yields ``{"image": uint8 [b, ...], "label": int32 [b], "mask": float32 [b]}`` with b = global_batch /
    process_count: ceil(m / global_batch) global batches over the m examples, the last one padded with
    mask 0, hosts taking contiguous parts, so masked sums over all hosts and batches count every example
    exactly once.

    Args:
      source: the split to read.
      global_batch: examples per global batch (a multiple of the process count).
      indices: the examples to read, in this order (default: all of `source`).
      process_index, process_count: this host and the host count (default: jax's).
      num_threads, prefetch: reader threads and batches read ahead.

    Raises:
      ConfigError: empty pass, or a batch size that the hosts cannot share.
    """
    p, count = _hosts(process_index, process_count)
    order = np.arange(len(source)) if indices is None else np.asarray(indices, np.int64)
    check(len(order) >= 1, "indices", len(order), "an evaluation pass needs at least one example")
    check(global_batch >= 1 and global_batch % count == 0, "global_batch", global_batch,
          f"must be a positive multiple of the process count ({count})")
    num_batches = -(-len(order) // global_batch)
    ds = grain.MapDataset.range(num_batches).map(_EvalBatch(source, order, global_batch, p, count))
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)))


def polish_indices(seed: int, num_examples: int, num_samples: int) -> np.ndarray:
    """The fixed random subset of the training split that Final Polishing reads (all of it when < 0).

    A function of (seed, n) only, and the same subset as before the pipeline moved to grain.
    """
    if num_samples == 0 or num_samples < -1:
        raise ConfigError("config.polish.num_samples", num_samples, "-1 (all) or a positive count")
    count = num_examples if num_samples < 0 else min(num_samples, num_examples)
    return np.random.default_rng([seed, 10**6]).permutation(num_examples)[:count]


def checkpoint_args(iterator: grain.DatasetIterator) -> Any:
    """The orbax save argument of `iterator`, for one item of ``ocp.args.Composite``.

    Example::

        manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(tree), train_iterator=pipeline.checkpoint_args(it)))

    Every host writes its own ``process_<i>-of-<n>.json`` (grain's ``CheckpointHandler``).
    """
    return grain.checkpoint.CheckpointSave(iterator)


def restore_args(iterator: grain.DatasetIterator) -> Any:
    """The orbax restore argument that sets `iterator` (made with the same arguments) to the saved state.

    Example::

        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), train_iterator=pipeline.restore_args(it)))
        # `it` now continues where the saved iterator stopped (restored["train_iterator"] is `it`).
    """
    return grain.checkpoint.CheckpointRestore(iterator)
