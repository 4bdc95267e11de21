"""Multi-process training under jax.distributed on loopback equals the single-process run.

Each case starts real processes (a small driver joined by `jaxsprint.cluster.initialize` with explicit
flags, calling `trainer.train_and_evaluate`, gloo CPU collectives, a free 127.0.0.1 port), bounded by timeouts and killed (`jaxsprint.subprocs`). Process 0 writes the final
parameters, BN statistics and optimizer state to an .npz; they are compared with a one-process run on as
many devices (same config and seed). Resuming the two-process run from a checkpoint written by both
processes ends in the same state.
"""
import json
import os
import sys

import jax
import numpy as np
import pytest

from jaxsprint import subprocs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One process of a run: argv[1] is a JSON dict (process_id, num_processes, port, workdir, out, overrides,
# stop_after_steps). Writes the final state (process 0) as named arrays to `out`.
_DRIVER = """
import json, os, sys
args = json.loads(sys.argv[1])
sys.path.insert(0, os.getcwd())
import jax
import numpy as np
from jaxsprint import cluster
from jaxsprint.train import checkpoint, trainer
from experiments.configs import testing
cluster.initialize(f"127.0.0.1:{args['port']}", args["num_processes"], args["process_id"], timeout_s=120)
config = testing.get_config()
for key, value in args["overrides"].items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
out = trainer.train_and_evaluate(config, args["workdir"], stop_after_steps=args["stop_after_steps"])
s = out["state"]
tree = {"params": s.params, "batch_stats": s.batch_stats, "opt_state": s.opt_state, "step": s.step,
        "polished": out["polished_batch_stats"]}
arrays = {name: np.asarray(jax.device_get(leaf)) for name, leaf in checkpoint.named_leaves(tree)}
if jax.process_index() == 0 and args["out"]:
    np.savez(args["out"], **arrays)
print("DONE", jax.process_count(), jax.device_count(), out["steps"], flush=True)
"""

# The cheap case: two processes save a replicated state, its extras and their data iterators with
# `jaxsprint.train.checkpoint`, then restore them in fresh templates (no training, nothing to compile but copies).
_CHECKPOINT_DRIVER = """
import json, os, sys
args = json.loads(sys.argv[1])
sys.path.insert(0, os.getcwd())
import jax, jax.numpy as jnp, numpy as np
from jaxsprint import cluster
from jaxsprint.errors import ConfigError
from jaxsprint.train import checkpoint, data, parallel, pipeline
info = cluster.initialize(f"127.0.0.1:{args['port']}", args["num_processes"], args["process_id"], timeout_s=120)
assert info == ("flags", 2, args["process_id"], f"127.0.0.1:{args['port']}"), info
try:  # one device cannot be shared by two processes
    parallel.make_mesh(1)
except ConfigError as e:
    assert e.field == "config.num_devices" and "multiple of the process count (2)" in str(e), e
else:
    raise AssertionError("a mesh of 1 device over 2 processes")
mesh = parallel.make_mesh(-1)
assert [d.process_index for d in mesh.devices] == [0, 1], mesh.devices
rep = parallel.replicated(mesh)
def state(scale):
    return jax.jit(lambda: {"w": scale * jnp.arange(6.0).reshape(2, 3), "step": jnp.asarray(7)},
                   out_shardings=rep)()
source = data.load_digits(8).train
it = pipeline.train_iterator(source, seed=1, global_batch=16, num_threads=0)
for _ in range(3):
    next(it)
try:
    checkpoint.save(checkpoint.manager(args["workdir"]), 3, {"host_local": jnp.ones(2)})
except ValueError as e:
    assert "host_local" in str(e) and "global arrays" in str(e), e
else:
    raise AssertionError("a host-local leaf was saved in a multi-process checkpoint")
mgr = checkpoint.manager(args["workdir"])
checkpoint.save(mgr, 3, state(2.0), {"flag": jax.jit(lambda: jnp.asarray(1), out_shardings=rep)()}, it)
mgr.wait_until_finished()
mgr.close()
expected = next(it)["label"]
fresh = pipeline.train_iterator(source, seed=1, global_batch=16, num_threads=0)
mgr = checkpoint.manager(args["workdir"])
restored, extra, step = checkpoint.restore(
    mgr, state(0.0), {"flag": jax.jit(lambda: jnp.asarray(0), out_shardings=rep)()}, fresh)
assert step == 3 and int(extra["flag"]) == 1 and int(restored["step"]) == 7
assert restored["w"].sharding.is_equivalent_to(rep, 2) and not restored["w"].is_fully_addressable
np.testing.assert_array_equal(np.asarray(restored["w"]), 2.0 * np.arange(6.0).reshape(2, 3))
np.testing.assert_array_equal(next(fresh)["label"], expected)
mgr.close()
print("DONE", jax.process_count(), jax.device_count(), flush=True)
"""

# Checkpoints at steps 2 and 4 (testing: 23 steps per epoch), 6 steps, evaluation every 2.
# Final Polishing after the last step, so that the recomputed statistics are compared too.
_OVERRIDES = {"checkpoint_every_epochs": 0.087, "polish.mode": "recompute"}


def _run(num_processes: int, devices_per_process: int, workdir, out=None, *, stop_after_steps=None,
         overrides=None, timeout=420, driver=_DRIVER):
    """Runs one training job in `num_processes` processes; returns their (returncode, stdout, stderr)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}")
    port = subprocs.coordinator_port()
    cmds = [[sys.executable, "-c", driver, json.dumps(dict(
        process_id=pid, num_processes=num_processes, port=port, workdir=str(workdir),
        out=str(out) if out else None, stop_after_steps=stop_after_steps,
        overrides=dict(_OVERRIDES, **(overrides or {}))))] for pid in range(num_processes)]
    # Every process's output drained to a file: with pipes read one after the other, a process that fills its
    # pipe blocks in a write while the others wait for it in a collective (a hang seen only under load).
    done = subprocs.run_together(cmds, env=env, cwd=ROOT, timeout_s=timeout)
    results = [((f.stdout, f.stderr), f.returncode) for f in done]
    for (stdout, stderr), rc in results:
        assert rc == 0, stderr[-4000:]
        assert f"DONE {num_processes} {num_processes * devices_per_process}" in stdout
    return results


def _load(path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _assert_close(a: dict, b: dict, rtol=1e-5, atol=1e-6):
    assert sorted(a) == sorted(b)
    for group in ("params/", "batch_stats/", "opt_state/", "polished/"):
        assert any(k.startswith(group) for k in a), group
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=k)


def _in_process_reference(num_devices: int, workdir) -> dict[str, np.ndarray]:
    from experiments.configs import testing
    from jaxsprint.train import checkpoint, trainer

    config = testing.get_config()
    config.checkpoint_every_epochs = _OVERRIDES["checkpoint_every_epochs"]
    config.num_devices = num_devices
    config.polish.mode = _OVERRIDES["polish.mode"]
    out = trainer.train_and_evaluate(config, str(workdir))
    s = out["state"]
    tree = {"params": s.params, "batch_stats": s.batch_stats, "opt_state": s.opt_state, "step": s.step,
            "polished": out["polished_batch_stats"]}
    return {name: np.asarray(jax.device_get(leaf)) for name, leaf in checkpoint.named_leaves(tree)}


def _check_shared_files(multi, single):
    """Only process 0 wrote the metrics and the summary; every host's iterator position is checkpointed."""
    assert (multi / "summary.json").exists()
    lines = (multi / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len((single / "metrics.jsonl").read_text().splitlines())
    steps = sorted(int(d) for d in os.listdir(multi / "checkpoints"))
    assert steps == [4, 6]
    assert sorted(os.listdir(multi / "checkpoints" / "4" / "train_iterator")) == [
        "commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]
    assert not [p for p in multi.rglob("*") if "orbax-checkpoint-tmp" in p.name]


def test_a_checkpoint_written_by_two_processes_restores_in_two_processes(tmp_path):
    _run(2, 1, tmp_path / "w", driver=_CHECKPOINT_DRIVER, timeout=180)
    files = sorted(os.listdir(tmp_path / "w" / "checkpoints" / "3" / "train_iterator"))
    assert files == ["commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]


@pytest.mark.slow
@pytest.mark.devices(2)
def test_two_processes_of_one_device_equal_one_process_of_two_and_resume(tmp_path):
    _run(2, 1, tmp_path / "multi", tmp_path / "multi.npz")
    multi = _load(tmp_path / "multi.npz")
    _assert_close(multi, _in_process_reference(2, tmp_path / "single"))
    _check_shared_files(tmp_path / "multi", tmp_path / "single")
    # Interrupted after step 3 (checkpointed there by both processes), then resumed by two new processes.
    _run(2, 1, tmp_path / "split", stop_after_steps=3)
    assert sorted(int(d) for d in os.listdir(tmp_path / "split" / "checkpoints")) == [2, 3]
    results = _run(2, 1, tmp_path / "split", tmp_path / "resumed.npz")
    assert "resumed from the checkpoint at step 3" in results[0][0][0]
    # The same program on the same processes: bit-identical, not only within rounding.
    _assert_close(_load(tmp_path / "resumed.npz"), multi, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.devices(8)
def test_two_processes_of_four_devices_equal_one_process_of_eight(tmp_path):
    _run(2, 4, tmp_path / "multi", tmp_path / "multi.npz")
    single = _in_process_reference(8, tmp_path / "single")
    _assert_close(_load(tmp_path / "multi.npz"), single)
    _check_shared_files(tmp_path / "multi", tmp_path / "single")
