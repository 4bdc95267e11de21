r"""Train-step throughput of the project's own jitted step: images/s, GFLOP/s and % of CPU peak.

Rows: ResNet-20 (32x32, CIFAR-10) at global batch 32 / 128 / 512 and ResNet-50 (224x224, 1000 classes) at 32,
for each convolution implementation (XLA's own gradient, and jaxsprint.conv's fast one), on 1 device and on
8 fake CPU devices (a separate process each, since the device count is fixed when JAX starts). FLOPs come from
XLA's cost analysis of the one-device train step. With --torch, the same networks in PyTorch eager (CPU) run
beside them in the parent process, with the ratio.

  .venv/bin/python scripts/bench_step.py [--torch] [--rows=resnet20:128] [--steps=5] [--json=out.json]

Peak: 2 cores x 32 fp32 FLOP/cycle (2 AVX2 FMA pipes x 8 lanes x 2) x 2.45 GHz = 157 GFLOP/s (--peak_gflops).
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


def worker(rows: list[str], impls: list[str], steps: int, dtype: str) -> list[dict]:
    from jaxsprint import hostmem

    print(hostmem.configure(), file=sys.stderr, flush=True)  # before JAX starts (jaxsprint/hostmem.py)
    import jax
    import jax.numpy as jnp
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
        n_steps = steps if name == "resnet20" else max(2, steps // 2)
        rng = np.random.default_rng(0)
        images = jax.device_put(rng.normal(size=(batch, size, size, channels)).astype(np.float32), dat)
        labels = jax.device_put(rng.integers(0, classes, batch).astype(np.int32), dat)
        weights = jax.device_put(np.ones(batch, np.float32), dat)
        for impl in impls:
            model = models.create_model(name, num_classes=classes, dtype=dtype,
                                        conv_general_dilated=train.conv_fn(impl))
            tx = optax.sgd(0.01, momentum=0.9)
            state = jax.jit(lambda k: train.create_train_state(k, model, tx, (1, size, size, channels)),
                            out_shardings=rep)(jax.random.key(0))
            step = train.make_train_step(model=model, num_classes=classes, num_shards=n_dev, mesh=mesh)
            copts = train.compiler_options(impl)
            jstep = jax.jit(step, in_shardings=(rep, dat, dat, dat), out_shardings=(rep, rep), donate_argnums=0,
                            compiler_options=copts)
            fwd = jax.jit(lambda v, x: model.apply(v, x, train=False), in_shardings=(rep, dat), out_shardings=dat,
                          compiler_options=copts)
            flops = None
            if n_dev == 1:
                cost = jstep.lower(state, images, labels, weights).compile().cost_analysis()
                cost = cost[0] if isinstance(cost, (list, tuple)) else cost
                flops = float(cost.get("flops", 0.0)) or None
            holder = {"state": state}

            def run_step():
                holder["state"], m = jstep(holder["state"], images, labels, weights)
                jax.block_until_ready(m["loss"])

            variables = {"params": state.params, "batch_stats": state.batch_stats}
            variables = jax.tree.map(lambda a: a.copy(), variables)

            def run_fwd():
                jax.block_until_ready(fwd(variables, images))

            run_fwd()
            fwd_s = _time(run_fwd, n_steps)
            run_step()
            run_step()
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step_s = _time(run_step, n_steps)
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / n_steps
            out.append({"row": row, "impl": impl, "devices": n_dev, "step_s": step_s, "forward_s": fwd_s,
                        "images_per_s": batch / step_s, "train_flops": flops, "page_faults_per_step": faults})
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def torch_rows(rows: list[str], steps: int) -> dict[str, float]:
    """Images/s of the same networks in PyTorch eager on the CPU (2 threads)."""
    import torch
    import torch.nn as tnn

    torch.set_num_threads(os.cpu_count() or 2)

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

    out = {}
    for row in rows:
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

        step()
        n_steps = steps if name == "resnet20" else max(2, steps // 2)
        out[row] = batch / _time(step, n_steps)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ALL_ROWS), help="comma-separated model:batch rows")
    p.add_argument("--impls", default="xla,fast", help="convolution implementations to compare")
    p.add_argument("--devices", default="1,8", help="device counts (one process each)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per row (median)")
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
    if args.worker:
        print(json.dumps(worker(rows, impls, args.steps, args.dtype)))
        return
    results = []
    for n in [int(d) for d in args.devices.split(",")]:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}", JAX_PLATFORMS="cpu")
        cmd = [sys.executable, __file__, "--worker", f"--rows={args.rows}", f"--impls={args.impls}",
               f"--steps={args.steps}", f"--dtype={args.dtype}"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"worker with {n} devices failed:\n{r.stderr[-3000:]}")
        results += json.loads(r.stdout.strip().splitlines()[-1])
    flops = {(x["row"], x["impl"]): x["train_flops"] for x in results if x["train_flops"]}
    if args.torch:  # the same allocator policy as the one-device JAX workers (jaxsprint/hostmem.py)
        from jaxsprint import hostmem

        print(f"torch process: {hostmem.configure()}", file=sys.stderr, flush=True)
    torch_ips = torch_rows(rows, args.steps) if args.torch else {}
    header = ["network:batch", "conv", "devices", "step ms", "fwd ms", "step/fwd", "img/s", "GFLOP/s", "% peak",
              "faults/step"]
    if torch_ips:
        header += ["torch img/s", "vs torch"]
    table = []
    for x in results:
        f = flops.get((x["row"], x["impl"]))
        gflops = f / x["step_s"] / 1e9 if f else float("nan")
        line = [x["row"], x["impl"], str(x["devices"]), f"{1000 * x['step_s']:.0f}", f"{1000 * x['forward_s']:.0f}",
                f"{x['step_s'] / x['forward_s']:.2f}", f"{x['images_per_s']:.1f}", f"{gflops:.1f}",
                f"{100 * gflops / args.peak_gflops:.1f}", f"{x['page_faults_per_step']:.0f}"]
        if torch_ips:
            t = torch_ips.get(x["row"])
            line += [f"{t:.1f}", f"{x['images_per_s'] / t:.2f}x"]
        table.append(line)
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in table:
        print(" | ".join(c.rjust(w) for c, w in zip(r, widths)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results, "torch_images_per_s": torch_ips}, fh, indent=1)


if __name__ == "__main__":
    main()
