"""One start-up for every multi-process launch: explicit flags, srun, mpirun, JAX's own environment variables.

    from jaxsprint import cluster
    info = cluster.initialize(coordinator_address, num_processes, process_id)  # before JAX's backend starts
    # -> Info(launcher='mpirun', num_processes=2, process_id=1, coordinator_address='node0:12355')

`detect` decides from the flags and the environment alone which launch this is, the first that applies:
  1. ``flags``: a coordinator address (flag or ``JAX_COORDINATOR_ADDRESS``) with ``num_processes`` and
     ``process_id``; under srun or mpirun either may come from the ranks' environment;
  2. ``srun``: ``SLURM_NTASKS`` > 1, through JAX's SLURM detection (first node of ``SLURM_STEP_NODELIST``);
  3. ``mpirun``: ``OMPI_COMM_WORLD_SIZE`` > 1 (Open MPI), ``PMI_SIZE`` > 1 (MPICH, Intel MPI) or a bare
     ``PMIX_RANK``, through JAX's mpi4py detection (rank 0's host name, broadcast over MPI);
  4. ``jax``: ``JAX_COORDINATOR_ADDRESS`` alone; JAX's own detection finds the rest (Kubernetes, Cloud TPU);
otherwise ``single``, and `initialize` calls nothing. ``JAX_COORDINATOR_PORT`` sets the port of 2 and 3.

`initialize` resolves the rest with JAX's detection (`jax._src.clusters`: the same code
``jax.distributed.initialize`` runs, called first so that the address is known before joining), then calls
``jax.distributed.initialize`` with everything explicit, gloo CPU collectives and a bounded
``initialization_timeout``. A process other than 0 first probes the coordinator's port within the same bound:
XLA's client does not raise when it cannot register, it ends the process once the timeout passes. A process
that sees a launcher of several processes but cannot join (mpi4py missing, no srun step, coordinator
unreachable) raises `ConfigError` naming the variable and what to do: it never trains alone.
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from typing import NamedTuple

import jax

from jaxsprint.errors import ConfigError, check, is_int

__all__ = ["DEFAULT_TIMEOUT_S", "Info", "Plan", "detect", "initialize"]

DEFAULT_TIMEOUT_S = 300  # jax.distributed.initialize's own default initialization_timeout
# JAX's SlurmCluster reads all of these; sbatch's batch script has no step node list (only srun's tasks do).
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
# (launcher, variable holding the process count, variable holding this process's index, JAX's method)
_LAUNCHERS = (("srun", "SLURM_NTASKS", "SLURM_PROCID", "slurm"),
              ("mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "mpi4py"),
              ("mpirun", "PMI_SIZE", "PMI_RANK", "mpi4py"))
_METHODS = {"srun": "slurm", "mpirun": "mpi4py", "jax": None}
_EXPLICIT = "pass --coordinator_address=HOST:PORT of process 0, --num_processes and --process_id"


class Plan(NamedTuple):
    """What `detect` found: the launch and what is known before JAX's detection runs (None: it finds it)."""

    launcher: str                       # "single", "flags", "srun", "mpirun" or "jax"
    source: str                         # the flag or variable that revealed it ("" for single)
    value: str | None                   # its value, for messages
    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None


class Info(NamedTuple):
    """What `initialize` did: the launch, the processes, and the coordinator (None for a single process)."""

    launcher: str
    num_processes: int
    process_id: int
    coordinator_address: str | None


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    if name not in env:
        return None
    try:
        return int(env[name])
    except ValueError:
        raise ConfigError(name, env[name], "an integer (set by the launcher)") from None


def _launch(env: Mapping[str, str]) -> tuple[str, str, int | None, int | None]:
    """``(launcher, variable, count, index)`` of the first launcher whose variables are set (``""``: none)."""
    for name, size_var, rank_var, _ in _LAUNCHERS:
        size = _env_int(env, size_var)
        if size is not None:
            return name, size_var, size, _env_int(env, rank_var)
    if "PMIX_RANK" in env:  # a PMIx launcher that sets no count: MPI tells it
        return "mpirun", "PMIX_RANK", None, _env_int(env, "PMIX_RANK")
    return "", "", None, None


def detect(env: Mapping[str, str], coordinator_address: str | None = None, num_processes: int | None = None,
           process_id: int | None = None) -> Plan:
    """The launch of this process, from flags and environment variables only (imports and starts nothing).

    Args:
      env: the environment (``os.environ``).
      coordinator_address, num_processes, process_id: the launcher's flags (None: not given).

    Returns:
      A `Plan`; ``launcher == "single"`` for one process (also ``num_processes=1`` or a launcher of one).

    Raises:
      ConfigError: flags that do not make a launch; a launcher's variable that is not an integer; SLURM tasks
        outside an srun step.
    """
    launcher, var, size, rank = _launch(env)
    address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
    if coordinator_address is not None or num_processes is not None or process_id is not None:
        n = size if num_processes is None else num_processes
        pid = rank if process_id is None else process_id
        check(num_processes is None or (is_int(n) and n >= 1), "num_processes", n, "an integer >= 1")
        check(process_id is None or (is_int(pid) and pid >= 0), "process_id", pid, "an integer >= 0")
        check(address is not None, "coordinator_address", coordinator_address,
              "host:port of process 0, needed with num_processes and process_id")
        check(n is not None and pid is not None, "coordinator_address", address,
              "with num_processes and process_id, which no launcher in the environment gives "
              "(SLURM_NTASKS/SLURM_PROCID, OMPI_COMM_WORLD_SIZE/_RANK, PMI_SIZE/PMI_RANK)")
        check(is_int(n) and n >= 1, "num_processes", n, "an integer >= 1")
        check(is_int(pid) and 0 <= pid < n, "process_id", pid, f"an integer in [0, {n})")
        source = "coordinator_address" if coordinator_address is not None else "num_processes/process_id"
        return Plan("single" if n == 1 else "flags", source, address, address, n, pid)
    if launcher and (size is None or size > 1):
        if launcher == "srun":
            missing = [v for v in SLURM_VARS if v not in env]
            check(not missing, var, env[var], f"{size} tasks started by srun ({', '.join(missing)} unset: "
                  f"this is not an srun step; run it as `srun python ...`), or {_EXPLICIT}")
        return Plan(launcher, var, env[var], address, None, None)
    if launcher == "" and address is not None:
        return Plan("jax", "JAX_COORDINATOR_ADDRESS", address, address, None, None)
    return Plan("single", "", None, None, 1, 0)


def _import_mpi4py(plan: Plan) -> None:
    """mpi4py's MPI (MPI_Init happens here), or ConfigError naming the launcher's variable."""
    try:
        from mpi4py import MPI  # noqa: F401
    except ImportError as e:
        raise ConfigError(plan.source, plan.value, f"a launch of several processes under mpirun, which this "
                          f"process can join only through mpi4py ({type(e).__name__}: {e}): pip install "
                          f"'jaxsprint[mpi]', or {_EXPLICIT}") from None


def _resolve(plan: Plan, env: Mapping[str, str], timeout_s: int) -> tuple[str | None, int | None, int | None,
                                                                          list[int] | None]:
    """``(coordinator_address, num_processes, process_id, local_device_ids)`` as jax.distributed would find them."""
    ids = [int(i) for i in env["JAX_LOCAL_DEVICE_IDS"].split(",")] if env.get("JAX_LOCAL_DEVICE_IDS") else None
    if plan.launcher == "flags":  # explicit means explicit: no launcher restricts the visible devices
        return plan.coordinator_address, plan.num_processes, plan.process_id, ids
    if plan.launcher == "mpirun":
        _import_mpi4py(plan)
    from jax._src import clusters  # JAX's detection; not public, but what jax.distributed.initialize runs

    address, n, pid, ids = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        plan.coordinator_address, plan.num_processes, plan.process_id, ids, _METHODS[plan.launcher], timeout_s)
    return address, n, pid, (list(ids) if ids is not None else None)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, timeout_s: int = DEFAULT_TIMEOUT_S) -> Info:
    """Joins this process to its multi-process launch (see the module docstring), or does nothing for one.

    Call it before anything starts JAX's backend (``jax.devices()``, a computation).

    Args:
      coordinator_address, num_processes, process_id: the launcher's flags (None: from the environment).
      timeout_s: bound on the start-up, seconds (the port probe and JAX's ``initialization_timeout``).

    Returns:
      `Info`: the launch, the process count and this process's index.

    Raises:
      ConfigError: bad flags, or a launch of several processes this process cannot join within `timeout_s`.
    """
    check(is_int(timeout_s) and timeout_s >= 1, "timeout_s", timeout_s, "an integer >= 1 (seconds)")
    env = os.environ  # JAX's detection reads it too
    plan = detect(env, coordinator_address, num_processes, process_id)
    if plan.launcher == "single":
        return Info("single", 1, 0, None)
    if jax.distributed.is_initialized():
        raise RuntimeError("jax.distributed is already initialized; cluster.initialize runs once per process")
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("cluster.initialize must run before JAX's backend starts (jax.devices(), any "
                           "computation)")
    address, n, pid, ids = _resolve(plan, env, timeout_s)
    check(n is not None and pid is not None and address is not None, plan.source, plan.value,
          f"set, but no launcher (srun, mpirun) or JAX cluster gives the coordinator, the process count and "
          f"this process's index: {_EXPLICIT}, or unset it")
    if n == 1:
        return Info("single", 1, 0, None)
    where = (f"process 0 ({plan.source}={plan.value})" if plan.launcher == "flags" else
             f"process 0 of the {plan.launcher} launch ({plan.source}={plan.value})")
    if pid != 0:
        _wait_for_coordinator(address, timeout_s, where)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=pid,
                                   local_device_ids=ids, cluster_detection_method="deactivate",
                                   initialization_timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 (XLA raises several types; the message says what happened)
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError("coordinator_address", address, f"{where} answering, with all {n} processes joined, "
                          f"within {timeout_s} s ({type(e).__name__}: {first})") from e
    return Info(plan.launcher, n, pid, address)


def _wait_for_coordinator(address: str, timeout_s: float, where: str) -> None:
    """Waits until the coordinator's port accepts a connection, or raises ConfigError after `timeout_s`.

    (A coordinator that answers while another process never joins still ends in XLA's bounded abort.)
    """
    host, _, port = str(address).rpartition(":")
    check(bool(host) and port.isdigit(), "coordinator_address", address, "host:port")
    host = host.strip("[]")  # an IPv6 literal
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConfigError("coordinator_address", address,
                                  f"{where} reachable within {timeout_s} s (connecting failed: {e}): check that "
                                  f"process 0 runs and this host reaches it, or {_EXPLICIT}") from None
            time.sleep(0.2)
