"""Scratch benchmark: ResNet-20 (CIFAR) forward and train step, xla vs fast conv, side by side.

Each configuration is compiled once; timing rounds are interleaved over the configurations so that
load from other processes on this shared machine hits them alike. Reported per configuration: the
median over rounds of each round's median step, the best step, and process CPU time per step.

Usage:
    python scripts/bench_conv_resnet.py --convs xla,fast --devices 1 --batch 128 --rounds 5 [--torch]
    python scripts/bench_conv_resnet.py --convs xla,fast --devices 8

A conv spec is "xla", "fast" or "auto" (jaxsprint.conv.make_conv; "auto" splits each conv's batch in
two when the process has one device), optionally with ":split=N" (make_conv's batch_split).
The device count is fixed when JAX starts, so run one process per device count.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--convs", default="xla,fast")
p.add_argument("--devices", type=int, default=1)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--reps", type=int, default=3, help="timed calls per round")
p.add_argument("--accum", type=int, default=1, help="gradient accumulation over batch chunks (changes BN stats)")
p.add_argument("--dtype", default="float32")
p.add_argument("--flags", default="", help="extra XLA_FLAGS")
p.add_argument("--no-donate", action="store_true")
p.add_argument("--no-fwd", action="store_true")
p.add_argument("--torch", action="store_true", help="also time PyTorch eager (same process, interleaved)")
p.add_argument("--profile", default="", help="dir: trace 2 steps of the first conv and print the top ops")
args = p.parse_args()

flags = os.environ.get("XLA_FLAGS", "") + " " + args.flags
if args.devices > 1:
    flags += f" --xla_force_host_platform_device_count={args.devices}"
os.environ["XLA_FLAGS"] = flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
from typing import Any, Callable  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jaxsprint import conv as jconv  # noqa: E402

DTYPE = jnp.dtype(args.dtype)


def parse_conv(spec: str) -> Callable:
    """"xla" | "fast" | "auto", optionally ":split=N" (make_conv's batch_split)."""
    kind, *opts = spec.split(":")
    kw: dict[str, Any] = {}
    for o in opts:
        k, v = o.split("=")
        kw[{"split": "batch_split"}.get(k, k)] = int(v)
    return jconv.make_conv(kind, **kw)


class Block(nn.Module):
    features: int
    strides: int
    conv: Callable

    @nn.compact
    def __call__(self, x, train: bool):
        c = functools.partial(nn.Conv, use_bias=False, dtype=DTYPE, conv_general_dilated=self.conv)
        bn = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, dtype=DTYPE)
        r = x
        y = c(self.features, (3, 3), strides=self.strides, padding=((1, 1), (1, 1)))(x)
        y = nn.relu(bn()(y))
        y = c(self.features, (3, 3), padding=((1, 1), (1, 1)))(y)
        y = bn(scale_init=nn.initializers.zeros)(y)
        if r.shape != y.shape:
            r = c(self.features, (1, 1), strides=self.strides)(r)
            r = bn()(r)
        return nn.relu(y + r)


class ResNet20(nn.Module):
    conv: Callable

    @nn.compact
    def __call__(self, x, train: bool = True):
        x = x.astype(DTYPE)
        x = nn.Conv(16, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, dtype=DTYPE,
                    conv_general_dilated=self.conv)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=DTYPE)(x))
        for i, f in enumerate((16, 32, 64)):
            for j in range(3):
                x = Block(f, 2 if (i > 0 and j == 0) else 1, self.conv)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(10, dtype=DTYPE)(x).astype(jnp.float32)


def classify(hlo_text):
    """Maps each fusion/op name in the compiled HLO to a short kind string."""
    import re
    comps = {}
    cur = None
    for line in hlo_text.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.-]+) .*\{$", line)
        if m:
            cur = m.group(1); comps[cur] = []
            continue
        if cur is not None:
            comps[cur].append(line)
    kinds = {}
    for line in hlo_text.splitlines():
        m = re.match(r"^\s*(?:ROOT )?%([\w.-]+) = (\S+) (\w[\w-]*)\(", line)
        if not m:
            continue
        name, shape, op = m.groups()
        k = op
        body = ""
        mc = re.search(r"calls=%([\w.-]+)", line)
        if mc:
            body = "\n".join(comps.get(mc.group(1), []))
        txt = line + body
        if "convolution(" in txt:
            w = re.search(r"window=\{size=(\w+)", txt)
            k = f"conv[{w.group(1) if w else '?'}]"
            if "rhs_reversal" in txt or "lhs_dilate" in txt:
                k = "conv_dx"
            elif w and int(w.group(1).split("x")[0]) > 7:
                k = "conv_dw"
            else:
                k = "conv_fwd_or_dx"
        elif " dot(" in txt:
            k = "dot"
        elif "transpose(" in txt:
            k = "transpose"
        elif "reduce(" in txt:
            k = "reduce"
        kinds[name] = k + " " + shape.split("{")[0]
    return kinds


def profile(run, d, hlo_text=""):
    """Traces two steps and prints the ops that took the most time (summed over threads)."""
    import collections
    import glob
    jax.profiler.start_trace(d)
    run(); run()
    jax.profiler.stop_trace()
    f = sorted(glob.glob(f"{d}/**/*.xplane.pb", recursive=True))[-1]
    pd = jax.profiler.ProfileData.from_file(f)
    kinds = classify(hlo_text)
    tot = collections.Counter(); cat = collections.Counter()
    for plane in pd.planes:
        for line in plane.lines:
            if "XLAEigen" not in line.name:
                continue
            for ev in line.events:
                if "Execute" in ev.name:
                    continue
                tot[ev.name] += ev.duration_ns / 2e6
                cat[kinds.get(ev.name, ev.name.split(".")[0]).split(" ")[0]] += ev.duration_ns / 2e6
    print(f"op time summed over threads: {sum(tot.values()):.1f} ms/step")
    for k, v in cat.most_common(12):
        print(f"  {v:8.2f} ms/step  {k}")
    for k, v in tot.most_common(int(os.environ.get("TOPN", 25))):
        print(f"    {v:8.2f} ms/step  {k:28s} {kinds.get(k, '')}")


def build(spec, mesh):
    """Returns (fwd(), step()) closures for one conv spec, compiled and warmed up."""
    dsh = NamedSharding(mesh, P("b"))
    rep = NamedSharding(mesh, P())
    model = ResNet20(parse_conv(spec))
    B = args.batch
    x = jax.random.normal(jax.random.key(0), (B, 32, 32, 3))
    yl = jax.random.randint(jax.random.key(1), (B,), 0, 10)
    v = model.init(jax.random.key(2), x[:2], train=False)
    params, bstats = v["params"], v["batch_stats"]
    tx = optax.sgd(0.1, momentum=0.9)
    opt = tx.init(params)
    x, yl = jax.device_put(x, dsh), jax.device_put(yl, dsh)
    params, bstats, opt = jax.device_put((params, bstats, opt), rep)

    def loss_fn(p, bs, x, y):
        logits, upd = model.apply({"params": p, "batch_stats": bs}, x, train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), upd["batch_stats"]

    def step(p, bs, o, x, y):
        if args.accum == 1:
            (l, bs), g = jax.value_and_grad(loss_fn, has_aux=True)(p, bs, x, y)
        else:
            xs = x.reshape((args.accum, -1) + x.shape[1:])
            ys = y.reshape((args.accum, -1))

            def body(c, xy):
                g0, l0, bs0 = c
                (l, bs1), g = jax.value_and_grad(loss_fn, has_aux=True)(p, bs0, *xy)
                return (jax.tree.map(jnp.add, g0, g), l0 + l, bs1), None

            z = jax.tree.map(jnp.zeros_like, p)
            (g, l, bs), _ = jax.lax.scan(body, (z, 0.0, bs), (xs, ys))
            g = jax.tree.map(lambda a: a / args.accum, g)
            l = l / args.accum
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), bs, o, l

    donate = () if args.no_donate else (0, 1, 2)
    jstep = jax.jit(step, donate_argnums=donate, out_shardings=(rep, rep, rep, rep))
    jfwd = jax.jit(lambda p, bs, x: model.apply({"params": p, "batch_stats": bs}, x, train=False))
    state = [params, bstats, opt]

    def run_step():
        p, b, o, l = jstep(*state, x, yl)
        state[:] = [p, b, o]
        jax.block_until_ready(l)

    def run_fwd():
        jax.block_until_ready(jfwd(state[0], state[1], x))

    hlo = jstep.lower(*state, x, yl).compile().as_text()
    run_step(); run_step()
    if not args.no_fwd:
        run_fwd(); run_fwd()
    return run_fwd, run_step, hlo


def build_torch():
    import torch
    import torch.nn.functional as F
    from bench_conv_torch import ResNet20 as TorchResNet20
    torch.manual_seed(0)
    m = TorchResNet20()
    xt = torch.randn(args.batch, 3, 32, 32)
    yt = torch.randint(0, 10, (args.batch,))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    def run_step():
        m.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(xt), yt).backward()
        opt.step()

    def run_fwd():
        m.eval()
        with torch.no_grad():
            m(xt)

    run_step(); run_step(); run_fwd()
    return run_fwd, run_step, f"torch {torch.__version__} threads={torch.get_num_threads()}"


def timeit(f, n):
    ts, cs = [], []
    for _ in range(n):
        t, c = time.perf_counter(), time.process_time()
        f()
        ts.append(time.perf_counter() - t)
        cs.append(time.process_time() - c)
    return ts, cs


def main():
    devs = jax.devices()[: args.devices]
    assert len(devs) == args.devices, devs
    mesh = jax.sharding.Mesh(np.array(devs), ("b",))
    specs = args.convs.split(",")
    fns = {}
    for s in specs:
        t0 = time.perf_counter()
        fns[s] = build(s, mesh)
        print(f"# built {s} in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.torch:
        sys.path.insert(0, os.path.dirname(__file__))
        fns["torch"] = build_torch()
    res = {s: {"fwd": [], "step": [], "fwd_cpu": [], "step_cpu": [], "step_min": []} for s in fns}
    for r in range(args.rounds):
        for s, (f, st, _) in fns.items():
            if not args.no_fwd:
                ts, cs = timeit(f, args.reps)
                res[s]["fwd"].append(np.median(ts)); res[s]["fwd_cpu"].append(np.median(cs))
            ts, cs = timeit(st, args.reps)
            res[s]["step"].append(np.median(ts)); res[s]["step_cpu"].append(np.median(cs))
            res[s]["step_min"].append(np.min(ts))
    B = args.batch
    print(f"# ResNet-20 B={B} devices={args.devices} dtype={args.dtype} accum={args.accum} "
          f"flags='{args.flags}' rounds={args.rounds}x{args.reps} load={os.getloadavg()[0]:.1f}")
    print(f"{'conv':34s} {'fwd ms':>7s} {'fwd img/s':>9s} {'step ms':>8s} {'best':>6s} {'img/s':>6s} "
          f"{'cpu ms':>7s} {'step/fwd':>8s}")
    for s, d in res.items():
        f = float(np.median(d["fwd"])) if d["fwd"] else float("nan")
        st = float(np.median(d["step"]))
        print(f"{s:34s} {f*1e3:7.1f} {B/f:9.0f} {st*1e3:8.1f} {min(d['step_min'])*1e3:6.1f} {B/st:6.1f} "
              f"{np.median(d['step_cpu'])*1e3:7.0f} {st/f:8.2f}", flush=True)
    if args.profile:
        s = specs[0]
        profile(fns[s][1], args.profile, fns[s][2])


if __name__ == "__main__":
    main()
