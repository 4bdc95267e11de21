"""The start-up decision of `jaxsprint.cluster` (pure), and its bounded failure on an unreachable coordinator."""
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from jaxsprint import cluster, subprocs
from jaxsprint.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SRUN = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "node[003-004]", "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}
OMPI = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "PMIX_RANK": "1"}
HYDRA = {"PMI_SIZE": "4", "PMI_RANK": "3"}


def _plan(env, *flags):
    return tuple(cluster.detect(env, *flags))


@pytest.mark.parametrize("env, flags, expected", [
    ({}, (), ("single", "", None, None, 1, 0)),
    ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, (), ("single", "", None, None, 1, 0)),
    ({"OMPI_COMM_WORLD_SIZE": "1", "PMIX_RANK": "0"}, (), ("single", "", None, None, 1, 0)),
    ({}, ("h:1", 1, 0), ("single", "coordinator_address", "h:1", "h:1", 1, 0)),
    # explicit flags win over any launcher
    (OMPI, ("h:1", 3, 2), ("flags", "coordinator_address", "h:1", "h:1", 3, 2)),
    ({}, ("h:1", 2, 1), ("flags", "coordinator_address", "h:1", "h:1", 2, 1)),
    # the coordinator alone under a launcher: count and index from the ranks' environment
    (OMPI, ("h:1",), ("flags", "coordinator_address", "h:1", "h:1", 2, 1)),
    (SRUN, ("h:1",), ("flags", "coordinator_address", "h:1", "h:1", 2, 1)),
    (HYDRA, ("h:1", None, None), ("flags", "coordinator_address", "h:1", "h:1", 4, 3)),
    ({"JAX_COORDINATOR_ADDRESS": "e:2"}, (None, 2, 0), ("flags", "num_processes/process_id", "e:2", "e:2", 2, 0)),
    # launchers: JAX's detection finds the rest (JAX_COORDINATOR_ADDRESS, if set, is the coordinator)
    (SRUN, (), ("srun", "SLURM_NTASKS", "2", None, None, None)),
    (dict(SRUN, **OMPI), (), ("srun", "SLURM_NTASKS", "2", None, None, None)),  # srun --mpi=pmix
    (OMPI, (), ("mpirun", "OMPI_COMM_WORLD_SIZE", "2", None, None, None)),
    (dict(OMPI, JAX_COORDINATOR_ADDRESS="e:2"), (), ("mpirun", "OMPI_COMM_WORLD_SIZE", "2", "e:2", None, None)),
    (HYDRA, (), ("mpirun", "PMI_SIZE", "4", None, None, None)),
    ({"PMIX_RANK": "0"}, (), ("mpirun", "PMIX_RANK", "0", None, None, None)),
    ({"JAX_COORDINATOR_ADDRESS": "e:2"}, (), ("jax", "JAX_COORDINATOR_ADDRESS", "e:2", "e:2", None, None)),
])
def test_detection_order(env, flags, expected):
    assert _plan(env, *flags) == expected


@pytest.mark.parametrize("env, flags, field, match", [
    ({}, ("h:1",), "coordinator_address", "no launcher in the environment gives"),
    ({}, (None, 2, 0), "coordinator_address", "host:port of process 0"),
    ({}, ("h:1", 2, 2), "process_id", r"\[0, 2\)"),
    ({}, ("h:1", 0, 0), "num_processes", ">= 1"),
    (OMPI, ("h:1", None, 5), "process_id", r"\[0, 2\)"),
    ({"SLURM_NTASKS": "x"}, (), "SLURM_NTASKS", "an integer"),
    # sbatch's batch script with several tasks, not started by srun: one process would train alone
    ({"SLURM_NTASKS": "4", "SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, (), "SLURM_NTASKS",
     "SLURM_STEP_NODELIST unset.*srun python"),
])
def test_flags_and_environments_that_make_no_launch_are_refused(env, flags, field, match):
    with pytest.raises(ConfigError, match=match) as e:
        cluster.detect(env, *flags)
    assert e.value.field == field


def test_a_single_process_calls_nothing(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "JAX_COORDINATOR")):
            monkeypatch.delenv(name)
    assert cluster.initialize() == cluster.Info("single", 1, 0, None)
    assert cluster.initialize("h:1", 1, 0) == cluster.Info("single", 1, 0, None)
    assert not jax.distributed.is_initialized()


def _child(code: str, env: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1", **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_unreachable_coordinator_fails_within_the_timeout():
    p = _child(f"""
        from jaxsprint import cluster
        from jaxsprint.errors import ConfigError
        try:
            cluster.initialize("127.0.0.1:{subprocs.coordinator_port()}", 2, 1, timeout_s=1)
        except ConfigError as e:
            print("CONFIG_ERROR", e)
    """, {})
    assert "CONFIG_ERROR invalid coordinator_address" in p.stdout, p.stdout + p.stderr[-2000:]
    assert "process 0 (coordinator_address=" in p.stdout and "reachable within 1 s" in p.stdout


def test_an_srun_task_whose_coordinator_never_starts_fails_naming_slurm():
    # Task 1 of a simulated srun step on 127.0.0.1 whose task 0 never runs: JAX's SLURM detection gives the
    # address (first node, JAX_COORDINATOR_PORT), the probe gives up after 1 s.
    env = dict(SRUN, SLURM_STEP_NODELIST="127.0.0.1", JAX_COORDINATOR_PORT=str(subprocs.coordinator_port()))
    p = _child("""
        from jaxsprint import cluster
        from jaxsprint.errors import ConfigError
        try:
            cluster.initialize(timeout_s=1)
        except ConfigError as e:
            print("CONFIG_ERROR", e)
    """, env)
    assert f"invalid coordinator_address='127.0.0.1:{env['JAX_COORDINATOR_PORT']}'" in p.stdout, (
        p.stdout + p.stderr[-2000:])
    assert "process 0 of the srun launch (SLURM_NTASKS=2)" in p.stdout
