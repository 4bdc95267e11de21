"""jaxsprint.checkpoint: the state, its extras and the data iterator's position round-trip through orbax."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsprint import checkpoint, data, models, pipeline, train


def _state():
    """A real TrainState as the trainer makes it: jitted, so every leaf is an array."""
    model = models.create_model("tiny", num_classes=10)
    tx = optax.sgd(0.1, momentum=0.9)
    return jax.jit(lambda key: train.create_train_state(key, model, tx, (1, 8, 8, 1)))(jax.random.key(0))


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
