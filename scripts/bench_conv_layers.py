"""Scratch benchmark: per-layer forward / input-gradient / filter-gradient times, xla vs fast conv.

Each layer is timed as it sits in a ResNet: its input comes out of an elementwise chain
(x = relu(p * scale + shift + r), as BatchNorm + residual + ReLU leave it) and the cotangent goes
back through that chain, because that is where XLA's own filter gradient loses its time (the
transposes it needs get fused with the chain). Timing rounds interleave the two implementations.

Usage: python scripts/bench_conv_layers.py [--batch 128] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jaxsprint import conv as jconv  # noqa: E402

DN = ("NHWC", "HWIO", "NHWC")
# ResNet-20 layer shapes: (H, C_in, C_out, kernel, stride, padding).
LAYERS = [
    (32, 16, 16, 3, 1, ((1, 1), (1, 1))),
    (32, 16, 32, 3, 2, ((1, 1), (1, 1))),
    (32, 16, 32, 1, 2, ((0, 0), (0, 0))),
    (16, 32, 32, 3, 1, ((1, 1), (1, 1))),
    (16, 32, 64, 3, 2, ((1, 1), (1, 1))),
    (16, 32, 64, 1, 2, ((0, 0), (0, 0))),
    (8, 64, 64, 3, 1, ((1, 1), (1, 1))),
]


def timeit(f, args, reps):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def make_fns(conv_fn, s, pad):
    def layer(p, sc, sh, r, w):
        x = jax.nn.relu(p * sc + sh + r)
        return conv_fn(x, w, (s, s), pad, dimension_numbers=DN)

    fwd = jax.jit(layer)

    def grads(p, sc, sh, r, w, dy, argnums):
        _, vjp = jax.vjp(lambda *a: layer(*a), p, sc, sh, r, w)
        g = vjp(dy)
        return tuple(g[i] for i in argnums)

    bwd = jax.jit(lambda *a: grads(*a, argnums=(0, 4)))   # input chain + filter gradients
    dw = jax.jit(lambda *a: grads(*a, argnums=(4,)))       # filter gradient only
    dx = jax.jit(lambda *a: grads(*a, argnums=(0,)))       # input gradient only
    return fwd, bwd, dx, dw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    n = a.batch
    print(f"# batch {n}, median of {a.rounds} interleaved rounds x {a.reps} calls, ms; load {os.getloadavg()[0]:.1f}")
    print(f"{'layer':26s} | {'fwd xla':>7s} {'fast':>6s} | {'dx xla':>6s} {'fast':>6s} | {'dw xla':>6s} {'fast':>6s}"
          f" | {'dx+dw xla':>9s} {'fast':>6s}")
    for h, ci, co, k, s, pad in LAYERS:
        rng = np.random.default_rng(0)
        p = jnp.asarray(rng.standard_normal((n, h, h, ci), np.float32))
        r = jnp.asarray(rng.standard_normal((n, h, h, ci), np.float32))
        sc = jnp.asarray(rng.standard_normal((ci,), np.float32))
        sh = jnp.asarray(rng.standard_normal((ci,), np.float32))
        w = jnp.asarray(rng.standard_normal((k, k, ci, co), np.float32))
        ho = (h + pad[0][0] + pad[0][1] - k) // s + 1
        dy = jnp.asarray(rng.standard_normal((n, ho, ho, co), np.float32))
        impls = {"xla": make_fns(lax.conv_general_dilated, s, pad),
                 "fast": make_fns(jconv.conv_general_dilated, s, pad)}
        res = {name: {"fwd": [], "dx": [], "dw": [], "bwd": []} for name in impls}
        for _ in range(a.rounds):
            for name, (fwd, bwd, dx, dw) in impls.items():
                res[name]["fwd"].append(timeit(fwd, (p, sc, sh, r, w), a.reps))
                res[name]["dx"].append(timeit(dx, (p, sc, sh, r, w, dy), a.reps))
                res[name]["dw"].append(timeit(dw, (p, sc, sh, r, w, dy), a.reps))
                res[name]["bwd"].append(timeit(bwd, (p, sc, sh, r, w, dy), a.reps))
        m = {name: {kk: np.median(v) * 1e3 for kk, v in d.items()} for name, d in res.items()}
        label = f"{h}x{h} {ci}->{co} {k}x{k} s{s}"
        print(f"{label:26s} | {m['xla']['fwd']:7.2f} {m['fast']['fwd']:6.2f} | {m['xla']['dx']:6.2f} "
              f"{m['fast']['dx']:6.2f} | {m['xla']['dw']:6.2f} {m['fast']['dw']:6.2f} | {m['xla']['bwd']:9.2f} "
              f"{m['fast']['bwd']:6.2f}", flush=True)


if __name__ == "__main__":
    main()
