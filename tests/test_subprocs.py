"""Tests of jaxsprint.subprocs: processes that wait for each other finish even when one writes more than a pipe
holds, outputs come back whole, and the timeout kills every process."""
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


def test_the_timeout_kills_every_process_and_reports_their_stderr():
    code = "import sys, time\nprint('started', file=sys.stderr, flush=True)\ntime.sleep(60)"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        subprocs.run_together([[sys.executable, "-c", code]] * 2, timeout_s=5)
    assert time.monotonic() - t0 < 30
    assert e.value.output.count("started") == 2
    assert isinstance(e.value, subprocs.Hung)  # and its message shows both tails after the command
    assert str(e.value).split("stderr tails:\n", 1)[1] == e.value.output  # "[process 0] started ..."
