r"""ResNet-50 on ImageNet at global batch 81,920 with LARS and ghost BN of 40 images (Kasagi/Yamazaki recipe).

The record ran 2,048 V100 x 40 images. On fewer devices the same global batch is reached by gradient
accumulation: grad_accum_steps = 81,920 / (40 x devices), so every forward pass still normalises groups of
40 images per device. Pass the device count after the colon (default 8):

  python experiments/train.py --config=experiments/configs/imagenet_resnet50_lars.py:8 \
      --config.data_dir=$HOME/tensorflow_datasets --workdir=/tmp/imagenet_r50_81920

Hyper-parameters follow Fujitsu's MLPerf v0.6 submission (86,016 batch; see the shared notes): LARS, 36
warmup epochs of 90, polynomial decay power 2.2 to 0.0325, momentum 0.96, weight decay 5e-5 off BN and biases, label
smoothing 0.1, BN momentum 0.9 and epsilon 1e-5, random-resized-crop area [0.05, 0.9], bfloat16 compute.
Days on 8 GPUs; the record took 74.7 s on 2,048.
"""
from experiments.configs import default

GLOBAL_BATCH = 81_920
GHOST_BN = 40


def get_config(devices: str = "8"):
    n = int(devices)
    c = default.get_config()
    c.dataset = "imagenet2012"
    c.train_split = "train"
    c.test_split = "validation"
    c.image_size = 224
    c.augment.kind = "rrc"
    c.augment.area_range = (0.05, 0.9)
    c.augment.aspect_range = (0.667, 1.5)
    c.augment.flip = True
    c.augment.eval_crop_fraction = 0.875
    c.model = "resnet50"
    c.dtype = "bfloat16"
    c.zero_init_last_bn = True
    c.bn.reduction = "per_device"
    c.bn.momentum = 0.9
    c.bn.epsilon = 1e-5
    c.num_devices = n
    c.batch_size = GLOBAL_BATCH
    c.grad_accum_steps = max(1, GLOBAL_BATCH // (GHOST_BN * n))
    c.eval_batch_size = 50 * n
    c.num_epochs = 90
    c.lr.scaling = "none"           # the recipe states the peak directly
    c.lr.base = 13.0
    c.lr.warmup_epochs = 36.0
    c.lr.schedule = "poly"
    c.lr.poly_power = 2.2
    c.lr.end_lr = 0.0325
    c.optimizer.name = "lars"
    c.optimizer.momentum = 0.96
    c.optimizer.weight_decay = 5e-5
    c.optimizer.lars_trust_coefficient = 0.0025
    c.optimizer.lars_eps = 1e-9
    c.label_smoothing = 0.1
    c.log_every_steps = 1
    c.eval_every_epochs = 5.0
    c.checkpoint_every_epochs = 5.0
    return c
