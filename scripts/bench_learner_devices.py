r"""Learner threads without an updater: cycle time against the process's device count, and its spread.

Each point is ``--repeats`` fresh processes with ``--xla_force_host_platform_device_count=D``, in which ``N``
threads each draw the runtime's sub-batches (``SubBatches.draw``) and compute the runtime's gradient on their
own device for ``--seconds``; the table gives the mean cycle (wall time x N / gradients) over the processes
(median, min, max) and the CPU cores the process used. A runtime process has ``D = N`` devices with the updater
on the first learner's device and ``N + 1`` with its own. Timings only: nothing is asserted
(docs/calibration.md, "What the runs cannot see").

  .venv/bin/python scripts/bench_learner_devices.py [--points=1x1x32,1x2x32 --repeats=3]   # about 5 minutes
"""
import json
import os
import subprocess
import sys

from absl import flags

from jaxsprint import cli
from jaxsprint.errors import check

_POINTS = flags.DEFINE_list("points", ["1x1x32", "1x2x32", "1x8x32", "2x2x16", "2x3x16", "2x8x16", "8x8x40", "8x9x40"],
                            "Points NxDxB: learner threads, devices of the process, sub-batch.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Fresh processes per point.")
_SECONDS = flags.DEFINE_float("seconds", 2.0, "Timed seconds per process (after two warm-up steps per thread).")
_CHILD = flags.DEFINE_string("child", None, "Internal: run one point (N,B) in this process and print JSON.")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(n: int, b: int, seconds: float) -> dict:
    """Times ``n`` learner threads (draw and gradient, each on its own device) in this process."""
    import threading
    import time

    import jax
    import numpy as np

    from experiments.configs import sprint
    from jaxsprint.calibration import timing
    from jaxsprint.runtime import learner

    config = sprint.get_config()
    fn, params, dataset = timing.gradient_function(config)
    devices = jax.devices()
    data = learner.SubBatches(dataset.train, seed=0, sub_batch=b, host=0, num_hosts=1)
    weights = [jax.device_put(params, devices[i % len(devices)]) for i in range(n)]
    stop, counts = threading.Event(), [0] * n

    def step(i):
        _, batch = data.draw()
        args = jax.device_put((batch["image"], batch["label"], np.zeros(2, np.int32)), devices[i % len(devices)])
        np.asarray(fn(weights[i], *args))

    def loop(i):
        while not stop.is_set():
            step(i)
            counts[i] += 1

    for i in range(n):
        step(i), step(i)  # compile and warm up on every device
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    wall, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return dict(cycle_s=wall * n / max(1, sum(counts)), cores=cpu / wall)


def _point(text: str) -> tuple[int, int, int]:
    try:
        n, d, b = (int(x) for x in text.split("x"))
    except ValueError:
        n = d = b = 0
    check(n >= 1 and d >= 1 and b >= 1, "--points", text, "NxDxB with positive integers (e.g. 2x3x16)")
    return n, d, b


def main(argv):
    del argv
    if _CHILD.value:
        n, b = (int(x) for x in _CHILD.value.split(","))
        print("RESULT " + json.dumps(child(n, b, _SECONDS.value)), flush=True)
        return
    check(_REPEATS.value >= 1, "--repeats", _REPEATS.value, "an integer >= 1")
    check(_SECONDS.value > 0, "--seconds", _SECONDS.value, "a number of seconds > 0")
    points = [_point(p) for p in _POINTS.value]
    import numpy as np

    print("| learners N | devices D | sub-batch | cycle ms: median (min-max) over processes | cores used |")
    print("|---|---|---|---|---|")
    for n, d, b in points:
        runs = []
        for _ in range(_REPEATS.value):
            env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={d}",
                       PYTHONPATH=_ROOT)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), f"--child={n},{b}",
                                  f"--seconds={_SECONDS.value}"], capture_output=True, text=True, env=env,
                                 timeout=600)
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            check(line is not None, "child", out.stderr.strip().splitlines()[-1:] or out.returncode, "a timing")
            runs.append(json.loads(line[len("RESULT "):]))
        ms = np.array([1e3 * r["cycle_s"] for r in runs])
        print(f"| {n} | {d} | {b} | {np.median(ms):.2f} ({ms.min():.2f}-{ms.max():.2f}) | "
              f"{np.median([r['cores'] for r in runs]):.2f} |", flush=True)


if __name__ == "__main__":
    cli.run(main)
