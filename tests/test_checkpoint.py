"""jaxsprint.train.checkpoint: round trip through orbax; a checkpoint of another state or a truncated one is a
CheckpointError (what differs / which step), and resume="latest_good" falls back."""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from etils import epath

from jaxsprint.train import checkpoint, data, models, pipeline, trainer
from jaxsprint.errors import CheckpointError, ConfigError


@functools.cache
def _init_fn():
    """The jitted init of `_state`, traced and compiled once per process."""
    model = models.create_model("tiny", num_classes=10)
    tx = optax.sgd(0.1, momentum=0.9)
    return jax.jit(lambda key: trainer.create_train_state(key, model, tx, (1, 8, 8, 1)))


def _state():
    """A real TrainState as the trainer makes it: jitted, so every leaf is an array (a fresh one each call)."""
    return _init_fn()(jax.random.key(0))


def test_empty_workdir_restores_nothing(tmp_path):
    assert checkpoint.restore(checkpoint.manager(str(tmp_path)), _state()) is None


def test_state_extras_and_iterator_position_round_trip(tmp_path):
    source = data.load_digits(8).train
    state = _state()
    state = state.replace(step=jnp.asarray(5), batch_stats=jax.tree.map(lambda a: a + 1.0, state.batch_stats))
    it = pipeline.train_iterator(source, seed=3, global_batch=32, num_threads=0)
    for _ in range(4):
        next(it)
    mgr = checkpoint.manager(str(tmp_path), keep=2)
    extra = {"polished": jnp.asarray(1, jnp.int32)}
    checkpoint.save(mgr, 4, state, extra, it)
    mgr.wait_until_finished()
    expected = [next(it)["label"] for _ in range(3)]  # what the uninterrupted run reads next

    fresh_it = pipeline.train_iterator(source, seed=3, global_batch=32, num_threads=0)
    restored = checkpoint.restore(checkpoint.manager(str(tmp_path)), _state(),
                                  {"polished": jnp.zeros((), jnp.int32)}, fresh_it)
    new_state, new_extra, step = restored
    assert step == 4 and int(new_extra["polished"]) == 1 and int(new_state.step) == 5
    for a, b in zip(jax.tree.leaves(new_state.batch_stats), jax.tree.leaves(state.batch_stats)):
        np.testing.assert_array_equal(a, b)
    assert pipeline.position(fresh_it) == 4
    for want in expected:
        np.testing.assert_array_equal(next(fresh_it)["label"], want)


def _saved(tmp_path, steps=(2, 4)):
    mgr = checkpoint.manager(str(tmp_path), keep=3)
    for s in steps:
        checkpoint.save(mgr, s, _state(), {"polished": jnp.asarray(0, jnp.int32)})
    mgr.wait_until_finished()
    mgr.close()
    return tmp_path / "checkpoints"


def test_a_checkpoint_of_another_state_says_what_differs(tmp_path):
    _saved(tmp_path)
    model = models.create_model("tiny", num_classes=10)
    other = jax.jit(lambda key: trainer.create_train_state(key, model, optax.adam(0.1), (1, 8, 8, 1)))(
        jax.random.key(0))
    before = sorted(p.name for p in (tmp_path / "checkpoints").rglob("*"))
    with pytest.raises(CheckpointError, match=r"checkpoint step=4.*opt_state.*config.optimizer"):
        checkpoint.restore(checkpoint.manager(str(tmp_path)), other, {"polished": jnp.zeros((), jnp.int32)})
    assert sorted(p.name for p in (tmp_path / "checkpoints").rglob("*")) == before  # nothing written
    table = {"a": ((2,), "float32"), "b": ((3,), "float32")}
    assert checkpoint.describe_mismatch(table, dict(table)) is None
    diff = checkpoint.describe_mismatch(table, {"a": ((4,), "float32"), "c": ((1,), "int32")})
    assert "a is float32[2] there, float32[4] here" in diff and "(c)" in diff and "(b)" in diff


@pytest.mark.parametrize("victim", ["train_state/_METADATA", "train_state/manifest.ocdbt", "train_state/d"])
def test_a_truncated_checkpoint_names_its_step_and_latest_good_falls_back(tmp_path, victim):
    ckpts = _saved(tmp_path)
    target = ckpts / "4" / victim
    for f in (sorted(target.iterdir()) if target.is_dir() else [target]):
        f.write_bytes(f.read_bytes()[:len(f.read_bytes()) // 2])
    extra = {"polished": jnp.zeros((), jnp.int32)}
    with pytest.raises(CheckpointError, match=r"checkpoint step=4.*cannot be read.*latest_good"):
        checkpoint.restore(checkpoint.manager(str(tmp_path)), _state(), extra)
    mgr = checkpoint.manager(str(tmp_path))
    _, _, step = checkpoint.restore(mgr, _state(), extra, resume="latest_good")
    assert step == 2 and mgr.latest_step() == 2  # the broken step is set aside; the run can save it again
    assert os.listdir(tmp_path / "unreadable_checkpoints") == ["4"]
    with pytest.raises(ConfigError, match="config.resume"):
        checkpoint.restore(mgr, _state(), extra, resume="newest")


def test_run_directories_and_their_kvstores_local_file_uri_and_remote(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert checkpoint.directory("run") == epath.Path(tmp_path) / "run" / "checkpoints"  # made absolute
    assert checkpoint.directory(f"file://{tmp_path}/run") == epath.Path(tmp_path) / "run" / "checkpoints"
    assert checkpoint.kvstore_spec(epath.Path(tmp_path)) == {"driver": "file", "path": f"{tmp_path}/"}
    # The sequential pre-read of a remote checkpoint goes through the URI's own kvstore (not run here: no bucket).
    assert checkpoint.kvstore_spec(epath.Path("gs://bucket/run/checkpoints/4/train_state")) == {
        "driver": "gcs", "bucket": "bucket", "path": "run/checkpoints/4/train_state/"}
    assert checkpoint.kvstore_spec(epath.Path("az://container/run")) is None  # none in tensorstore: orbax alone


def test_a_file_uri_workdir_round_trips(tmp_path):
    mgr = checkpoint.manager(f"file://{tmp_path}")
    checkpoint.save(mgr, 3, _state(), {"polished": jnp.asarray(1, jnp.int32)})
    mgr.wait_until_finished()
    mgr.close()
    assert os.listdir(tmp_path / "checkpoints") == ["3"]
    _, extra, step = checkpoint.restore(checkpoint.manager(f"file://{tmp_path}"), _state(),
                                        {"polished": jnp.zeros((), jnp.int32)})
    assert step == 3 and int(extra["polished"]) == 1
