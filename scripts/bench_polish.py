r"""Final Polishing cost on the default (demo) model: pass throughput beside the train step, and the whole
pass (iterated to convergence over the training set) as a fraction of one training epoch.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python scripts/bench_polish.py [--steps=10]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _median_time(fn, n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    import jax
    import numpy as np

    from experiments.configs import default
    from jaxsprint import parallel, polish, train

    config = default.get_config()
    exp = train.build_experiment(config)
    b = exp.hp.global_batch
    state = exp.init_state()
    batch = exp.dataset.train.get_batch(np.arange(b))
    arrays = parallel.shard_batch({**batch, "w": np.ones(b, np.float32), "m": np.ones(b, np.float32)}, exp.mesh)
    images = exp.eval_preprocess(arrays["image"])
    holder = {"s": state}

    def step():
        holder["s"], m = exp.train_step(holder["s"], images, arrays["label"], arrays["w"])
        jax.block_until_ready(m["loss"])

    moments = polish.jit_moments_fn(exp.model, exp.mesh)
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    variables = jax.tree.map(lambda a: a.copy(), variables)

    def fwd():
        jax.block_until_ready(moments(variables, images, arrays["m"]))

    step(), fwd()
    t_step, t_fwd = _median_time(step, args.steps), _median_time(fwd, args.steps)
    info = {}
    t0 = time.perf_counter()
    train.run_polish(exp, holder["s"], info)
    t_pass = time.perf_counter() - t0
    epoch_s = t_step * exp.hp.steps_per_epoch
    print(f"default model ({config.model}, {config.image_size}x{config.image_size}, batch {b}, "
          f"{exp.mesh.size} devices)")
    print(f"{'what':<44} | {'value':>12}")
    print(f"{'train step':<44} | {b / t_step:8.0f} img/s")
    print(f"{'polishing forward pass (moments)':<44} | {b / t_fwd:8.0f} img/s")
    print(f"{'ratio pass / train step':<44} | {t_step / t_fwd:11.2f}x")
    print(f"{'whole polish (' + str(info['passes']) + ' passes x ' + str(exp.dataset.num_train) + ' images)':<44}"
          f" | {t_pass:10.2f} s")
    print(f"{'one training epoch (' + str(exp.hp.steps_per_epoch) + ' steps)':<44} | {epoch_s:10.2f} s")
    print(f"{'polish / epoch':<44} | {t_pass / epoch_s:11.2f}x")


if __name__ == "__main__":
    main()
