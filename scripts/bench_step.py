r"""Train-step throughput of the project's own jitted step: images/s, GFLOP/s and % of CPU peak.

Rows: ResNet-20 (32x32, CIFAR-10) at global batch 32 / 128 / 512 and ResNet-50 (224x224, 1000 classes) at 32,
for each convolution implementation (XLA's own gradient, and jaxsprint.conv's fast one), on 1 device and on
8 fake CPU devices (a separate process each, since the device count is fixed when JAX starts). FLOPs come from
XLA's cost analysis of the one-device train step built with XLA's own convolution (the same count for every
implementation: XLA cannot count inside jaxsprint.native's custom calls). With --torch, the same network in
PyTorch eager (CPU, all cores) runs in the same process as the JAX rows, with the ratio.

Every configuration of a row is compiled first, then timed in --rounds interleaved rounds of --steps calls
(median of each round, then median over rounds), so that load from other processes on a shared machine hits
JAX and PyTorch alike. Page faults per step are counted over the timed calls. The PyTorch step runs under the
process's allocator policy (jaxsprint/hostmem.py: freed memory retained; one arena with one device, an arena
per thread with 8).

  .venv/bin/python scripts/bench_step.py [--torch] [--rows=resnet20:128] [--impls=xla,auto] [--json=out.json]

Peak: 2 cores x 32 fp32 FLOP/cycle (two 256-bit FMA pipes x 8 lanes x 2) x 2.45 GHz = 157 GFLOP/s (--peak_gflops).
The clock under load is higher than 2.45 GHz (single convolutions have run at 180 GFLOP/s here), so the true
peak is too and "% peak" overstates the share.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ALL_ROWS = ["resnet20:32", "resnet20:128", "resnet20:512", "resnet50:32"]
SHAPES = {"resnet20": (32, 3, 10), "resnet50": (224, 3, 1000)}


def _time(fn, steps: int) -> float:
    """Median seconds per call over `steps` calls (after the caller's warm-up)."""
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def network_flops(name: str, classes: int, size: int, channels: int, step_args) -> float | None:
    """FLOPs of one train step, from XLA's cost analysis of the step built with XLA's own convolution.

    The same count for every implementation: XLA cannot see inside the native kernels' custom calls
    (jaxsprint.native), so the step that uses them would be under-counted.
    """
    import jax
    import optax

    from jaxsprint import models, train

    model = models.create_model(name, num_classes=classes, conv_general_dilated=train.conv_fn("xla"))
    tx = optax.sgd(0.01, momentum=0.9)
    state = jax.eval_shape(lambda k: train.create_train_state(k, model, tx, (1, size, size, channels)),
                           jax.random.key(0))
    step = train.make_train_step(model=model, num_classes=classes)
    cost = jax.jit(step).lower(state, *step_args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0)) or None


def worker(rows: list[str], impls: list[str], steps: int, rounds: int, dtype: str, with_torch: bool) -> list[dict]:
    from jaxsprint import hostmem

    print(hostmem.configure(), file=sys.stderr, flush=True)  # before JAX starts (jaxsprint/hostmem.py)
    import jax
    import numpy as np
    import optax

    from jaxsprint import models, parallel, train

    out = []
    n_dev = jax.device_count()
    mesh = parallel.make_mesh(-1)
    rep, dat = parallel.replicated(mesh), parallel.data_sharding(mesh)
    for row in rows:
        name, batch = row.split(":")
        batch = int(batch)
        size, channels, classes = SHAPES[name]
        n_steps = steps if name == "resnet20" else max(1, steps // 2)
        rng = np.random.default_rng(0)
        images = jax.device_put(rng.normal(size=(batch, size, size, channels)).astype(np.float32), dat)
        labels = jax.device_put(rng.integers(0, classes, batch).astype(np.int32), dat)
        weights = jax.device_put(np.ones(batch, np.float32), dat)
        flops = network_flops(name, classes, size, channels, (images, labels, weights)) if n_dev == 1 else None
        # Callables to time: (label, kind) -> fn. Built (and compiled) first, then timed in interleaved rounds
        # so that load from other processes on the machine hits every configuration alike.
        fns = {}
        for impl in impls:
            model = models.create_model(name, num_classes=classes, dtype=dtype,
                                        conv_general_dilated=train.conv_fn(impl), native_stats=train.native_stats(impl))
            tx = optax.sgd(0.01, momentum=0.9)
            state = jax.jit(lambda k: train.create_train_state(k, model, tx, (1, size, size, channels)),
                            out_shardings=rep)(jax.random.key(0))
            step = train.make_train_step(model=model, num_classes=classes, num_shards=n_dev, mesh=mesh)
            copts = train.compiler_options(impl)
            jstep = jax.jit(step, in_shardings=(rep, dat, dat, dat), out_shardings=(rep, rep), donate_argnums=0,
                            compiler_options=copts)
            fwd = jax.jit(lambda v, x: model.apply(v, x, train=False), in_shardings=(rep, dat), out_shardings=dat,
                          compiler_options=copts)
            variables = jax.tree.map(lambda a: a.copy(), {"params": state.params, "batch_stats": state.batch_stats})
            holder = {"state": state}

            def run_step(holder=holder, jstep=jstep):
                holder["state"], m = jstep(holder["state"], images, labels, weights)
                jax.block_until_ready(m["loss"])

            def run_fwd(fwd=fwd, variables=variables):
                jax.block_until_ready(fwd(variables, images))

            fns[(impl, "fwd")], fns[(impl, "step")] = run_fwd, run_step
        if with_torch:
            fns[("torch", "step")] = torch_step(row)
        for fn in fns.values():  # compile and warm up
            fn()
            fn()
        times = {key: [] for key in fns}
        faults = {key: 0 for key in fns}
        for _ in range(rounds):
            for key, fn in fns.items():
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                times[key].append(_time(fn, n_steps))
                faults[key] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        med = {key: statistics.median(v) for key, v in times.items()}
        torch_ips = batch / med[("torch", "step")] if with_torch else None
        for impl in impls:
            step_s, fwd_s = med[(impl, "step")], med[(impl, "fwd")]
            out.append({"row": row, "impl": impl, "devices": n_dev, "step_s": step_s, "forward_s": fwd_s,
                        "images_per_s": batch / step_s, "train_flops": flops,
                        "page_faults_per_step": faults[(impl, "step")] / (rounds * n_steps),
                        "torch_images_per_s": torch_ips})
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def torch_step(row: str):
    """A callable running one train step of the same network in PyTorch eager (CPU, all cores)."""
    import torch
    import torch.nn as tnn

    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)

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

    def resnet20():
        layers = [tnn.Conv2d(3, 16, 3, 1, 1, bias=False), tnn.BatchNorm2d(16), tnn.ReLU()]
        cin = 16
        for i, w in enumerate((16, 32, 64)):
            for j in range(3):
                layers.append(Basic(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = w
        return tnn.Sequential(*layers, tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(64, 10))

    def resnet50():
        layers = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(), tnn.MaxPool2d(3, 2, 1)]
        cin = 64
        for i, (n, w) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
            for j in range(n):
                layers.append(Bottleneck(cin, w, 2 if i > 0 and j == 0 else 1))
                cin = 4 * w
        return tnn.Sequential(*layers, tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(2048, 1000))

    name, batch = row.split(":")
    batch = int(batch)
    size, channels, classes = SHAPES[name]
    net = resnet20() if name == "resnet20" else resnet50()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, channels, size, size)
    y = torch.randint(0, classes, (batch,))
    loss_fn = tnn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    return step


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ALL_ROWS), help="comma-separated model:batch rows")
    p.add_argument("--impls", default="xla,auto", help="convolution implementations to compare")
    p.add_argument("--devices", default="1,8", help="device counts (one process each)")
    p.add_argument("--steps", type=int, default=3, help="timed calls per round (median; halved for ResNet-50)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median over rounds)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--torch", action="store_true", help="also time PyTorch eager (needs torch installed)")
    p.add_argument("--peak_gflops", type=float, default=157.0)
    p.add_argument("--json", default=None, help="write all results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    rows, impls = args.rows.split(","), args.impls.split(",")
    for r in rows:
        if r.split(":")[0] not in SHAPES or not r.split(":")[-1].isdigit():
            p.error(f"invalid --rows entry {r!r}: allowed model:batch with model in {sorted(SHAPES)}")
    for i in impls:
        if i not in ("xla", "fast", "auto"):
            p.error(f"invalid --impls entry {i!r}: allowed xla, fast, auto")
    if args.steps < 1 or args.rounds < 1:
        p.error(f"--steps and --rounds must be positive, got {args.steps} and {args.rounds}")
    if args.worker:
        print(json.dumps(worker(rows, impls, args.steps, args.rounds, args.dtype, args.torch)))
        return
    results = []
    for n in [int(d) for d in args.devices.split(",")]:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}", JAX_PLATFORMS="cpu")
        cmd = [sys.executable, __file__, "--worker", f"--rows={args.rows}", f"--impls={args.impls}",
               f"--steps={args.steps}", f"--rounds={args.rounds}", f"--dtype={args.dtype}"]
        if args.torch:
            cmd.append("--torch")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"worker with {n} devices failed:\n{r.stderr[-3000:]}")
        results += json.loads(r.stdout.strip().splitlines()[-1])
    flops = {x["row"]: x["train_flops"] for x in results if x["train_flops"]}
    header = ["network:batch", "conv", "devices", "step ms", "fwd ms", "step/fwd", "img/s", "GFLOP/s", "% peak",
              "faults/step"]
    if args.torch:
        header += ["torch img/s", "vs torch"]
    table = []
    for x in results:
        f = flops.get(x["row"])
        gflops = f / x["step_s"] / 1e9 if f else float("nan")
        line = [x["row"], x["impl"], str(x["devices"]), f"{1000 * x['step_s']:.0f}", f"{1000 * x['forward_s']:.0f}",
                f"{x['step_s'] / x['forward_s']:.2f}", f"{x['images_per_s']:.1f}", f"{gflops:.1f}",
                f"{100 * gflops / args.peak_gflops:.1f}", f"{x['page_faults_per_step']:.0f}"]
        if args.torch:
            t = x["torch_images_per_s"]
            line += [f"{t:.1f}", f"{x['images_per_s'] / t:.2f}x"]
        table.append(line)
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in table:
        print(" | ".join(c.rjust(w) for c, w in zip(r, widths)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
