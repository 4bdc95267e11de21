"""Tests of jaxsprint.subprocs: processes that wait for each other finish even when one writes more than a pipe
holds, outputs come back whole, and the timeout kills every process."""
import socket
import subprocess
import sys
import time

import pytest

from jaxsprint import subprocs

# Process 0 waits for the file process 1 creates only after writing 1 MiB to stdout: with pipes drained one
# process after the other, process 1 blocks in its write (the pipe holds 64 KiB) and both wait forever.
_WAITER = "import os, sys, time\nt = time.time()\nwhile not os.path.exists(sys.argv[1]):\n" \
          "    time.sleep(0.01)\n    if time.time() - t > 30: sys.exit(3)\nprint('waited')"
_WRITER = "import sys\nsys.stdout.write('x' * (1 << 20))\nsys.stdout.flush()\nopen(sys.argv[1], 'w').close()"


def test_a_process_that_fills_its_pipe_does_not_stall_the_others(tmp_path):
    flag = str(tmp_path / "flag")
    t0 = time.monotonic()
    done = subprocs.run_together([[sys.executable, "-c", _WAITER, flag], [sys.executable, "-c", _WRITER, flag]],
                                 timeout_s=60)
    assert time.monotonic() - t0 < 30  # not the waiter's own 30 s bound
    assert [f.returncode for f in done] == [0, 0]
    assert done[0].stdout.strip() == "waited" and done[1].stdout == "x" * (1 << 20)


def test_the_timeout_kills_every_process_and_reports_their_stderr_and_stacks():
    code = "import sys, time\nprint('started', file=sys.stderr, flush=True)\ntime.sleep(60)"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        subprocs.run_together([[sys.executable, "-c", code]] * 2, timeout_s=3)
    assert time.monotonic() - t0 < 30
    assert e.value.output.count("started") == 2
    # Each process, aborted at the deadline, wrote where it was waiting: line 3 of its program, the sleep.
    assert e.value.output.count("Fatal Python error: Aborted") == 2
    assert e.value.output.count('File "<string>", line 3 in <module>') == 2
    assert isinstance(e.value, subprocs.Hung)  # and its message shows both tails after the command
    assert str(e.value).split("stderr tails:\n", 1)[1] == e.value.output  # "[process 0] started ..."


def test_a_process_that_ignores_the_abort_is_killed_after_the_grace(monkeypatch):
    monkeypatch.setattr(subprocs, "_DUMP_GRACE_S", 1.0)
    code = "import signal, time\nsignal.signal(signal.SIGABRT, signal.SIG_IGN)\ntime.sleep(60)"
    t0 = time.monotonic()
    with pytest.raises(subprocs.Hung):
        subprocs.run_together([[sys.executable, "-c", code]], timeout_s=2)
    assert time.monotonic() - t0 < 20


class _Scripted:
    """A stand-in for ``random.Random`` whose ``randrange`` returns the given ports in turn."""

    def __init__(self, ports):
        self._ports = iter(ports)

    def randrange(self, lo, hi):
        port = next(self._ports)
        assert lo <= port < hi
        return port


def test_coordinator_port_is_free_and_below_the_ephemeral_range():
    lo, _ = subprocs._ephemeral_range()
    port = subprocs.coordinator_port()
    assert subprocs._LOWEST_PORT <= port < max(lo, subprocs._LOWEST_PORT + 1000)
    with socket.socket() as s:  # free: a coordinator can bind it
        s.bind(("127.0.0.1", port))


def test_coordinator_port_skips_a_port_in_use_and_says_when_none_is_free():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        lo, _ = subprocs._ephemeral_range()
        top = max(lo, subprocs._LOWEST_PORT + 1000)
        if not subprocs._LOWEST_PORT <= taken < top:  # the kernel gave an ephemeral port: take one below
            busy.close()
            busy = socket.socket()
            taken = subprocs.coordinator_port()
            busy.bind(("127.0.0.1", taken))
            busy.listen()
        free = subprocs.coordinator_port()
        while free == taken:
            free = subprocs.coordinator_port()
        assert subprocs.coordinator_port(rng=_Scripted([taken, free])) == free
        with pytest.raises(OSError, match="no free port"):
            subprocs.coordinator_port(attempts=3, rng=_Scripted([taken] * 3))
        busy.close()
