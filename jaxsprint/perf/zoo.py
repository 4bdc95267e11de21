"""The network zoo: cost tables of published CNNs and of the families this project calibrates on.

Each function builds a :class:`~jaxsprint.perf.networks.NetworkCost` with the layer builder of
:mod:`jaxsprint.perf.networks` (conventions there: a MAC is 2 FLOPs, fp32 bytes). :func:`get` looks a
network up by name in :data:`ZOO`.

* ImageNet: :func:`alexnet`, :func:`vgg16`, :func:`googlenet`, :func:`resnet50` (v1.5 and v1).
* CIFAR (32x32): :func:`resnet_cifar` (ResNet-6n+2), :func:`resnet20`.
* Families: :func:`vgg_like` (the IPSJ report's VGG-like networks) and :func:`small_cnn` (the small
  VGG-like CNNs whose measured train steps calibrated the ``cpu`` machine preset).

References:
  He et al., "Deep residual learning for image recognition", CVPR 2016 (ResNet-50: 3.8 G
  multiply-adds for v1, 25.6 M parameters; ResNet-20 for CIFAR-10: 0.27 M parameters).
  Krizhevsky et al., NIPS 2012 (AlexNet, BVLC Caffe reference model: 60,965,224 parameters).
  Simonyan and Zisserman, ICLR 2015 (VGG-16: 138,357,544 parameters, 15.5 G MACs).
  Szegedy et al., CVPR 2015 (GoogLeNet: about 7 M parameters, 1.5 G multiply-adds).
"""
from __future__ import annotations

from typing import Callable, Sequence

from jaxsprint.errors import ConfigError
from jaxsprint.perf.networks import Builder, NetworkCost

__all__ = ["ZOO", "alexnet", "get", "googlenet", "resnet20", "resnet50", "resnet_cifar", "small_cnn", "vgg16",
           "vgg_like"]


def alexnet() -> NetworkCost:
    """AlexNet as the BVLC Caffe reference model (227x227 input, grouped conv2/4/5, LRN).

    60,965,224 parameters; about 724 M MACs (1.45 GFLOP) forward per image.
    """
    b = Builder((227, 227, 3))
    b.conv(96, 11, 4, "valid", bias=True).relu().lrn().pool(3, 2)
    b.conv(256, 5, 1, 2, groups=2, bias=True).relu().lrn().pool(3, 2)
    b.conv(384, 3, 1, 1, bias=True).relu()
    b.conv(384, 3, 1, 1, groups=2, bias=True).relu()
    b.conv(256, 3, 1, 1, groups=2, bias=True).relu().pool(3, 2)
    b.dense(4096).relu().dense(4096).relu().dense(1000)
    return b.build((227, 227, 3), "alexnet")


def vgg16() -> NetworkCost:
    """VGG-16 (configuration D), 224x224: 138,357,544 parameters, about 15.5 G MACs forward."""
    b = Builder((224, 224, 3))
    for width, reps in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(reps):
            b.conv(width, 3, bias=True).relu()
        b.pool(2, 2)
    b.dense(4096).relu().dense(4096).relu().dense(1000)
    return b.build((224, 224, 3), "vgg16")


def vgg_like(channels: Sequence[int], num_conv: int, input_size: int, pooling: Sequence[int], *,
             kernel: int = 3, name: str = "vgg_like") -> NetworkCost:
    """The VGG-like family of the IPSJ report (L layers, L_c of them convolutions).

    Layer l = 1..L_c is a ``kernel x kernel`` convolution ``m_{l-1} -> m_l`` with bias and ReLU,
    followed by max pooling of size ``p_l`` when ``p_l = 2``, so ``x_l = x_{l-1} / p_l``. Layers
    L_c+1..L are fully connected ``m_{l-1} -> m_l`` (the first one flattens ``x_{L_c}^2 m_{L_c}``),
    with ReLU except after the last.

    Args:
      channels: ``(m_0, ..., m_L)``, with ``m_0 = 3`` for RGB and ``m_L`` the classes.
      num_conv: ``L_c``.
      input_size: ``x_0``.
      pooling: ``(p_1, ..., p_{L_c})``, each 1 or 2.
      kernel: Convolution size ``c`` (3 in the report).
      name: Network name.

    Returns:
      The cost table.
    """
    n_layers = len(channels) - 1
    if not 1 <= num_conv <= n_layers:
        raise ConfigError("num_conv", num_conv, f"1..{n_layers} (len(channels) - 1)")
    if len(pooling) != num_conv or any(p not in (1, 2) for p in pooling):
        raise ConfigError("pooling", tuple(pooling), f"{num_conv} entries (num_conv), each 1 or 2")
    b = Builder((input_size, input_size, channels[0]))
    for layer in range(1, num_conv + 1):
        b.conv(channels[layer], kernel, bias=True).relu()
        if pooling[layer - 1] == 2:
            b.pool(2, 2)
    for layer in range(num_conv + 1, n_layers + 1):
        b.dense(channels[layer])
        if layer < n_layers:
            b.relu()
    return b.build((input_size, input_size, channels[0]), name)


def _inception(b: Builder, c1: int, c3r: int, c3: int, c5r: int, c5: int, cp: int) -> None:
    branches = []
    x = b.fork(); x.conv(c1, 1, bias=True).relu(); branches.append(x)  # noqa: E702
    x = b.fork(); x.conv(c3r, 1, bias=True).relu().conv(c3, 3, bias=True).relu(); branches.append(x)  # noqa: E702
    x = b.fork(); x.conv(c5r, 1, bias=True).relu().conv(c5, 5, bias=True).relu(); branches.append(x)  # noqa: E702
    x = b.fork(); x.pool(3, 1, "same").conv(cp, 1, bias=True).relu(); branches.append(x)  # noqa: E702
    b.concat(branches)


def googlenet() -> NetworkCost:
    """GoogLeNet / Inception-v1 (BVLC Caffe model, 224x224, without the auxiliary classifiers).

    About 7.0 M parameters and 1.6 G MACs forward (the paper quotes 1.5 G multiply-adds).
    """
    b = Builder((224, 224, 3))
    b.conv(64, 7, 2, bias=True).relu().pool(3, 2, "same").lrn()
    b.conv(64, 1, bias=True).relu().conv(192, 3, bias=True).relu().lrn().pool(3, 2, "same")
    _inception(b, 64, 96, 128, 16, 32, 32)
    _inception(b, 128, 128, 192, 32, 96, 64)
    b.pool(3, 2, "same")
    for cfg in ((192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
                (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)):
        _inception(b, *cfg)
    b.pool(3, 2, "same")
    _inception(b, 256, 160, 320, 32, 128, 128)
    _inception(b, 384, 192, 384, 48, 128, 128)
    b.global_avg_pool().dense(1000)
    return b.build((224, 224, 3), "googlenet")


def _bottleneck(b: Builder, width: int, stride: int, project: bool, v1_5: bool) -> None:
    short = b.fork()
    if project:
        short.conv(4 * width, 1, stride).bn()
    s1, s3 = (1, stride) if v1_5 else (stride, 1)
    b.conv(width, 1, s1).bn().relu().conv(width, 3, s3).bn().relu().conv(4 * width, 1).bn()
    b.add(short).relu()


def resnet50(*, v1_5: bool = True) -> NetworkCost:
    """ResNet-50 for ImageNet at 224x224: 25,557,032 parameters.

    Forward: about 4.1 G MACs (8.2 GFLOP) for v1.5 (stride on the 3x3 convolution, as in
    torchvision and the common JAX/TF implementations), 3.9 G MACs for the original v1 (stride on
    the first 1x1 convolution; the paper's 3.8 G multiply-adds omit the classifier and shortcuts).

    Args:
      v1_5: Put the stride of the down-sampling blocks on the 3x3 convolution.
    """
    b = Builder((224, 224, 3))
    b.conv(64, 7, 2).bn().relu().pool(3, 2, "same")
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for i in range(blocks):
            _bottleneck(b, width, 2 if (i == 0 and stage > 0) else 1, i == 0, v1_5)
    b.global_avg_pool().dense(1000)
    return b.build((224, 224, 3), "resnet50" if v1_5 else "resnet50_v1")


def resnet_cifar(blocks_per_stage: int, *, shortcut: str = "projection", num_classes: int = 10,
                 name: str | None = None) -> NetworkCost:
    """CIFAR ResNet-(6n+2) (He et al. 2016, sec. 4.2): three stages of ``n`` basic blocks, widths
    16/32/64, on 32x32 inputs.

    Args:
      blocks_per_stage: ``n`` (3 for ResNet-20, 1 for ResNet-8).
      shortcut: ``"projection"`` (1x1 conv + batch norm where the shape changes, as in this
        project's flax models) or ``"identity"`` (the paper's parameter-free option A).
      num_classes: Classifier width.
      name: Network name (default ``resnet{6n+2}``).
    """
    if shortcut not in ("projection", "identity"):
        raise ConfigError("shortcut", shortcut, "one of projection, identity")
    b = Builder((32, 32, 3))
    b.conv(16, 3).bn().relu()
    for stage, width in enumerate((16, 32, 64)):
        for i in range(blocks_per_stage):
            stride = 2 if (i == 0 and stage > 0) else 1
            short = b.fork()
            if stride != 1 and shortcut == "projection":
                short.conv(width, 1, stride).bn()
            elif stride != 1:
                short.shape = (short.shape[0] // 2, short.shape[1] // 2, width)  # free: slice + pad
            b.conv(width, 3, stride).bn().relu().conv(width, 3).bn()
            b.add(short).relu()
    b.global_avg_pool().dense(num_classes)
    return b.build((32, 32, 3), name or f"resnet{6 * blocks_per_stage + 2}")


def resnet20(*, shortcut: str = "projection", num_classes: int = 10) -> NetworkCost:
    """ResNet-20 for CIFAR-10 (32x32), three stages of three basic blocks, widths 16/32/64.

    With 1x1 projection shortcuts (+ batch norm) where the shape changes, as in this project's
    flax model: 272,474 parameters. With the paper's parameter-free "option A" (zero-padded identity)
    shortcuts: 269,722 parameters ("0.27 M"). About 41 M MACs forward per image.

    Args:
      shortcut: ``"projection"`` or ``"identity"`` (option A).
      num_classes: Classifier width.
    """
    return resnet_cifar(3, shortcut=shortcut, num_classes=num_classes, name="resnet20")


def vgg_like_default() -> NetworkCost:
    """An example member of the VGG-like family: 8 conv layers on 224x224, two 4096-wide FCs."""
    return vgg_like((3, 64, 128, 256, 256, 512, 512, 512, 512, 4096, 4096, 1000), 8, 224,
                    (2, 2, 1, 2, 1, 2, 1, 2), name="vgg_like")


def small_cnn(input_size: int, widths: Sequence[int], pools: Sequence[bool], bn: bool, *,
              num_classes: int = 10, name: str = "small_cnn") -> NetworkCost:
    """A small VGG-like CNN: per entry of ``widths`` a 3x3 convolution (with bias unless ``bn``), batch
    norm if ``bn``, ReLU and a 2x2 max pool where ``pools`` says so; then global average pooling and a
    dense classifier.

    The family whose measured train steps (``docs/perf-calibration.json``: 40 shapes, input 16-32, 2-5
    convolutions of 8-128 channels) calibrated the ``cpu`` machine preset; a record's ``shape`` holds
    ``size`` (``input_size``), ``widths``, ``pools``, ``bn`` and the step's ``batch``.

    Args:
      input_size: Height and width of the RGB input.
      widths: Output channels of each convolution.
      pools: Whether a max pool follows each convolution (same length as ``widths``).
      bn: Batch norm after every convolution.
      num_classes: Classifier width.
      name: Network name.
    """
    if len(pools) != len(widths):
        raise ConfigError("pools", tuple(pools), f"{len(widths)} entries, one per width")
    b = Builder((input_size, input_size, 3))
    for w, p in zip(widths, pools):
        b.conv(int(w), 3, bias=not bn)
        if bn:
            b.bn()
        b.relu()
        if p:
            b.pool(2, 2)
    b.global_avg_pool().dense(num_classes)
    return b.build((input_size, input_size, 3), name)


ZOO: dict[str, Callable[[], NetworkCost]] = {
    "alexnet": alexnet,
    "vgg16": vgg16,
    "googlenet": googlenet,
    "resnet50": resnet50,
    "resnet50_v1": lambda: resnet50(v1_5=False),
    "resnet20": resnet20,
    "resnet8": lambda: resnet_cifar(1),
    "resnet32": lambda: resnet_cifar(5),
    "resnet56": lambda: resnet_cifar(9),
    "vgg_like": vgg_like_default,
}


def get(name: str) -> NetworkCost:
    """A zoo network by name (see :data:`ZOO`).

    Raises:
      ConfigError: an unknown name (the message lists the allowed ones).
    """
    if name not in ZOO:
        raise ConfigError("network", name, f"one of {', '.join(sorted(ZOO))}")
    return ZOO[name]()

