r"""What measuring the gradient noise scale costs a training step: the plain step against the measuring one.

The measuring step (``config.noise_scale.enabled``, jaxsprint/train/noise.py) computes each device's gradients
under ``jax.shard_map`` and adds one squared norm per device and micro-batch; the plain step is the trainer's
GSPMD program. Rows are ``model:image size:global batch:devices:accumulation steps`` of the noise-scale config
(experiments/configs/noise_scale.py) on the built-in data; both steps of a row are compiled first and then
timed in interleaved rounds (benchlib.interleaved; the median of each round, then over rounds).

  .venv/bin/python scripts/bench_noise.py [--rows=resnet8:16:128:8:1,...] [--rounds=5] [--json=out.json]

Prints a table (ms per step, plain and measuring, and their ratio); never asserts a time.
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

from absl import flags  # noqa: E402

import benchlib  # noqa: E402  (puts the repository root on sys.path)
from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import ConfigError, check  # noqa: E402

ROWS = ["resnet8:16:128:8:1", "resnet8:28:256:8:1", "resnet20:16:128:8:1", "resnet8:16:128:1:2",
        "resnet8:16:128:2:4"]
_ROWS = flags.DEFINE_list("rows", ROWS, "model:image:batch:devices:accum rows (digits at 8 or 16, mnist5k at 28).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds (median over rounds).")
_CALLS = flags.DEFINE_integer("calls", 10, "Timed calls per step and round (median).")
_JSON = flags.DEFINE_string("json", None, "Write the rows here as JSON.")


def parse_row(text: str) -> dict:
    parts = text.split(":")
    allowed = "model:image:batch:devices:accum, e.g. resnet8:16:128:8:1 (image 28 reads mnist5k)"
    check(len(parts) == 5 and all(p.isdigit() for p in parts[1:]), "--rows", text, allowed)
    model, image, batch, devices, accum = parts[0], *(int(p) for p in parts[1:])
    check(devices in (1, 2, 4, 8) and devices * accum >= 2, "--rows", text,
          f"{allowed}; devices in 1, 2, 4, 8 and devices x accum >= 2")
    return {"model": model, "image_size": image, "batch_size": batch, "num_devices": devices,
            "grad_accum_steps": accum, "dataset": "mnist5k" if image == 28 else "digits"}


def time_row(row: dict) -> dict:
    import jax
    import numpy as np

    from experiments.configs import noise_scale
    from jaxsprint.train import settings, trainer

    steps = {}
    for name, measuring in (("plain", False), ("measuring", True)):
        c = noise_scale.get_config()
        c.update(row)
        c.eval_batch_size = 8 * row["num_devices"]
        c.noise_scale.enabled = measuring
        settings.validate_config(c, row["num_devices"])
        exp = trainer.build_experiment(c)
        batch = exp.dataset.train.get_batch(np.arange(row["batch_size"]) % exp.dataset.num_train)
        from jaxsprint.train import parallel

        arrays = parallel.shard_batch({"image": batch["image"], "label": batch["label"],
                                       "w": np.ones(row["batch_size"], np.float32)}, exp.mesh)
        x = exp.eval_preprocess(arrays["image"])
        box = [exp.init_state()]

        def call(exp=exp, box=box, x=x, arrays=arrays):
            box[0], m = exp.train_step(box[0], x, arrays["label"], arrays["w"])
            jax.block_until_ready(m["loss"])

        steps[name] = call
    times = benchlib.interleaved(steps, rounds=_ROUNDS.value, calls=_CALLS.value)
    plain, meas = times["plain"]["median_s"], times["measuring"]["median_s"]
    return dict(row, plain_ms=1000 * plain, measuring_ms=1000 * meas, ratio=meas / plain,
                round_medians_s={k: v["round_medians_s"] for k, v in times.items()})


def main(argv):
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides flags")
    rows = [parse_row(r) for r in _ROWS.value]
    check(_ROUNDS.value >= 1 and _CALLS.value >= 1, "--rounds/--calls", (_ROUNDS.value, _CALLS.value),
          "integers >= 1")
    if _JSON.value:
        cli.check_output_file("--json", _JSON.value)
    results = [time_row(r) for r in rows]
    table = [[f"{r['model']} {r['dataset']} {r['image_size']}px", str(r["batch_size"]), str(r["num_devices"]),
              str(r["grad_accum_steps"]), f"{r['plain_ms']:.1f}", f"{r['measuring_ms']:.1f}", f"{r['ratio']:.3f}"]
             for r in results]
    print(benchlib.format_table(["row", "batch", "devices", "accum", "plain ms", "measuring ms", "ratio"], table))
    if _JSON.value:
        benchlib.write_json(_JSON.value, {"rows": results})


if __name__ == "__main__":
    cli.run(main)
