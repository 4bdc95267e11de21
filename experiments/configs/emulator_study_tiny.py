r"""The emulator judged against the runtime up to mean staleness about 8 or more: the plain-conv ``tiny_nobn`` on digits at 8x8.

The ResNet-8 study (``emulator_study.py``) cannot reach a high staleness that still trains on this machine: the
learners' cycle is long against the updater's only with large sub-batches or no network time, and there most
cycles are empty (staleness 35) or the linearly scaled rate diverges. This small network's updates are cheap,
so 6 learners of sub-batch 32 with no network time give a staleness near 9 (8 learners are slower: the updater
waits behind them), and momentum 0.5 at a constant rate 0.1 trains at every staleness of the study (as in the
planner's runtime comparison: ``docs/planning.md``). Same protocol as ``emulator_study.py``: each configuration trained for the same number of
updates by the real runtime and by the delayed-gradient emulator drawing from that run's measured pmfs, 3 seeds.
About 20-30 minutes on a quiet 2-core machine:

  python experiments/study_emulator.py --config=experiments/configs/emulator_study_tiny.py \
      --out=docs/emulator-study-tiny
"""
import ml_collections

from experiments.configs import emulator_study


def get_config() -> ml_collections.ConfigDict:
    c = emulator_study.get_config()
    c.model, c.image_size = "tiny_nobn", 8
    c.optimizer.momentum = 0.5       # asynchrony adds momentum of its own; at 0.9 staleness 5 and 8 diverge
    c.lr.scaling, c.lr.base = "none", 0.1  # one constant rate for every configuration (no nominal batch)
    c.study.names = ("low", "mid", "very_high")
    c.study.learners = (1, 4, 6)
    c.study.network_times = (0.05, 0.002, 0.0)
    c.study.sub_batches = (16, 16, 32)
    c.study.num_updates = 1000
    c.study.seeds = (0, 1, 2)
    return c
