"""The flags that several small launchers share, defined once (absl allows one definition of a name).

``experiments/predict.py``, ``experiments/search.py`` and ``experiments/run_sprint.py`` import this module
and read the values as ``common_flags.MACHINE.value`` (or ``flags.FLAGS.machine``). The launchers that run an
experiment take their settings from an ml_collections config file instead (``--config.<field>``); these
flags are for quick queries and for naming outputs. Nothing here imports JAX: run_sprint.py must not start
JAX's backend before ``jax.distributed.initialize``.
"""
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
