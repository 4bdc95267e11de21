"""Several processes that must run together (one per emulated host), each output drained, all bounded by one timeout.

    from jaxsprint import subprocs
    done = subprocs.run_together([[sys.executable, "-c", code, "0"], [sys.executable, "-c", code, "1"]],
                                 env=env, timeout_s=300)
    # -> [Finished(returncode, stdout, stderr), ...] in the order given

Why not ``Popen(stdout=PIPE)`` and ``communicate()`` on each in turn: while the caller waits on the first
process, nobody reads the second's pipes, and once a pipe's buffer (64 KiB on Linux) is full the second blocks in
``write``. Processes that meet in a collective then wait for each other until the timeout: a hang that appears
only when something (a loaded machine's warnings, a long log) makes a process write more. Here every process
writes to its own temporary file, which never blocks.

At the deadline every process still running gets ``SIGABRT`` first: the environment given to the processes sets
``PYTHONFAULTHANDLER=1``, so a Python process writes the stack of every one of its threads to stderr before it
dies, and the `Hung` error carries those stacks (where each process waited), not only what it had logged.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["Finished", "Hung", "coordinator_port", "run_together"]


_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ephemeral ports (Linux's file; 32768-60999, its default, elsewhere)."""
    try:
        with open(_EPHEMERAL_RANGE_FILE) as fh:
            lo, hi = (int(v) for v in fh.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def coordinator_port(host: str = "127.0.0.1", *, attempts: int = 200, rng: random.Random | None = None) -> int:
    """A free TCP port for a ``jax.distributed`` coordinator, chosen BELOW the kernel's ephemeral range.

    The usual trick, binding port 0 and closing the socket, hands out a port from the ephemeral range, the
    one the kernel also gives every outgoing connection. Between the close and the coordinator's own bind,
    another process's connection (gloo opens many; so does every other coordinator's client) can take it;
    the coordinator then fails to bind, and a peer that probes the port may reach the wrong service and wait
    for ever. Ports below the range are never handed out to connections, so only another caller of this
    function could pick the same one, at random among about 20,000, and the bind below rules out one in use.

    Raises:
      OSError: no free port in `attempts` random tries.
    """
    lo, _ = _ephemeral_range()
    top = max(lo, _LOWEST_PORT + 1000)
    rng = rng or random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(int(attempts)):
        port = rng.randrange(_LOWEST_PORT, top)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port in [{_LOWEST_PORT}, {top}) on {host} after {attempts} tries")


_DUMP_GRACE_S = 10.0  # how long a process aborted at the deadline may take to write its stacks
_TAIL_CHARS = 6000  # of each process's stderr in a Hung message: the stacks of a few threads


class Hung(subprocess.TimeoutExpired):
    """:func:`run_together`'s timeout: a ``TimeoutExpired`` whose message also holds every process's stderr tail
    (for a Python process, ending in the stacks of its threads at the deadline).

    A plain ``TimeoutExpired`` prints only the first command, so a test or launcher that lets it propagate
    shows nothing of where each process was when the deadline came.
    """

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr tails:\n{self.output}"


class Finished(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_together(cmds: Sequence[Sequence[str]], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                 timeout_s: float) -> list[Finished]:
    """Starts every command, waits for all of them within ``timeout_s`` in total, returns their outputs.

    Raises:
      Hung: a ``subprocess.TimeoutExpired``: some process was still running at the deadline (all that were are
        aborted, so that Python processes write their threads' stacks, then killed; its ``output``, and its
        message, hold the stderr tails of every process).
    """
    procs: list[tuple[subprocess.Popen, object, object]] = []
    env = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    try:
        for cmd in cmds:
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            procs.append((subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=out, stderr=err, text=True), out,
                          err))
        deadline = time.monotonic() + float(timeout_s)
        timed_out = False
        for p, _, _ in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            _abort_then_kill([p for p, _, _ in procs if p.poll() is None])
            tails = "\n".join(f"[process {i}] " + _without_module_lists(_read(err))[-_TAIL_CHARS:]
                              for i, (_, _, err) in enumerate(procs))
            raise Hung([str(c) for c in cmds[0]], timeout_s, output=tails)
        return [Finished(p.returncode, _read(out), _read(err)) for p, out, err in procs]
    finally:
        for p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()


def _abort_then_kill(live: list[subprocess.Popen]) -> None:
    """SIGABRT to every process (faulthandler writes its stacks), up to `_DUMP_GRACE_S` to die, then SIGKILL."""
    for p in live:
        try:
            p.send_signal(signal.SIGABRT)
        except OSError:  # already gone
            pass
    end = time.monotonic() + _DUMP_GRACE_S
    for p in live:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _without_module_lists(text: str) -> str:
    """Drops faulthandler's "Extension modules: ..." line (a few KiB naming every loaded module), which would
    push the stacks out of the tail."""
    return "\n".join(line for line in text.split("\n") if not line.startswith("Extension modules:"))


def _read(f) -> str:
    f.flush()
    f.seek(0)
    return f.read()
