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
"""
from __future__ import annotations

import os
import random
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


class Hung(subprocess.TimeoutExpired):
    """:func:`run_together`'s timeout: a ``TimeoutExpired`` whose message also holds every process's stderr tail.

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
        killed first; its ``output``, and its message, hold the stderr tails of every process).
    """
    procs: list[tuple[subprocess.Popen, object, object]] = []
    try:
        for cmd in cmds:
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            procs.append((subprocess.Popen(list(cmd), cwd=cwd, env=None if env is None else dict(env), stdout=out,
                                           stderr=err, text=True), out, err))
        deadline = time.monotonic() + float(timeout_s)
        timed_out = False
        for p, _, _ in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            for p, _, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            tails = "\n".join(f"[process {i}] " + _read(err)[-2000:] for i, (_, _, err) in enumerate(procs))
            raise Hung([str(c) for c in cmds[0]], timeout_s, output=tails)
        return [Finished(p.returncode, _read(out), _read(err)) for p, out, err in procs]
    finally:
        for p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()


def _read(f) -> str:
    f.flush()
    f.seek(0)
    return f.read()
