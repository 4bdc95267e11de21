"""A SPRINT run's checkpoint is the trainer's layout: the trainer's restore reads its whole state, and
`checkpoint.restore_variables` its weights and statistics; experiments/polish.py polishes a finished
experiments/run_sprint.py run; two SPRINT processes save one checkpoint from process 0."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxsprint import runtime, subprocs
from jaxsprint.errors import CheckpointError
from jaxsprint.train import checkpoint, trainer
from tests.test_run import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPRINT = os.path.join(ROOT, "experiments", "configs", "sprint.py")


def _config(**sprint):
    c = tiny_config(checkpoint=True, **sprint)
    c.eval_batch_size = 256  # the trainer's evaluation shards it over 8 devices
    return c


def test_a_sprint_checkpoint_restores_as_a_trainer_state_and_as_variables(tmp_path):
    c = _config(num_updates=6)
    c.polish.mode, c.polish.num_samples = "recompute", 200
    r = runtime.run(c, f"file://{tmp_path}")  # a URI: written through epath
    assert sorted(os.listdir(tmp_path)) == ["checkpoints", "events.npz", "summary.json"]
    assert json.loads((tmp_path / "summary.json").read_text())["updates"] == r.updates == 6

    exp = trainer.build_experiment(c)  # the SPRINT config builds the trainer's model and optimizer
    template = exp.init_state()
    # The whole state, as the trainer restores its own checkpoints (every path, shape and dtype must match).
    state, extra, step = checkpoint.restore(checkpoint.manager(tmp_path), template,
                                            trainer._checkpoint_extras(exp, template))
    assert step == int(state.step) == r.updates
    assert ravel_pytree(jax.device_get(state.params))[0].tobytes() == r.params_flat.tobytes()
    np.testing.assert_array_equal(ravel_pytree(jax.device_get(state.batch_stats))[0], r.batch_stats_flat)
    assert int(extra["polished"]) == 1  # the run polished: its recomputed statistics beside the EMA ones
    assert not np.array_equal(ravel_pytree(jax.device_get(extra["polished_batch_stats"]))[0], r.batch_stats_flat)
    # Momentum SGD counted one optimizer step per non-empty update.
    counts = [int(a) for p, a in checkpoint.named_leaves(jax.device_get(state.opt_state)) if p.endswith("count")]
    assert counts and set(counts) == {int(np.sum(r.events["update_count"] > 0))}

    variables = {"params": template.params, "batch_stats": template.batch_stats}
    params, stats, step = checkpoint.restore_variables(str(tmp_path), variables)
    assert step == r.updates
    assert ravel_pytree(jax.device_get(params))[0].tobytes() == r.params_flat.tobytes()
    np.testing.assert_array_equal(ravel_pytree(jax.device_get(stats))[0], r.batch_stats_flat)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(template.params)):
        assert got.sharding == want.sharding  # the template's shardings

    wider = jax.tree.map(lambda a: a, variables)
    kernel = wider["params"]["Dense_0"]["kernel"]
    wider["params"]["Dense_0"]["kernel"] = jax.ShapeDtypeStruct((kernel.shape[0] + 1,) + kernel.shape[1:],
                                                                kernel.dtype, sharding=kernel.sharding)
    with pytest.raises(CheckpointError, match=r"checkpoint step=6.*state/params/Dense_0/kernel.*config.model"):
        checkpoint.restore_variables(tmp_path, wider)
    assert checkpoint.restore_variables(tmp_path / "elsewhere", variables) is None


def test_restore_variables_falls_back_past_an_unreadable_step_without_moving_it(tmp_path):
    # Two trainer-layout steps (saved by the runtime's one-process writer), the newer one truncated.
    c = _config(num_updates=2)
    exp = trainer.build_experiment(c)
    state = exp.init_state()
    extra = trainer._checkpoint_extras(exp, state)
    for step in (1, 2):
        checkpoint.save_from_this_process(tmp_path, step, state.replace(step=step), extra, keep=2)
    victim = tmp_path / "checkpoints" / "2" / "train_state" / "manifest.ocdbt"
    victim.write_bytes(victim.read_bytes()[:10])
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    with pytest.raises(CheckpointError, match=r"checkpoint step=2.*cannot be read.*latest_good"):
        checkpoint.restore_variables(tmp_path, variables)
    _, _, step = checkpoint.restore_variables(tmp_path, variables, resume="latest_good")
    assert step == 1 and sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]  # read-only: nothing moved


def _launch(script, *args, timeout=300):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", script), f"--config={SPRINT}", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.slow
def test_polishes_a_finished_run_sprint_workdir(tmp_path):
    r = _launch("run_sprint.py", f"--workdir={tmp_path}", "--config.sprint.duration_s=2",
                "--config.sprint.warmup_s=0.5", "--nospecs")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    checkpoints = sorted(p.relative_to(tmp_path) for p in (tmp_path / "checkpoints").rglob("*"))
    r = _launch("polish.py", f"--workdir={tmp_path}", "--config.polish.num_samples=256")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "eval top-1, polished statistics" in r.stdout
    result = json.loads((tmp_path / "polish.json").read_text())
    assert result["step"] == summary["updates"] and result["num_passes"] >= 1
    # The EMA statistics are those the SPRINT updater published: the run's own evaluation of them, on one
    # device, agrees with the trainer's over 8 (summed in another order: one example may tip either way).
    num_test = 297  # digits' test split
    assert abs(result["ema_accuracy"] - summary["eval"]["accuracy"]) <= 1 / num_test + 1e-12
    assert result["ema_loss"] == pytest.approx(summary["eval"]["loss"], rel=1e-4)
    assert 0.0 <= result["polished_accuracy"] <= 1.0 and (tmp_path / "polished_batch_stats").is_dir()
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "checkpoints").rglob("*")) == checkpoints


_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    from jaxsprint import cluster, runtime
    port, rank, workdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cluster.initialize(f"127.0.0.1:{port}", 2, rank, timeout_s=60)
    from tests.test_polish_sprint import _config
    r = runtime.run(_config(num_updates=6, network_time_s=0.01), workdir)
    np.save(f"{workdir}/params_{rank}.npy", r.params_flat)
    print("DONE", r.updates, flush=True)
""")


@pytest.mark.slow
def test_two_sprint_processes_save_one_checkpoint_from_process_0(tmp_path):
    port = subprocs.coordinator_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocs.run_together([[sys.executable, "-c", _WORKER, str(port), str(rank), str(tmp_path)]
                                  for rank in range(2)], env=env, cwd=ROOT, timeout_s=300)
    for f in done:
        assert f.returncode == 0 and "DONE 6" in f.stdout, f.stdout + f.stderr[-3000:]
    assert os.listdir(tmp_path / "checkpoints") == ["6"]
    c = _config()
    exp = trainer.build_experiment(c)
    state = exp.init_state()
    params, _, step = checkpoint.restore_variables(tmp_path, {"params": state.params,
                                                              "batch_stats": state.batch_stats})
    assert step == 6
    assert ravel_pytree(jax.device_get(params))[0].tobytes() == np.load(tmp_path / "params_0.npy").tobytes()
