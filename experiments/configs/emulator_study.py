r"""The emulator judged against the runtime (experiments/study_emulator.py): ResNet-8 on digits at 16x16.

Three configurations of 8 learners whose emulated network time (and sub-batch, ``study.sub_batches``) set
the updater cycle against the learners' and so the mean staleness (about T_c / T_u: measured 1.3, 1.9 and 3.2
at sub-batch 16 and 80, 20 and 4 ms; the study reports the measured value), each trained for the same number of updates by the real runtime and
by the delayed-gradient emulator drawing from that run's measured pmfs, 3 seeds. About 15-25 minutes on a
quiet 2-core machine:

  python experiments/study_emulator.py --config=experiments/configs/emulator_study.py --out=docs/emulator-study
"""
import ml_collections

from experiments.configs import sprint


def get_config() -> ml_collections.ConfigDict:
    c = sprint.get_config()
    c.sprint.sub_batch = 16
    c.sprint.duration_s = 0.0          # the study stops every run at study.num_updates
    c.sprint.warmup_s = 0.5            # the start-up transient left out of the measured pmfs
    c.sprint.checkpoint = False
    c.log_every_steps = 50
    c.study = ml_collections.ConfigDict()
    c.study.names = ("low", "mid", "high")
    c.study.learners = (8, 8, 8)
    c.study.network_times = (0.08, 0.02, 0.004)   # seconds per updater cycle
    # Sub-batch per configuration. A larger one lengthens the learners' cycle against the updater's, but with
    # little network time most cycles are empty and fast: 8 learners at sub-batch 128 and 2 ms gave mean
    # staleness 35 with 46 of 300 versions applying gradients (not a useful point).
    c.study.sub_batches = (16, 16, 16)
    c.study.num_updates = 300          # published versions of a runtime run (empty cycles included)
    c.study.seeds = (0, 1, 2)
    return c
