r"""Train-step throughput and model FLOP utilisation on one accelerator: ResNet-50, 224x224, bfloat16, batch 256.

The project's own step (``jaxsprint.train.trainer.make_train_step``, SGD with momentum, jitted with the state donated)
on one device. FLOPs per step come from XLA's cost analysis of the compiled step (the program that runs, so
the backward pass and the optimizer update are counted as XLA executes them). After --warmup steps, --rounds
rounds of --steps back-to-back steps are timed, blocking once per round (scripts/benchlib.py
``pipelined_seconds``: the device's throughput, as in a training loop); the median round gives

  images/s = batch / step_s,   MFU = FLOPs per step / step_s / peak FLOP/s.

Peak (--peak_flops, default 989.5e12): NVIDIA H200 SXM dense BF16 Tensor Core throughput, half of the
1,979 TFLOPS "with sparsity" of NVIDIA's H200 datasheet (https://www.nvidia.com/en-us/data-center/h200/;
H200 NVL: 1,671 TFLOPS with sparsity, pass --peak_flops=835.5e12). The JSON records the device kind, so a run on
another chip is not silently compared with the H200's peak.

  python scripts/bench_gpu.py [--batch=256] [--image_size=224] [--json=bench_gpu.json]
  JAX_PLATFORMS=cpu python scripts/bench_gpu.py --batch=2 --image_size=64 --steps=1 --rounds=1   # plumbing only
"""
from __future__ import annotations

import json
import statistics
import time

from absl import flags

import benchlib
from jaxsprint import cli
from jaxsprint.errors import check

H200_SXM_DENSE_BF16_FLOPS = 989.5e12  # NVIDIA H200 datasheet: 1,979 TFLOPS BF16 with 2:4 sparsity, / 2

_MODEL = flags.DEFINE_string("model", "resnet50", "Network of jaxsprint.train.models.")
_BATCH = flags.DEFINE_integer("batch", 256, "Batch size (one device).")
_IMAGE = flags.DEFINE_integer("image_size", 224, "Image side in pixels.")
_CHANNELS = flags.DEFINE_integer("channels", 3, "Image channels (1 for the grey digits of the SPRINT config).")
_CLASSES = flags.DEFINE_integer("num_classes", 1000, "Logits.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Compute dtype (parameters stay f32).")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
_STEPS = flags.DEFINE_integer("steps", 20, "Back-to-back steps per timed round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds (median).")
_PEAK = flags.DEFINE_float("peak_flops", H200_SXM_DENSE_BF16_FLOPS, "Peak FLOP/s of the device for the MFU.")
_JSON = flags.DEFINE_string("json", None, "Write the figures here as JSON (they are printed either way).")


def measure(*, model_name: str, batch: int, image_size: int, num_classes: int, dtype: str, warmup: int,
            steps: int, rounds: int, peak_flops: float, channels: int = 3) -> dict:
    """Builds, compiles and times the train step on the first device; returns the figures (see module doc)."""
    import jax
    import numpy as np
    import optax

    from jaxsprint.train import models, trainer

    device = jax.devices()[0]
    model = models.create_model(model_name, num_classes=num_classes, dtype=dtype)
    tx = optax.sgd(0.1, momentum=0.9)
    shape = (1, image_size, image_size, channels)
    state = jax.jit(lambda k: trainer.create_train_state(k, model, tx, shape))(jax.random.key(0))
    rng = np.random.default_rng(0)
    images = jax.device_put(rng.normal(size=(batch, image_size, image_size, channels)).astype(np.float32), device)
    labels = jax.device_put(rng.integers(0, num_classes, batch).astype(np.int32), device)
    weights = jax.device_put(np.ones(batch, np.float32), device)
    step = jax.jit(trainer.make_train_step(model=model, num_classes=num_classes), donate_argnums=0)
    t0 = time.perf_counter()
    compiled = step.lower(state, images, labels, weights).compile()
    compile_s = time.perf_counter() - t0
    flops = benchlib.flops_of(compiled)
    holder = {"state": state, "loss": []}

    def run():
        holder["state"], m = compiled(holder["state"], images, labels, weights)
        return m["loss"]

    for _ in range(warmup):
        holder["loss"].append(float(run()))
    rounds_s = [benchlib.pipelined_seconds(run, steps) for _ in range(rounds)]
    last_loss = float(run())
    step_s = statistics.median(rounds_s)
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    out = {
        "model": model_name, "batch": batch, "image_size": image_size, "channels": channels,
        "num_classes": num_classes, "dtype": dtype,
        "platform": device.platform, "device_kind": device.device_kind, "jax_version": jax.__version__,
        "warmup_steps": warmup, "timed_steps": steps * rounds, "rounds": rounds,
        "compile_s": compile_s, "step_s": step_s, "round_step_s": rounds_s, "images_per_s": batch / step_s,
        "flops_per_step": flops, "flops_per_image": flops / batch if flops else None,
        "flops_source": "XLA cost analysis of the compiled train step",
        "achieved_flops_per_s": flops / step_s if flops else None, "peak_flops_per_s": peak_flops,
        "mfu": flops / step_s / peak_flops if flops else None,
        "peak_memory_bytes": (stats or {}).get("peak_bytes_in_use"),
        "first_loss": holder["loss"][0] if holder["loss"] else None, "last_loss": last_loss,
    }
    return out


def main(argv):
    del argv
    for name, flag in (("--batch", _BATCH), ("--image_size", _IMAGE), ("--channels", _CHANNELS),
                       ("--num_classes", _CLASSES), ("--steps", _STEPS), ("--rounds", _ROUNDS)):
        check(flag.value >= 1, name, flag.value, "must be positive")
    check(_WARMUP.value >= 0, "--warmup", _WARMUP.value, "must be >= 0")
    check(_PEAK.value > 0, "--peak_flops", _PEAK.value, "must be positive (FLOP/s)")
    from jaxsprint.train import models

    check(_MODEL.value in models.MODELS, "--model", _MODEL.value, f"allowed: {', '.join(sorted(models.MODELS))}")
    out = measure(model_name=_MODEL.value, batch=_BATCH.value, image_size=_IMAGE.value, num_classes=_CLASSES.value,
                  dtype=_DTYPE.value, warmup=_WARMUP.value, steps=_STEPS.value, rounds=_ROUNDS.value,
                  peak_flops=_PEAK.value, channels=_CHANNELS.value)
    mfu = f"{100 * out['mfu']:.1f}%" if out["mfu"] is not None else "n/a"
    flops = f"{out['flops_per_step'] / 1e12:.3g}" if out["flops_per_step"] else "n/a"
    print(benchlib.format_table(
        ["model", "batch", "image", "dtype", "device", "step ms", "img/s", "TFLOP/step", "MFU"],
        [[out["model"], str(out["batch"]), str(out["image_size"]), out["dtype"], out["device_kind"],
          f"{1000 * out['step_s']:.1f}", f"{out['images_per_s']:.0f}", flops, mfu]]))
    if _JSON.value:
        benchlib.write_json(_JSON.value, out)
    else:
        print(json.dumps(out))


if __name__ == "__main__":
    cli.run(main)
