"""Per-layer convolution times of ResNet-20 at batch 128: forward, input gradient, filter gradient.

Shows where a CPU train step loses to PyTorch: each ResNet-20 convolution shape is timed alone, in JAX
(``xla``: ``lax.conv_general_dilated`` and its own gradient; ``fast``: ``jaxsprint.train.cpu.conv.make_conv("fast")``,
jitted with the options the trainer uses on this device count) and, with --torch, in PyTorch eager (oneDNN, NCHW).

Each pass is timed as the median of ``--reps`` calls, ``--rounds`` rounds interleaved over the
implementations (load from other processes hits them alike; scripts/benchlib.py); the table shows the median
over rounds.
Columns, in ms per call:
  fwd        the convolution;
  dx, dw     the input / filter gradient alone. JAX: a jitted VJP returning only that gradient (XLA drops
             the unused forward). PyTorch: (forward + that gradient) - forward, as autograd needs the forward;
  total      fwd + dx + dw (JAX: fwd + one VJP returning both; PyTorch: one forward + backward call).
The "x layers" column is how many convolutions of that shape ResNet-20 has, and the last line sums
count x total over the layers, i.e. the convolution time of one train step.

  .venv/bin/python scripts/bench_conv_layers.py [--impls=xla,fast] [--torch] [--batch=128] [--rounds=5]
"""
from __future__ import annotations

from absl import flags

import benchlib
from jaxsprint import cli
from jaxsprint.errors import check

_IMPLS = flags.DEFINE_list("impls", ["xla", "fast"], "JAX implementations: xla, fast.")
_TORCH = flags.DEFINE_bool("torch", False, "Also time PyTorch eager (needs torch installed).")
_BATCH = flags.DEFINE_integer("batch", 128, "Batch size of every layer.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds (median over rounds).")
_REPS = flags.DEFINE_integer("reps", 5, "Timed calls per round (median).")

# ResNet-20 (CIFAR) convolutions: (H_in, C_in, C_out, kernel, stride, count in the network).
LAYERS = [
    (32, 3, 16, 3, 1, 1),
    (32, 16, 16, 3, 1, 6),
    (32, 16, 32, 3, 2, 1),
    (32, 16, 32, 1, 2, 1),
    (16, 32, 32, 3, 1, 5),
    (16, 32, 64, 3, 2, 1),
    (16, 32, 64, 1, 2, 1),
    (8, 64, 64, 3, 1, 5),
]


def jax_passes(impl: str, n: int, h: int, ci: int, co: int, k: int, s: int):
    """Callables for fwd, dx, dw and dx+dw of one layer in JAX (the VJPs do not run the forward)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from jaxsprint.train import cpu
    from jaxsprint.train.cpu import conv as cpu_conv

    fn = lax.conv_general_dilated if impl == "xla" else cpu_conv.make_conv("fast")
    # The options a trainer with the switch at "auto" jits its step with (None on several devices).
    opts = None if impl == "xla" else cpu.acceleration("auto").compiler_options
    pad = ((k // 2, k // 2), (k // 2, k // 2))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, h, h, ci), np.float32))
    w = jnp.asarray(rng.standard_normal((k, k, ci, co), np.float32) * 0.1)
    ho = (h + 2 * (k // 2) - k) // s + 1
    dy = jnp.asarray(rng.standard_normal((n, ho, ho, co), np.float32))

    def conv(a, b):
        return fn(a, b, (s, s), pad, dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def grads(argnums):
        def f(a, b, g):
            _, vjp = jax.vjp(conv, a, b)
            out = vjp(g)
            return tuple(out[i] for i in argnums)
        return jax.jit(f, compiler_options=opts)

    fwd = jax.jit(conv, compiler_options=opts)
    calls = {"fwd": lambda: fwd(x, w)}
    for name, argnums in (("dx", (0,)), ("dw", (1,)), ("dx+dw", (0, 1))):
        calls[name] = (lambda f: lambda: f(x, w, dy))(grads(argnums))
    out = {}
    for name, c in calls.items():
        out[name] = (lambda c: lambda: jax.block_until_ready(c()))(c)
        out[name]()  # compile and warm up
    return out


def torch_passes(n: int, h: int, ci: int, co: int, k: int, s: int):
    """fwd, fwd+dx, fwd+dw and fwd+dx+dw of one layer in PyTorch eager (NCHW, its default)."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(n, ci, h, h, requires_grad=True)
    conv = torch.nn.Conv2d(ci, co, k, s, k // 2, bias=False)
    dy = torch.randn_like(conv(x))

    def fwd():
        with torch.no_grad():
            conv(x)

    def grad(wrt):
        return lambda: torch.autograd.grad(conv(x), wrt, dy)

    out = {"fwd": fwd, "fwd+dx": grad((x,)), "fwd+dw": grad((conv.weight,)),
           "fwd+dx+dw": grad((x, conv.weight))}
    for f in out.values():
        f()
        f()
    return out


def main(argv) -> None:
    del argv
    impls = [i for i in _IMPLS.value if i]
    for i in impls:
        check(i in ("xla", "fast"), "--impls", i, "allowed: xla, fast")
    for name, flag in (("--batch", _BATCH), ("--rounds", _ROUNDS), ("--reps", _REPS)):
        check(flag.value >= 1, name, flag.value, "must be positive")
    batch, rounds, reps = _BATCH.value, _ROUNDS.value, _REPS.value

    from jaxsprint.train import cpu

    print(f"# {cpu.configure_host_memory('auto')}", flush=True)  # the trainer's allocator policy, before JAX starts
    import jax

    if _TORCH.value:
        benchlib.set_torch_threads()
    names = impls + (["torch"] if _TORCH.value else [])
    print(f"# batch {batch}; {jax.device_count()} JAX device(s); median over {rounds} interleaved "
          f"rounds of the median of {reps} calls; ms per call")
    cols = ["fwd", "dx", "dw", "total"]
    header = f"{'layer (HxW Cin->Cout kxk s)':28s} {'x':>2s} | " + " | ".join(
        f"{nm:>5s} " + " ".join(f"{c:>6s}" for c in cols) for nm in names)
    print(header)
    print("-" * len(header))
    step_total = {nm: 0.0 for nm in names}
    for h, ci, co, k, s, count in LAYERS:
        fns = {nm: (torch_passes(batch, h, ci, co, k, s) if nm == "torch"
                    else jax_passes(nm, batch, h, ci, co, k, s)) for nm in names}
        timed = benchlib.interleaved({(nm, c): f for nm in names for c, f in fns[nm].items()}, rounds=rounds,
                                     calls=reps, warmup=0)  # jax_passes/torch_passes warmed up already
        cells = []
        for nm in names:
            m = {c: 1e3 * timed[(nm, c)]["median_s"] for c in fns[nm]}
            if nm == "torch":
                row = {"fwd": m["fwd"], "dx": m["fwd+dx"] - m["fwd"], "dw": m["fwd+dw"] - m["fwd"],
                       "total": m["fwd+dx+dw"]}
            else:
                row = {"fwd": m["fwd"], "dx": m["dx"], "dw": m["dw"], "total": m["fwd"] + m["dx+dw"]}
            step_total[nm] += count * row["total"]
            cells.append(f"{'':5s} " + " ".join(f"{row[c]:6.2f}" for c in cols))
        label = f"{h}x{h} {ci}->{co} {k}x{k} s{s}"
        print(f"{label:28s} {count:2d} | " + " | ".join(cells), flush=True)
    print(f"{'sum of count x total':28s} {'':2s} | " + " | ".join(
        f"{'':5s} {'':6s} {'':6s} {'':6s} {step_total[nm]:6.1f}" for nm in names))


if __name__ == "__main__":
    cli.run(main)
