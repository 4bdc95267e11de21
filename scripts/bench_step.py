r"""Train-step throughput of the project's own jitted step: images/s, GFLOP/s and % of CPU peak.

Rows: ResNet-20 (32x32, CIFAR-10) at global batch 32 / 128 / 512 and ResNet-50 (224x224, 1000 classes) at 32,
for each setting of the CPU acceleration switch (``cpu_kernels``: "off" is XLA's own convolution and plain
BatchNorm, "auto" the jaxsprint.train.cpu seam), on 1 device and on 8 fake CPU devices (a separate process each,
since the device count is fixed when JAX starts). FLOPs come from XLA's cost analysis of the one-device train
step built with the switch off (the same count for every setting: XLA cannot count inside the native kernels'
custom calls). With --torch, the same network in PyTorch eager (CPU, all cores; scripts/benchlib.py) runs in
the same process as the JAX rows, with the ratio.

Every configuration of a row is compiled first, then timed in --rounds interleaved rounds of --steps calls
(median of each round, then median over rounds; benchlib.interleaved), so that load from other processes on a
shared machine hits JAX and PyTorch alike. Page faults per step are counted over the timed calls. Every
configuration (the PyTorch step too) runs under the trainer's default allocator policy
(``cpu.configure_host_memory("auto")``: freed memory retained; one arena with one device, an arena per thread
with 8).

  .venv/bin/python scripts/bench_step.py [--torch] [--rows=resnet20:128] [--cpu_kernels=off,auto] [--json=out.json]

Peak: 2 cores x 32 fp32 FLOP/cycle (two 256-bit FMA pipes x 8 lanes x 2) x 2.45 GHz = 157 GFLOP/s (--peak_gflops).
The clock under load is higher than 2.45 GHz (single convolutions have run at 180 GFLOP/s here), so the true
peak is too and "% peak" overstates the share.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import flags

import benchlib  # noqa: F401  (puts the repository root on sys.path)
from jaxsprint import cli
from jaxsprint.errors import ConfigError, check

ALL_ROWS = ["resnet20:32", "resnet20:128", "resnet20:512", "resnet50:32"]
MODES = ("off", "auto", "require")

_ROWS = flags.DEFINE_list("rows", ALL_ROWS, "model:batch rows, model in resnet20, resnet50.")
_CPU_KERNELS = flags.DEFINE_list("cpu_kernels", ["off", "auto"], "Settings of the CPU acceleration switch to "
                                 "compare: off, auto, require.")
_DEVICES = flags.DEFINE_list("devices", ["1", "8"], "Device counts (one process each).")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed calls per round (median; halved for ResNet-50).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved timing rounds (median over rounds).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype of the JAX model.")
_TORCH = flags.DEFINE_bool("torch", False, "Also time PyTorch eager (needs torch installed).")
_PEAK = flags.DEFINE_float("peak_gflops", 157.0, "Peak GFLOP/s for the % peak column.")
_JSON = flags.DEFINE_string("json", None, "Write all results here.")
_WORKER = flags.DEFINE_bool("worker", False, "Internal: run the rows in this process and print JSON.")


def selected() -> list[tuple[str, str]]:
    """(label, cpu_kernels mode) per configuration, from --cpu_kernels."""
    for m in _CPU_KERNELS.value:
        check(m in MODES, "--cpu_kernels", m, f"allowed: {', '.join(MODES)}")
    return [(m, m) for m in _CPU_KERNELS.value]


def network_flops(name: str, classes: int, size: int, channels: int, step_args) -> float | None:
    """FLOPs of one train step, from XLA's cost analysis of the step built with the CPU switch off.

    The same count for every setting: XLA cannot see inside the native kernels' custom calls, so the step that
    uses them would be under-counted.
    """
    import jax
    import optax

    from jaxsprint.train import cpu, models, trainer

    model = models.create_model(name, num_classes=classes, **cpu.acceleration("off").model_kwargs())
    tx = optax.sgd(0.01, momentum=0.9)
    state = jax.eval_shape(lambda k: trainer.create_train_state(k, model, tx, (1, size, size, channels)),
                           jax.random.key(0))
    step = trainer.make_train_step(model=model, num_classes=classes)
    return benchlib.compiled_flops(jax.jit(step), state, *step_args)


def worker(rows: list[str], configs: list[tuple[str, str]], steps: int, rounds: int, dtype: str,
           with_torch: bool) -> list[dict]:
    from jaxsprint.train import cpu

    print(cpu.configure_host_memory("auto"), file=sys.stderr, flush=True)  # before JAX starts
    import jax
    import numpy as np
    import optax

    from jaxsprint.train import models, parallel, trainer

    if with_torch:
        benchlib.set_torch_threads()
    out = []
    n_dev = jax.device_count()
    mesh = parallel.make_mesh(-1)
    rep, dat = parallel.replicated(mesh), parallel.data_sharding(mesh)
    for row in rows:
        name, batch = row.split(":")
        batch = int(batch)
        size, channels, classes = benchlib.SHAPES[name]
        n_steps = steps if name == "resnet20" else max(1, steps // 2)
        rng = np.random.default_rng(0)
        images = jax.device_put(rng.normal(size=(batch, size, size, channels)).astype(np.float32), dat)
        labels = jax.device_put(rng.integers(0, classes, batch).astype(np.int32), dat)
        weights = jax.device_put(np.ones(batch, np.float32), dat)
        flops = network_flops(name, classes, size, channels, (images, labels, weights)) if n_dev == 1 else None
        fns = {}  # (label, kind) -> callable; all built (and compiled) first, then timed interleaved
        for label, mode in configs:
            accel = cpu.acceleration(mode, field="--cpu_kernels")
            model = models.create_model(name, num_classes=classes, dtype=dtype, **accel.model_kwargs())
            tx = optax.sgd(0.01, momentum=0.9)
            state = jax.jit(lambda k: trainer.create_train_state(k, model, tx, (1, size, size, channels)),
                            out_shardings=rep)(jax.random.key(0))
            step = trainer.make_train_step(model=model, num_classes=classes, num_shards=n_dev, mesh=mesh)
            jstep = jax.jit(step, in_shardings=(rep, dat, dat, dat), out_shardings=(rep, rep), donate_argnums=0,
                            compiler_options=accel.compiler_options)
            fwd = jax.jit(lambda v, x: model.apply(v, x, train=False), in_shardings=(rep, dat), out_shardings=dat,
                          compiler_options=accel.compiler_options)
            variables = jax.tree.map(lambda a: a.copy(), {"params": state.params, "batch_stats": state.batch_stats})
            holder = {"state": state}

            def run_step(holder=holder, jstep=jstep):
                holder["state"], m = jstep(holder["state"], images, labels, weights)
                jax.block_until_ready(m["loss"])

            def run_fwd(fwd=fwd, variables=variables):
                jax.block_until_ready(fwd(variables, images))

            fns[(label, "fwd")], fns[(label, "step")] = run_fwd, run_step
        if with_torch:
            fns[("torch", "step")] = benchlib.torch_train_step(name, batch)
        timed = benchlib.interleaved(fns, rounds=rounds, calls=n_steps)
        torch_ips = batch / timed[("torch", "step")]["median_s"] if with_torch else None
        for label, _ in configs:
            step_s, fwd_s = timed[(label, "step")]["median_s"], timed[(label, "fwd")]["median_s"]
            out.append({"row": row, "impl": label, "devices": n_dev, "step_s": step_s, "forward_s": fwd_s,
                        "images_per_s": batch / step_s, "train_flops": flops,
                        "page_faults_per_step": timed[(label, "step")]["page_faults_per_call"],
                        "torch_images_per_s": torch_ips})
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def main(argv):
    del argv
    rows = _ROWS.value
    for r in rows:
        name, _, batch = r.partition(":")
        check(name in benchlib.SHAPES and batch.isdigit() and int(batch) > 0, "--rows", r,
              f"allowed: model:batch with model in {', '.join(sorted(benchlib.SHAPES))} and a positive batch")
    configs = selected()
    check(_STEPS.value >= 1, "--steps", _STEPS.value, "must be positive")
    check(_ROUNDS.value >= 1, "--rounds", _ROUNDS.value, "must be positive")
    for d in _DEVICES.value:
        check(d.isdigit() and int(d) > 0, "--devices", d, "allowed: positive device counts")
    if _WORKER.value:
        print(json.dumps(worker(rows, configs, _STEPS.value, _ROUNDS.value, _DTYPE.value, _TORCH.value)))
        return
    results = []
    for n in [int(d) for d in _DEVICES.value]:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}", JAX_PLATFORMS="cpu")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"--rows={','.join(rows)}",
               f"--steps={_STEPS.value}", f"--rounds={_ROUNDS.value}", f"--dtype={_DTYPE.value}",
               f"--torch={_TORCH.value}"]
        cmd.append(f"--cpu_kernels={','.join(_CPU_KERNELS.value)}")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode:
            raise ConfigError("--devices", n, f"the worker process failed:\n{r.stderr[-3000:]}")
        results += json.loads(r.stdout.strip().splitlines()[-1])
    flops = {x["row"]: x["train_flops"] for x in results if x["train_flops"]}
    header = ["network:batch", "conv", "devices", "step ms", "fwd ms", "step/fwd", "img/s", "GFLOP/s", "% peak",
              "faults/step"]
    if _TORCH.value:
        header += ["torch img/s", "vs torch"]
    table = []
    for x in results:
        f = flops.get(x["row"])
        gflops = f / x["step_s"] / 1e9 if f else float("nan")
        line = [x["row"], x["impl"], str(x["devices"]), f"{1000 * x['step_s']:.0f}", f"{1000 * x['forward_s']:.0f}",
                f"{x['step_s'] / x['forward_s']:.2f}", f"{x['images_per_s']:.1f}", f"{gflops:.1f}",
                f"{100 * gflops / _PEAK.value:.1f}", f"{x['page_faults_per_step']:.0f}"]
        if _TORCH.value:
            t = x["torch_images_per_s"]
            line += [f"{t:.1f}", f"{x['images_per_s'] / t:.2f}x"]
        table.append(line)
    print(benchlib.format_table(header, table))
    if _JSON.value:
        benchlib.write_json(_JSON.value, {"results": results})


if __name__ == "__main__":
    cli.run(main)
