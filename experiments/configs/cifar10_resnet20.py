r"""ResNet-20 on CIFAR-10 (He et al. 2016 recipe, cosine schedule), data-parallel over all devices.

Needs CIFAR-10 prepared as ArrayRecord in data_dir (see README, "TFDS datasets"). About 3-4 hours for the
160 epochs on a 2-core CPU; minutes on one GPU.

  python experiments/train.py --config=experiments/configs/cifar10_resnet20.py \
      --config.data_dir=$HOME/tensorflow_datasets --workdir=/tmp/cifar10_resnet20
"""
from experiments.configs import default


def get_config():
    c = default.get_config()
    c.dataset = "cifar10"
    c.test_split = "test"
    c.image_size = 32
    c.augment.kind = "pad_crop"
    c.augment.pad = 4
    c.augment.flip = True
    c.model = "resnet20"
    c.zero_init_last_bn = False
    c.bn.reduction = "global"
    c.batch_size = 128
    c.eval_batch_size = 1000
    c.num_epochs = 160
    c.lr.base = 0.2                 # 0.1 at batch 128 under the linear rule
    c.lr.warmup_epochs = 1.0
    c.lr.schedule = "cosine"
    c.optimizer.name = "nesterov"
    c.optimizer.momentum = 0.9
    c.optimizer.weight_decay = 1e-4
    c.label_smoothing = 0.0
    c.log_every_steps = 50
    c.eval_every_epochs = 5.0
    c.checkpoint_every_epochs = 5.0
    return c
