"""The flags that several small launchers share, defined once (absl allows one definition of a name).

``experiments/predict.py``, ``experiments/search.py`` and ``experiments/run_sprint.py`` import this module
and read the values as ``common_flags.MACHINE.value`` (or ``flags.FLAGS.machine``). The launchers that run an
experiment take their settings from an ml_collections config file instead (``--config.<field>``); these
flags are for quick queries and for naming outputs. Nothing here imports JAX: run_sprint.py must not start
JAX's backend before ``jax.distributed.initialize``. The multi-process flags are defined by the launchers that
need them (`define_cluster_flags`).
"""
from typing import NamedTuple

from absl import flags

MACHINE = flags.DEFINE_string("machine", None, "Machine preset (jaxsprint.perf.machines.PRESETS, e.g. "
                              "tsubame_kfc_dl; run_sprint.py: cpu_runtime when neither this nor --machine_file).")
MACHINE_FILE = flags.DEFINE_string("machine_file", None, "A calibrated machine preset (JSON written by "
                                   "experiments/calibrate.py or calibrate_runtime.py) instead of --machine.")
NETWORK = flags.DEFINE_string("network", None, "Network of the zoo (jaxsprint.perf.zoo.ZOO, e.g. resnet50).")
ALLREDUCE = flags.DEFINE_string("allreduce", "ring", "Inter-node all-reduce (jaxsprint.perf.collectives."
                                "ALGORITHMS).")
DATASET_SIZE = flags.DEFINE_integer("dataset_size", 1_281_167, "Samples per epoch N_File (ImageNet's training "
                                    "set by default).")
SEED = flags.DEFINE_integer("seed", 0, "Seed: of the simulator (predict.py --plot) or of the search's starting "
                            "points (search.py).")
JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of the table(s).")
PLOT = flags.DEFINE_string("plot", None, "Write a figure of the result to this file (predict.py: both pmfs next "
                           "to the simulator's histograms; search.py: the search on the epoch-time / mini-batch "
                           "plane; run_sprint.py: measured histograms over the model's pmfs, .png/.pdf/.svg).")


class ClusterFlags(NamedTuple):
    """The multi-process flags of the launchers that train or run (`define_cluster_flags`)."""

    coordinator_address: flags.FlagHolder
    num_processes: flags.FlagHolder
    process_id: flags.FlagHolder

    def values(self) -> dict:
        """Keyword arguments of ``jaxsprint.cluster.initialize``."""
        return {name: holder.value for name, holder in self._asdict().items()}


def define_cluster_flags() -> ClusterFlags:
    """Defines --coordinator_address, --num_processes and --process_id (experiments/train.py, polish.py and
    run_sprint.py; a function, so that the query launchers importing this module do not get them).

    Each may be left out where a launcher (srun, mpirun) or JAX's environment variables give it:
    ``jaxsprint.cluster`` and docs/cluster.md say how the start-up is detected.
    """
    return ClusterFlags(
        flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process runs; "
                            "srun, mpirun and JAX_COORDINATOR_ADDRESS are detected without it)."),
        flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process runs; default: from "
                             "srun's or mpirun's environment)."),
        flags.DEFINE_integer("process_id", None, "This process's index, 0..num_processes-1 (multi-process runs; "
                             "default: from srun's or mpirun's environment)."))
