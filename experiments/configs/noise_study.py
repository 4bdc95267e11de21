r"""Steps to a target accuracy against the batch size, beside the measured gradient noise scale.

ResNet-8 on the built-in MNIST images (mnist5k, 28x28, 4,000 training and 1,000 test images), synchronous
momentum SGD with a constant learning rate after a fixed 20-step warmup, linearly scaled from 0.4 at the
reference batch 128 (tuned once there: 0.4), BN over groups of 16 examples at every batch size (so that BN's own
noise is the same everywhere), one device per 16 examples up to 8. Each run stops once the mean top-1 of its
last 3 evaluations reaches the target; the runs with 2 or more devices measure B_simple on the way
(jaxsprint/train/noise.py). About 20-30 minutes on a 2-core CPU.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/study_noise.py \
      --config=experiments/configs/noise_study.py --out=docs/noise-study

Digits at 16x16 as the second case: --config.dataset=digits --config.image_size=16 (1,500 training images).
"""
import ml_collections

from experiments.configs import noise_scale


def get_config():
    c = noise_scale.get_config()
    c.dataset = "mnist5k"
    c.image_size = 28
    c.augment.kind = "none"
    c.bn.reduction = "group"
    c.bn.group_size = 16
    c.lr.base = 0.4                 # tuned at the reference batch: fewest steps of 0.05, 0.1, 0.2, 0.4, 0.8
    c.lr.reference_batch = 128
    c.lr.schedule = "constant"
    c.num_epochs = 60                # the cap: a run that has not reached the target by then is censored
    c.eval_batch_size = 1000
    c.stop_at_accuracy = 0.95        # the target
    c.stop_evals = 3
    c.noise_scale.num_windows = 4    # the last quarter of a run's steps is "the target's stage"
    c.log_every_steps = 10
    c.eval_every_epochs = 0.0        # set per batch from study.eval_every_examples
    c.study = ml_collections.ConfigDict()
    c.study.batch_sizes = (16, 32, 64, 128, 256, 512, 1024)
    c.study.seeds = (0, 1, 2)
    c.study.reference_batch = 128    # the batch whose measured B_simple predicts the others
    c.study.warmup_steps = 20
    c.study.eval_every_examples = 512   # training examples between evaluations (at least one step)
    c.study.examples_per_device = 16
    return c
