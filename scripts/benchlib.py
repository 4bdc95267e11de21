"""What the benchmarks in scripts/ share: timing, XLA's FLOP count, the PyTorch reference ResNets, tables, JSON.

A script run as ``python scripts/x.py`` has scripts/ on ``sys.path``, so ``import benchlib`` works there; the
repository root is put on the path here as well, so that ``jaxsprint`` and ``experiments`` import without
installing the package.

Timing rule used by every benchmark: compile and warm up each callable first, then time them in interleaved
rounds (each round calls every callable ``calls`` times and keeps the median), and report the median over
rounds, so that load from other processes on a shared machine hits every configuration alike.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from typing import Any, Callable, Hashable, Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Input shape and classes of the networks the benchmarks compare: (image side, channels, classes).
SHAPES = {"resnet20": (32, 3, 10), "resnet50": (224, 3, 1000)}


def median_seconds(fn: Callable[[], Any], calls: int) -> float:
    """Median wall-clock seconds of ``calls`` calls of ``fn`` (which must block until its work is done)."""
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved(fns: Mapping[Hashable, Callable[[], Any]], *, rounds: int, calls: int,
                warmup: int = 2) -> dict[Hashable, dict[str, float]]:
    """Times several callables alike: warm-up, then ``rounds`` interleaved rounds of ``calls`` calls each.

    Args:
      fns: name -> callable that blocks until its result is ready.
      rounds: interleaved rounds; the result is the median over rounds of each round's median call.
      calls: timed calls per callable and round.
      warmup: untimed calls per callable first (the first compiles).

    Returns:
      name -> ``{"median_s": ..., "round_medians_s": [...], "page_faults_per_call": ...}``; page faults are
      the process's minor faults during that callable's timed calls (``getrusage``), per call.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    medians = {key: [] for key in fns}
    faults = {key: 0 for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            medians[key].append(median_seconds(fn, calls))
            faults[key] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return {key: {"median_s": statistics.median(medians[key]), "round_medians_s": medians[key],
                  "page_faults_per_call": faults[key] / (rounds * calls)} for key in fns}


def pipelined_seconds(fn: Callable[[], Any], calls: int) -> float:
    """Mean seconds per call of ``calls`` back-to-back calls, blocking once on the last call's result.

    For asynchronous devices (GPU, TPU): the host queues the next step while the device runs this one, as a
    training loop does, so the figure is the device's throughput, not a round trip per call.
    """
    import jax

    t = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / calls


def flops_of(compiled) -> float | None:
    """FLOPs of one call of a compiled XLA program (``jax.jit(f).lower(*args).compile()``), from XLA's cost
    analysis; None when the backend reports none.

    XLA counts only what it can see: custom calls (jaxsprint.train.cpu's native kernels) count as zero, so count a
    program built without them.
    """
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    flops = float((cost or {}).get("flops", 0.0))
    return flops if flops > 0 else None


def compiled_flops(jitted, *args) -> float | None:
    """:func:`flops_of` the program ``jitted(*args)`` compiles to."""
    return flops_of(jitted.lower(*args).compile())


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: header, rule, right-aligned cells."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def write_json(path: str, obj: Any) -> None:
    """Writes ``obj`` as indented JSON, atomically (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------
# PyTorch reference networks (eager, CPU). Same layers as jaxsprint.train.models' ResNet-20 (CIFAR, He et al. 2016
# section 4.2: 3 stages of 3 basic blocks, 16/32/64 channels, projection shortcuts where the shape changes)
# and ResNet-50 (bottleneck blocks 3/4/6/3, stride on the 3x3 convolution as in torchvision).


def set_torch_threads() -> int:
    """Lets PyTorch use every core this process may run on; returns the thread count."""
    import torch

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def torch_resnet(name: str):
    """The PyTorch ``nn.Module`` of ``name`` ("resnet20" or "resnet50"), NCHW, randomly initialised."""
    import torch
    import torch.nn as tnn

    class Basic(tnn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = tnn.BatchNorm2d(cout)
            self.c2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = tnn.BatchNorm2d(cout)
            self.proj = None
            if stride != 1 or cin != cout:
                self.proj = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.proj is None else self.proj(x)))

    class Bottleneck(tnn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = 4 * width
            self.body = tnn.Sequential(
                tnn.Conv2d(cin, width, 1, bias=False), tnn.BatchNorm2d(width), tnn.ReLU(),
                tnn.Conv2d(width, width, 3, stride, 1, bias=False), tnn.BatchNorm2d(width), tnn.ReLU(),
                tnn.Conv2d(width, cout, 1, bias=False), tnn.BatchNorm2d(cout))
            self.proj = None
            if stride != 1 or cin != cout:
                self.proj = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.proj is None else self.proj(x)))

    if name == "resnet20":
        layers, cin = [tnn.Conv2d(3, 16, 3, 1, 1, bias=False), tnn.BatchNorm2d(16), tnn.ReLU()], 16
        for i, w in enumerate((16, 32, 64)):
            for j in range(3):
                layers.append(Basic(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = w
        return tnn.Sequential(*layers, tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(64, 10))
    if name == "resnet50":
        layers = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(), tnn.MaxPool2d(3, 2, 1)]
        cin = 64
        for i, (n, w) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
            for j in range(n):
                layers.append(Bottleneck(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = 4 * w
        return tnn.Sequential(*layers, tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(2048, 1000))
    from jaxsprint.errors import ConfigError

    raise ConfigError("network", name, f"PyTorch references exist for {', '.join(sorted(SHAPES))}")


def torch_train_step(name: str, batch: int) -> Callable[[], None]:
    """A callable running one SGD-momentum train step of ``torch_resnet(name)`` on a fixed random batch."""
    import torch
    import torch.nn as tnn

    size, channels, classes = SHAPES[name]
    torch.manual_seed(0)
    net = torch_resnet(name)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, channels, size, size)
    y = torch.randint(0, classes, (batch,))
    loss_fn = tnn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    return step
