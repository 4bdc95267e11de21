r"""Trains and evaluates a model as an ml_collections config says.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/train.py \
      --config=experiments/configs/default.py --workdir=/tmp/jaxsprint_demo [--config.batch_size=256 ...]

Several processes (one per host, or per GPU): under srun or mpirun, or with --coordinator_address (and
--num_processes/--process_id where no launcher gives them), `jaxsprint.cluster.initialize` joins them first
(docs/cluster.md; scripts/jobs/). A bad flag or config value exits with status 2 and one message.
The resolved config (the file's values with every override) is written to WORKDIR/config.json.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments import common_flags  # noqa: E402
from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import ConfigError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the summary.")
_CLUSTER = common_flags.define_cluster_flags()


def check_flags() -> None:
    """The launcher's own flags (the config is `jaxsprint.train.settings`'): before anything starts or is written."""
    from jaxsprint import cluster

    cluster.detect(os.environ, **_CLUSTER.values())  # the multi-process flags with the launcher's environment
    cli.check_output_dir("--workdir", _WORKDIR.value)


def main(argv):
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides flags")
    if _CONFIG.value is None:
        raise ConfigError("--config", None, "a config file is required (e.g. experiments/configs/default.py)")
    if not _WORKDIR.value:
        raise ConfigError("--workdir", _WORKDIR.value, "a directory is required")
    check_flags()
    from jaxsprint import cluster
    from jaxsprint.train import cpu, metrics, parallel, settings, trainer

    config = _CONFIG.value
    cpu.validate_config(config)
    allocator = cpu.configure_host_memory(config.cpu_kernels)  # before JAX starts its threads
    if not flags.FLAGS["verbosity"].present:  # libraries (orbax) log every save at INFO
        logging.set_verbosity(logging.WARNING)
    cluster.initialize(**_CLUSTER.values())  # before JAX's backend starts; a no-op for one process
    # Every setting, and the estimated memory, before the data is read or the workdir is touched.
    settings.validate_run(config, parallel.make_mesh(config.num_devices).size)
    logging.info(allocator)
    import jax

    # The resolved config (every override applied) goes into the workdir once the run has written there.
    with cli.config_beside_outputs(_WORKDIR.value, config, enabled=jax.process_index() == 0):
        summary = trainer.train_and_evaluate(config, _WORKDIR.value)
    print(metrics.format_summary(summary))
    logging.info("summary written to %s", os.path.join(_WORKDIR.value, "summary.json"))


if __name__ == "__main__":
    cli.run(main)
