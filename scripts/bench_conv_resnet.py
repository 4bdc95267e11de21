"""Scratch benchmark: ResNet-20 (CIFAR) forward and train step, xla vs fast conv.

Usage:
    python scripts/bench_conv_resnet.py --conv xla --devices 1 --batch 128
    python scripts/bench_conv_resnet.py --conv fast --devices 8 --batch 128

The device count is fixed when JAX starts, so run one process per device count.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--conv", default="xla")
p.add_argument("--devices", type=int, default=1)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--reps", type=int, default=5)
p.add_argument("--chunks", type=int, default=1, help="batch chunks per device (grad accumulation in a scan)")
p.add_argument("--dtype", default="float32")
p.add_argument("--flags", default="", help="extra XLA_FLAGS")
p.add_argument("--no-donate", action="store_true")
p.add_argument("--only", default="", help="fwd or step")
p.add_argument("--profile", default="", help="dir: trace 2 steps and print the top ops")
args = p.parse_args()

flags = os.environ.get("XLA_FLAGS", "") + " " + args.flags
if args.devices > 1:
    flags += f" --xla_force_host_platform_device_count={args.devices}"
os.environ["XLA_FLAGS"] = flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jaxsprint import conv as jconv  # noqa: E402

_kind, *_opts = args.conv.split(":")
_kw = {}
for _o in _opts:
    _k, _v = _o.split("=")
    _kw[_k] = int(_v) if _v.isdigit() else (_v == "1" if _k == "barrier" else _v)
CONV = jconv.make_conv(_kind, **_kw)
DTYPE = jnp.dtype(args.dtype)


class Block(nn.Module):
    features: int
    strides: int = 1

    @nn.compact
    def __call__(self, x, train: bool):
        c = functools.partial(nn.Conv, use_bias=False, dtype=DTYPE, conv_general_dilated=CONV)
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
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = x.astype(DTYPE)
        x = nn.Conv(16, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, dtype=DTYPE,
                    conv_general_dilated=CONV)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=DTYPE)(x))
        for i, f in enumerate((16, 32, 64)):
            for j in range(3):
                x = Block(f, 2 if (i > 0 and j == 0) else 1)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(10, dtype=DTYPE)(x).astype(jnp.float32)


def profile(run, d):
    """Traces two steps and prints the ops that took the most time (summed over threads)."""
    import collections
    import glob
    jax.profiler.start_trace(d)
    run(); run()
    jax.profiler.stop_trace()
    f = sorted(glob.glob(f"{d}/**/*.xplane.pb", recursive=True))[-1]
    pd = jax.profiler.ProfileData.from_file(f)
    tot = collections.Counter(); cat = collections.Counter()
    for plane in pd.planes:
        for line in plane.lines:
            if "XLAEigen" not in line.name:
                continue
            for ev in line.events:
                if "Execute" in ev.name:
                    continue
                tot[ev.name] += ev.duration_ns / 2e6
                cat[ev.name.split(".")[0]] += ev.duration_ns / 2e6
    print(f"op time summed over threads: {sum(tot.values()):.1f} ms/step")
    for k, v in cat.most_common(12):
        print(f"  {v:8.2f} ms/step  {k}")
    for k, v in tot.most_common(12):
        print(f"    {v:8.2f} ms/step  {k}")


def main():
    devs = jax.devices()[: args.devices]
    mesh = jax.sharding.Mesh(np.array(devs), ("b",))
    dsh = NamedSharding(mesh, P("b"))
    rep = NamedSharding(mesh, P())
    model = ResNet20()
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
        l = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return l, upd["batch_stats"]

    def step(p, bs, o, x, y):
        if args.chunks == 1:
            (l, bs), g = jax.value_and_grad(loss_fn, has_aux=True)(p, bs, x, y)
        else:
            # gradient accumulation over batch chunks (BN stats per chunk)
            xs = x.reshape((args.chunks, -1) + x.shape[1:])
            ys = y.reshape((args.chunks, -1))
            def body(c, xy):
                g0, l0, bs0 = c
                (l, bs1), g = jax.value_and_grad(loss_fn, has_aux=True)(p, bs0, *xy)
                return (jax.tree.map(jnp.add, g0, g), l0 + l, bs1), None
            z = jax.tree.map(jnp.zeros_like, p)
            (g, l, bs), _ = jax.lax.scan(body, (z, 0.0, bs), (xs, ys))
            g = jax.tree.map(lambda a: a / args.chunks, g)
            l = l / args.chunks
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), bs, o, l

    donate = () if args.no_donate else (0, 1, 2)
    jstep = jax.jit(step, donate_argnums=donate, out_shardings=(rep, rep, rep, rep))
    jfwd = jax.jit(lambda p, bs, x: model.apply({"params": p, "batch_stats": bs}, x, train=False))

    def timeit(f, n):
        ts = []
        cs = []
        for _ in range(n):
            t = time.perf_counter()
            c = time.process_time()
            f()
            ts.append(time.perf_counter() - t)
            cs.append(time.process_time() - c)
        return float(np.median(ts)), float(np.min(ts)), float(np.median(cs))

    res = {}
    if args.only in ("", "fwd"):
        jax.block_until_ready(jfwd(params, bstats, x))
        res["fwd"] = timeit(lambda: jax.block_until_ready(jfwd(params, bstats, x)), args.reps)
    if args.only in ("", "step"):
        state = [params, bstats, opt]
        def run():
            p, b, o, l = jstep(*state, x, yl)
            state[:] = [p, b, o]
            jax.block_until_ready(l)
        t0 = time.perf_counter(); run(); tc = time.perf_counter() - t0
        res["step"] = timeit(run, args.reps)
    if args.profile:
        profile(run, args.profile)
    line = f"conv={args.conv:5s} dev={args.devices} B={B} chunks={args.chunks} dtype={args.dtype} flags='{args.flags}'"
    if "fwd" in res:
        line += f" | fwd {res['fwd'][0]*1e3:7.1f} ms ({B/res['fwd'][0]:6.0f} img/s, cpu {res['fwd'][2]*1e3:5.0f})"
    if "step" in res:
        line += f" | step {res['step'][0]*1e3:7.1f} ms (min {res['step'][1]*1e3:6.1f}) {B/res['step'][0]:6.1f} img/s cpu {res['step'][2]*1e3:6.0f} ms"
    if "fwd" in res and "step" in res:
        line += f" | step/fwd {res['step'][0]/res['fwd'][0]:.2f}"
    print(line, flush=True)


if __name__ == "__main__":
    main()
