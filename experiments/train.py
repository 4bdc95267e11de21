r"""Trains and evaluates a model as an ml_collections config says.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/train.py \
      --config=experiments/configs/default.py --workdir=/tmp/jaxsprint_demo [--config.batch_size=256 ...]

Multi-host: under SLURM (more than one task) or with --coordinator_address/--num_processes/--process_id,
jax.distributed.initialize() is called first. A bad flag or config value exits with status 2 and one message.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsprint.errors import JaxsprintError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the summary.")
_COORD = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process runs).")
_NPROC = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process runs).")
_PID = flags.DEFINE_integer("process_id", None, "This process's index (multi-process runs).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    quiet = not flags.FLAGS["verbosity"].present
    try:
        from jaxsprint import hostmem, parallel, train

        allocator = hostmem.configure()  # before JAX starts its threads (see jaxsprint/hostmem.py)

        if quiet:  # libraries (orbax) log every save at INFO; set after their imports, which reset it
            logging.set_verbosity(logging.WARNING)

        if _CONFIG.value is None:
            raise JaxsprintError("--config is required (e.g. --config=experiments/configs/default.py)")
        if not _WORKDIR.value:
            raise JaxsprintError("--workdir is required")
        parallel.maybe_initialize_distributed(coordinator_address=_COORD.value, num_processes=_NPROC.value,
                                              process_id=_PID.value)
        logging.info(allocator)
        summary = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except JaxsprintError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(train.format_summary(summary))
    logging.info("summary written to %s", os.path.join(_WORKDIR.value, "summary.json"))


if __name__ == "__main__":
    from jaxsprint.cli import parse_flags

    app.run(main, flags_parser=parse_flags)
