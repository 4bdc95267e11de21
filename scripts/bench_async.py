r"""Step-time overhead and buffer memory of the delayed-gradient emulator on the default (demo) model.

Same process, same batch, same jitted step factory: the plain optimizer against optax.chain(delayed_gradients,
optimizer) at --max_staleness, without and with DC-ASGD (which also buffers the weights). Timed alike
(scripts/benchlib.py): warm-up, then --steps interleaved rounds of one call each, median step time.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python scripts/bench_async.py [--steps=10]
"""
from absl import flags

import benchlib
from jaxsprint import cli
from jaxsprint.errors import check

_STEPS = flags.DEFINE_integer("steps", 10, "Interleaved timed steps per variant (median).")
_MAX_STALENESS = flags.DEFINE_integer("max_staleness", 16, "Staleness of the emulated variants (uniform 0..max).")


def main(argv):
    del argv
    check(_STEPS.value >= 1, "--steps", _STEPS.value, "must be positive")
    check(_MAX_STALENESS.value >= 1, "--max_staleness", _MAX_STALENESS.value, "must be positive")
    from experiments.configs import default
    from jaxsprint.train import cpu

    config = default.get_config()
    print(cpu.configure_host_memory(config.cpu_kernels), flush=True)  # as the trainer does, before JAX starts
    import jax
    import numpy as np
    import optax

    from jaxsprint.train import parallel, trainer
    from jaxsprint.emulation import staleness

    exp = trainer.build_experiment(config)
    tau = _MAX_STALENESS.value
    variants = {
        "plain": exp.tx,
        f"delayed (max {tau})": optax.chain(staleness.delayed_gradients(tau, staleness.uniform(tau)), exp.tx),
        f"delayed + DC-ASGD (max {tau})": optax.chain(
            staleness.delayed_gradients(tau, staleness.uniform(tau), mitigation="dc_asgd"), exp.tx),
    }
    rep, dat = parallel.replicated(exp.mesh), parallel.data_sharding(exp.mesh)
    b = exp.hp.global_batch
    batch = exp.dataset.train.get_batch(np.arange(b))
    arrays = parallel.shard_batch({**batch, "w": np.ones(b, np.float32)}, exp.mesh)
    images = exp.eval_preprocess(arrays["image"])
    shape = (1, config.image_size, config.image_size, exp.dataset.channels)
    runners, mem = {}, {}
    for name, tx in variants.items():
        state = jax.jit(lambda k, tx=tx: trainer.create_train_state(k, exp.model, tx, shape), out_shardings=rep)(
            jax.random.key(0))
        step = jax.jit(trainer.make_train_step(model=exp.model, num_classes=exp.dataset.num_classes,
                                             num_shards=exp.mesh.size, mesh=exp.mesh),
                       in_shardings=(rep, dat, dat, dat), out_shardings=(rep, rep), donate_argnums=0,
                       compiler_options=exp.accel.compiler_options)
        d = staleness.find_delayed_state(state.opt_state)
        mem[name] = staleness.buffer_nbytes(d) if d is not None else 0
        holder = {"s": state}

        def run(step=step, holder=holder):
            holder["s"], m = step(holder["s"], images, arrays["label"], arrays["w"])
            jax.block_until_ready(m["loss"])

        runners[name] = run
    timed = benchlib.interleaved(runners, rounds=_STEPS.value, calls=1)
    params_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(exp.init_state().params))
    plain = timed["plain"]["median_s"]
    print(f"default model ({config.model}, {config.image_size}x{config.image_size}, batch {b}, "
          f"{exp.mesh.size} devices); parameters {params_bytes / 1e6:.2f} MB")
    rows = []
    for name in runners:
        t = timed[name]["median_s"]
        rows.append([name, f"{1000 * t:.1f}", f"{100 * (t / plain - 1):.1f}%", f"{mem[name] / 1e6:.2f}",
                     f"{mem[name] / params_bytes:.1f}"])
    print(benchlib.format_table(["variant", "step ms", "overhead", "buffer MB", "x params"], rows))


if __name__ == "__main__":
    cli.run(main)
