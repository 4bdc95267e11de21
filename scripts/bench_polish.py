r"""Final Polishing cost on the default (demo) model: pass throughput beside the train step, and the whole
pass (iterated to convergence over the training set) as a fraction of one training epoch.

The train step and the polishing forward pass are timed alike (scripts/benchlib.py: warm-up, then --rounds
interleaved rounds of the median of --steps calls); the whole polish runs once, as ``Experiment.polish`` runs it,
after its program has compiled (the compilation is timed apart).

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python scripts/bench_polish.py [--steps=10] \
      [--json=FILE]

--json also writes the figures of the table (seconds and images/s) to FILE (scripts/gpu_check.sh's polish part).
"""
import time

from absl import flags

import benchlib
from jaxsprint import cli
from jaxsprint.errors import check

_STEPS = flags.DEFINE_integer("steps", 10, "Timed calls per round (median).")
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Interleaved timing rounds (median over rounds).")
_JSON = flags.DEFINE_string("json", None, "Also write the figures to this JSON file.")


def main(argv):
    del argv
    check(_STEPS.value >= 1, "--steps", _STEPS.value, "must be positive")
    check(_ROUNDS.value >= 1, "--rounds", _ROUNDS.value, "must be positive")
    from experiments.configs import default
    from jaxsprint.train import cpu

    config = default.get_config()
    print(cpu.configure_host_memory(config.cpu_kernels), flush=True)  # as the trainer does, before JAX starts
    import jax
    import numpy as np

    from jaxsprint.train import parallel, polish, trainer

    exp = trainer.build_experiment(config)
    b = exp.hp.global_batch
    state = exp.init_state()
    batch = exp.dataset.train.get_batch(np.arange(b))
    arrays = parallel.shard_batch({**batch, "w": np.ones(b, np.float32), "m": np.ones(b, np.float32)}, exp.mesh)
    images = exp.eval_preprocess(arrays["image"])
    holder = {"s": state}

    def step():
        holder["s"], m = exp.train_step(holder["s"], images, arrays["label"], arrays["w"])
        jax.block_until_ready(m["loss"])

    moments = polish.jit_moments_fn(exp.model, exp.mesh, compiler_options=exp.accel.compiler_options)
    variables = jax.tree.map(lambda a: a.copy(), {"params": state.params, "batch_stats": state.batch_stats})

    def fwd():
        jax.block_until_ready(moments(variables, images, arrays["m"]))

    timed = benchlib.interleaved({"step": step, "fwd": fwd}, rounds=_ROUNDS.value, calls=_STEPS.value, warmup=1)
    t_step, t_fwd = timed["step"]["median_s"], timed["fwd"]["median_s"]
    # The whole polish as exp.polish runs it, its program compiled first (exp.polish compiles inside its call).
    pass_fn = polish.jit_moments_fn(exp.model, exp.mesh, exp.eval_preprocess, exp.accel.compiler_options)
    polish_batches = exp.polish_batches(config.polish.num_samples)
    first = parallel.shard_batch(polish_batches[0], exp.mesh)
    t0 = time.perf_counter()
    jax.block_until_ready(pass_fn(variables, first["image"], first["mask"]))
    t_compile = time.perf_counter() - t0
    info = {}
    t0 = time.perf_counter()
    polish.recompute_batch_stats(
        exp.model, {"params": holder["s"].params, "batch_stats": holder["s"].batch_stats}, polish_batches,
        mesh=exp.mesh, num_samples=None, num_passes=config.polish.num_passes, moments_fn=pass_fn, info=info)
    t_pass = time.perf_counter() - t0
    epoch_s = t_step * exp.hp.steps_per_epoch
    print(f"default model ({config.model}, {config.image_size}x{config.image_size}, batch {b}, "
          f"{exp.mesh.size} devices)")
    print(benchlib.format_table(["what", "value"], [
        ["train step", f"{b / t_step:.0f} img/s"],
        ["polishing forward pass (moments)", f"{b / t_fwd:.0f} img/s"],
        ["ratio pass / train step", f"{t_step / t_fwd:.2f}x"],
        ["polish program: compilation + first batch", f"{t_compile:.2f} s"],
        [f"whole polish ({info['passes']} passes x {exp.dataset.num_train} images)", f"{t_pass:.2f} s"],
        [f"one training epoch ({exp.hp.steps_per_epoch} steps)", f"{epoch_s:.2f} s"],
        ["polish / epoch", f"{t_pass / epoch_s:.2f}x"]]))
    if _JSON.value:
        benchlib.write_json(_JSON.value, dict(
            model=config.model, image_size=config.image_size, dtype=config.dtype, batch=b, devices=exp.mesh.size,
            platform=jax.devices()[0].platform, train_step_s=t_step, train_images_per_s=b / t_step,
            moments_s=t_fwd, moments_images_per_s=b / t_fwd, polish_s=t_pass, polish_passes=info["passes"],
            polish_images_per_pass=exp.dataset.num_train, polish_compile_s=t_compile, epoch_s=epoch_s,
            polish_over_epoch=t_pass / epoch_s))


if __name__ == "__main__":
    cli.run(main)
