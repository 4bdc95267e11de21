r"""Throughput of SPRINT against the synchronous data-parallel step: same devices, same per-device batch.

For each learner count N of --learners, in one process:
  * **asynchronous**: ``jaxsprint.runtime.run`` with N learners on N devices at --sub_batch, no emulated
    network, for --duration_s; images/s after the warm-up (``runtime.events.statistics``: gradients that
    ended in the measured window x sub-batch / its length);
  * **synchronous**: ``jaxsprint.train.trainer``'s jitted step (``trainer.build_experiment``: the same model, optimizer
    and augmentation) on a mesh of the same N devices, global batch N x sub-batch, BatchNorm per device (the
    sub-batch, as a learner's), each step reading its batch from the host, for about as long; images/s over
    the steps after the first ones (compilation and warm-up).
SPRINT's point is that learners never wait: the ratio says what that buys on this machine (on a 2-core CPU the
learners also share the cores).

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python scripts/bench_sprint.py \
      [--learners=1,2,4,8] [--sub_batch=32] [--duration_s=10] [--json=FILE]
"""
import copy
import os
import shutil
import sys
import tempfile
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):  # before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import check  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(os.path.dirname(_HERE), "experiments", "configs",
                                                                 "sprint.py"), "SPRINT config.")
_LEARNERS = flags.DEFINE_list("learners", ["1", "2", "4", "8"], "Learner (= device) counts.")
_SUB_BATCH = flags.DEFINE_integer("sub_batch", 32, "Per-learner (= per-device) batch.")
_DURATION = flags.DEFINE_float("duration_s", 10.0, "Seconds of each asynchronous run and of each synchronous loop.")
_WARMUP = flags.DEFINE_float("warmup_s", 2.0, "Seconds left out at the start of each asynchronous run.")
_SYNC_WARMUP_STEPS = flags.DEFINE_integer("sync_warmup_steps", 3, "Synchronous steps left out (compile, warm-up).")
_JSON = flags.DEFINE_string("json", None, "Also write the rows to this JSON file.")


def asynchronous(config, learners: int) -> dict:
    """images/s (and the run's cycle statistics) of the runtime with `learners` learners."""
    from jaxsprint import runtime
    from jaxsprint.runtime import events

    c = copy.deepcopy(config)
    with c.unlocked():
        c.sprint.learners_per_host, c.sprint.sub_batch, c.sprint.network_time_s = learners, _SUB_BATCH.value, 0.0
        c.sprint.duration_s, c.sprint.num_updates, c.sprint.num_epochs = _DURATION.value, 0, 0.0
        c.sprint.warmup_s, c.sprint.checkpoint, c.sprint.eval_every_updates = _WARMUP.value, False, 0
    workdir = tempfile.mkdtemp(prefix="jaxsprint-bench-sprint-")
    try:
        st = events.statistics(runtime.run(c, workdir).events)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {k: st[k] for k in ("images_per_s", "t_compute_s", "t_update_s", "mean_minibatch", "mean_staleness",
                               "gradients")}


def synchronous(config, devices: int) -> dict:
    """images/s of the synchronous data-parallel train step on `devices` devices, per-device batch sub_batch."""
    import jax
    import numpy as np

    from jaxsprint.train import parallel, trainer

    c = copy.deepcopy(config)
    with c.unlocked():
        c.num_devices, c.batch_size, c.grad_accum_steps = devices, devices * _SUB_BATCH.value, 1
        c.bn.reduction = "per_device"
        c.num_train_steps = 1_000_000
        c.async_emulation.enabled = False
    exp = trainer.build_experiment(c)
    b = exp.hp.global_batch
    state = exp.init_state()
    ones = parallel.shard_batch({"w": np.ones(b, np.float32)}, exp.mesh)["w"]
    rng = np.random.default_rng(0)
    key = jax.random.key(0)
    steps, t_start, start = 0, None, time.perf_counter()
    while True:
        batch = exp.dataset.train.get_batch(np.sort(rng.choice(exp.dataset.num_train, b, replace=False)))
        arrays = parallel.shard_batch(batch, exp.mesh)
        images = exp.train_preprocess(jax.random.fold_in(key, steps), arrays["image"])
        state, metrics = exp.train_step(state, images, arrays["label"], ones)
        jax.block_until_ready(metrics)
        steps += 1
        if steps == _SYNC_WARMUP_STEPS.value:
            t_start, counted = time.perf_counter(), 0
        elif t_start is not None:
            counted += 1
            if time.perf_counter() - start >= _DURATION.value and counted >= 2:
                break
    elapsed = time.perf_counter() - t_start
    return {"images_per_s": b * counted / elapsed, "step_s": elapsed / counted, "steps": counted}


def main(argv):
    del argv
    import jax

    learners = []
    for v in _LEARNERS.value:
        check(v.isdigit() and int(v) >= 1, "--learners", v, "comma-separated integers >= 1")
        learners.append(int(v))
    n_dev = len(jax.local_devices())
    check(max(learners) <= n_dev, "--learners", max(learners), f"at most the local devices ({n_dev})")
    check(_SUB_BATCH.value >= 1, "--sub_batch", _SUB_BATCH.value, "an integer >= 1")
    check(_DURATION.value > _WARMUP.value >= 0, "--duration_s", _DURATION.value,
          f"longer than --warmup_s={_WARMUP.value} (which is >= 0)")
    check(_SYNC_WARMUP_STEPS.value >= 1, "--sync_warmup_steps", _SYNC_WARMUP_STEPS.value, "an integer >= 1")
    import benchlib
    from jaxsprint import runtime

    config = _CONFIG.value
    for n in learners:  # every configuration checked before the first run
        c = copy.deepcopy(config)
        with c.unlocked():
            c.sprint.learners_per_host, c.sprint.sub_batch = n, _SUB_BATCH.value
        runtime.validate_config(c, n_dev)
    rows = []
    for n in learners:
        a = asynchronous(config, n)
        s = synchronous(config, n)
        rows.append(dict(learners=n, sub_batch=_SUB_BATCH.value, asynchronous=a, synchronous=s,
                         ratio=a["images_per_s"] / s["images_per_s"]))
        print(f"{n} learners: async {a['images_per_s']:.0f} images/s, sync {s['images_per_s']:.0f} images/s",
              flush=True)
    header = ["learners", "async images/s", "sync images/s", "async / sync", "async T_c ms", "async T_u ms",
              "async mean mini-batch", "async mean staleness", "sync step ms"]
    table = [[str(r["learners"]), f"{r['asynchronous']['images_per_s']:.0f}", f"{r['synchronous']['images_per_s']:.0f}",
              f"{r['ratio']:.2f}", f"{1e3 * r['asynchronous']['t_compute_s']:.1f}",
              f"{1e3 * r['asynchronous']['t_update_s']:.2f}", f"{r['asynchronous']['mean_minibatch']:.1f}",
              f"{r['asynchronous']['mean_staleness']:.2f}", f"{1e3 * r['synchronous']['step_s']:.1f}"] for r in rows]
    print(f"\n{config.model} at {config.image_size}x{config.image_size} on {config.dataset}, per-device batch "
          f"{_SUB_BATCH.value}, {jax.devices()[0].platform} x {n_dev} devices")
    print(benchlib.format_table(header, table))
    if _JSON.value:
        benchlib.write_json(_JSON.value, dict(rows=rows, model=config.model, image_size=config.image_size))


if __name__ == "__main__":
    cli.run(main)
