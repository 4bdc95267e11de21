r"""Step-time overhead and buffer memory of the delayed-gradient emulator on the default (demo) model.

Same process, same batch, same jitted step factory: the plain optimizer against optax.chain(delayed_gradients,
optimizer) at max_staleness 16, without and with DC-ASGD (which also buffers the weights). Interleaved
repetitions, median step time.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python scripts/bench_async.py [--steps=10]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--max_staleness", type=int, default=16)
    args = p.parse_args()
    import jax
    import numpy as np
    import optax

    from experiments.configs import default
    from jaxsprint import staleness, train

    config = default.get_config()
    exp = train.build_experiment(config)
    base_tx = exp.tx
    variants = {
        "plain": base_tx,
        f"delayed (max {args.max_staleness})": optax.chain(
            staleness.delayed_gradients(args.max_staleness, staleness.uniform(args.max_staleness)), base_tx),
        f"delayed + DC-ASGD (max {args.max_staleness})": optax.chain(
            staleness.delayed_gradients(args.max_staleness, staleness.uniform(args.max_staleness),
                                        mitigation="dc_asgd"), base_tx),
    }
    from jaxsprint import parallel

    rep, dat = parallel.replicated(exp.mesh), parallel.data_sharding(exp.mesh)
    b = exp.hp.global_batch
    batch = exp.dataset.train.get_batch(np.arange(b))
    arrays = parallel.shard_batch({**batch, "w": np.ones(b, np.float32)}, exp.mesh)
    images = exp.eval_preprocess(arrays["image"])
    shape = (1, config.image_size, config.image_size, exp.dataset.channels)
    runners, mem = {}, {}
    for name, tx in variants.items():
        state = jax.jit(lambda k, tx=tx: train.create_train_state(k, exp.model, tx, shape), out_shardings=rep)(
            jax.random.key(0))
        step = jax.jit(train.make_train_step(model=exp.model, num_classes=10, num_shards=exp.mesh.size,
                                             mesh=exp.mesh), in_shardings=(rep, dat, dat, dat),
                       out_shardings=(rep, rep), donate_argnums=0)
        d = staleness.find_delayed_state(state.opt_state)
        mem[name] = staleness.buffer_nbytes(d) if d is not None else 0
        holder = {"s": state}

        def run(step=step, holder=holder):
            holder["s"], m = step(holder["s"], images, arrays["label"], arrays["w"])
            jax.block_until_ready(m["loss"])

        run()
        run()
        runners[name] = run
    times = {k: [] for k in runners}
    for _ in range(args.steps):
        for name, run in runners.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    params_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(exp.init_state().params))
    plain = statistics.median(times["plain"])
    print(f"default model ({config.model}, {config.image_size}x{config.image_size}, batch {b}, "
          f"{exp.mesh.size} devices); parameters {params_bytes / 1e6:.2f} MB")
    print(f"{'variant':<34} | {'step ms':>8} | {'overhead':>8} | {'buffer MB':>9} | {'x params':>8}")
    for name in runners:
        t = statistics.median(times[name])
        print(f"{name:<34} | {1000 * t:8.1f} | {100 * (t / plain - 1):7.1f}% | {mem[name] / 1e6:9.2f} | "
              f"{mem[name] / params_bytes:8.1f}")


if __name__ == "__main__":
    main()
