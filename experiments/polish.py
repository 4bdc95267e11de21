r"""Final Polishing of an existing run: recompute BN statistics from un-augmented training images, evaluate.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/polish.py \
      --config=experiments/configs/default.py --workdir=runs/demo-... [--config.polish.num_samples=-1]

Reads the weights and BN statistics of the latest checkpoint in --workdir (`checkpoint.restore_variables`):
a run of experiments/train.py with the same --config, or of experiments/run_sprint.py with its SPRINT config
(``--config=experiments/configs/sprint.py``: the statistics the SPRINT updater published). Prints top-1
accuracy and loss with the run's (EMA) statistics and with the recomputed ones, side by side, and writes both
to WORKDIR/polish.json, its resolved config to WORKDIR/polish_config.json and the polished statistics to
WORKDIR/polished_batch_stats/ (orbax: the tree of a checkpoint's ``polished_batch_stats`` entry). The run's
own checkpoints (and config.json) are left as they are. --workdir may be a local path or a URI (file://...).
"""
import copy
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments import common_flags  # noqa: E402
from jaxsprint import cli, paths  # noqa: E402
from jaxsprint.errors import CheckpointError, ConfigError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "The run's ml_collections config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The run's directory (with checkpoints/).")
_CLUSTER = common_flags.define_cluster_flags()  # several processes: as experiments/train.py (jaxsprint.cluster)


def main(argv):
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides flags")
    if _CONFIG.value is None or not _WORKDIR.value:
        raise ConfigError("--config/--workdir", (_CONFIG.value is not None, _WORKDIR.value),
                          "both are required")
    workdir = paths.as_path(_WORKDIR.value)
    if not (workdir / "checkpoints").is_dir():
        raise CheckpointError("--workdir", _WORKDIR.value, "it holds no checkpoints/ directory")
    cli.check_output_dir("--workdir", _WORKDIR.value)
    import jax
    import orbax.checkpoint as ocp

    from jaxsprint.train import checkpoint, cpu, metrics, models, parallel, settings, trainer

    config = _CONFIG.value
    cpu.validate_config(config)
    cpu.configure_host_memory(config.cpu_kernels)  # before JAX starts its threads
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    from jaxsprint import cluster

    cluster.initialize(**_CLUSTER.values())  # before JAX's backend starts; a no-op for one process
    if not models.has_batchnorm(config.model):
        raise ConfigError("config.model", config.model, "a model with BatchNorm (polishing recomputes its "
                          "statistics)")
    polishing = copy.deepcopy(config)  # checked as a run that recomputes (whatever its polish.mode was)
    with polishing.unlocked():
        polishing.polish.mode = "recompute" if config.polish.mode in ("none", "recompute") else "both"
    settings.validate_run(polishing, parallel.make_mesh(config.num_devices).size)
    exp = trainer.build_experiment(config)
    state = exp.init_state()  # the template: structure, shapes and shardings of what is read
    restored = checkpoint.restore_variables(workdir, {"params": state.params, "batch_stats": state.batch_stats},
                                            resume=config.get("resume", "latest"))
    if restored is None:
        raise CheckpointError("--workdir", _WORKDIR.value, f"no checkpoint found in {workdir / 'checkpoints'}")
    params, batch_stats, step = restored
    state = state.replace(params=params, batch_stats=batch_stats)
    before = exp.evaluate({"params": params, "batch_stats": batch_stats})
    t0 = time.time()
    info = {}
    stats = exp.polish(state, info)
    seconds = time.time() - t0
    after = exp.evaluate({"params": params, "batch_stats": stats})
    result = {"step": int(step), "ema_accuracy": before["accuracy"], "ema_loss": before["loss"],
              "polished_accuracy": after["accuracy"], "polished_loss": after["loss"], "polish_time_s": seconds,
              "num_samples": config.polish.num_samples, "num_passes": info["passes"],
              "last_change": info["change"]}
    if jax.process_index() == 0:
        (workdir / "polish.json").write_text(json.dumps(result, indent=2))
        cli.write_config(os.fspath(workdir), config, name="polish_config.json")  # beside the run's config.json
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(workdir / "polished_batch_stats", stats, force=True)  # replicated global arrays: every process
    ckptr.wait_until_finished()
    print(metrics.summary_table([
        ("checkpoint step", str(step)),
        ("eval top-1, EMA statistics", f"{100 * before['accuracy']:.2f}%"),
        ("eval top-1, polished statistics", f"{100 * after['accuracy']:.2f}%"),
        ("eval loss, EMA / polished", f"{before['loss']:.4f} / {after['loss']:.4f}"),
        ("polishing", f"{info['passes']} passes, {seconds:.1f} s"),
    ]))


if __name__ == "__main__":
    cli.run(main)
