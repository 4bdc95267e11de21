"""Datasets, augmentation and global-batch assembly.

Sources:
  * ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 real images, no download), resized to
    ``image_size``; a fixed split (seed 0) of 1,500 training and 297 test images.
  * any TFDS image-classification dataset (``cifar10``, ``mnist``, ``imagenet2012``, ...), read with
    ``tfds.data_source`` (ArrayRecord, random access, no TensorFlow needed) from ``data_dir``. A dataset that is
    not prepared there fails at once with the command that prepares it; nothing is ever downloaded.

Images travel as uint8 ``[N, H, W, C]`` to the devices; `train_preprocess` and `eval_preprocess` are pure
jax functions (the former takes a PRNG key) that crop, resize, flip and normalise on the devices.

Shuffling is deterministic per epoch (`epoch_permutation`), and every host takes its contiguous slice of the
global batch (`host_slice`), so a multi-host run sees the same global batch as a single-host one.
"""
from __future__ import annotations

import dataclasses
import os
import queue
import threading
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.errors import ConfigError, DataError

DIGITS = "digits"
DIGITS_TEST_SIZE = 297

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
        from PIL import Image  # pillow ships with tensorflow-datasets' dependencies

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


def _resize_uint8(images: np.ndarray, size: int) -> np.ndarray:
    out = jax.image.resize(jnp.asarray(images, jnp.float32), (images.shape[0], size, size, images.shape[-1]),
                           method="linear", antialias=True)
    return np.asarray(jnp.clip(jnp.round(out), 0, 255)).astype(np.uint8)


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


def _prepare_hint(name: str, data_dir: str) -> str:
    return (f"TFDS dataset {name!r} is not prepared as ArrayRecord in data_dir={data_dir!r}. Prepare it once on a "
            f"machine with network access (TensorFlow is needed to build): pip install -e '.[tf]' && "
            f"tfds build {name} --data_dir={data_dir} --file_format=array_record "
            f"(ImageNet needs its archives placed in {data_dir}/downloads/manual first).")


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
    import tensorflow_datasets as tfds

    try:
        tfds.builder_cls(name)  # local registry only (list_builders would query the community index online)
    except tfds.core.registered.DatasetNotFoundError:
        raise ConfigError("config.dataset", name,
                          f"allowed: {DIGITS!r} or the name of a TFDS image-classification dataset") from None
    sources = {}
    for split in (train_split, test_split):
        try:
            sources[split] = tfds.data_source(name, split=split, data_dir=os.fspath(data_dir), download=False)
        except Exception as e:  # tfds raises several types for "not prepared"; all mean the same to a user
            raise DataError(_prepare_hint(name, data_dir) + f" (tfds said: {type(e).__name__}: "
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


def load_dataset(config) -> Dataset:
    """Dataset named by ``config.dataset`` (see module docstring)."""
    if config.dataset == DIGITS:
        return load_digits(config.image_size)
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
            raise ValueError(f"unknown augmentation kind {kind!r}")
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
    kinds = ("rrc", "pad_crop", "none")
    if a.kind not in kinds:
        raise ConfigError("config.augment.kind", a.kind, f"allowed: {', '.join(kinds)}")
    train_fn = lambda key, images: train_preprocess(  # noqa: E731
        key, images, out_size=config.image_size, kind=a.kind, area_range=tuple(a.area_range),
        aspect_range=tuple(a.aspect_range), pad=a.pad, flip=a.flip, mean=dataset.mean, std=dataset.std)
    eval_fn = lambda images: eval_preprocess(  # noqa: E731
        images, out_size=config.image_size, crop_fraction=dataset.eval_crop_fraction, mean=dataset.mean,
        std=dataset.std)
    return train_fn, eval_fn


# ----------------------------------------------------------------------------------------------------------
# Index bookkeeping: shuffling, global batches, host slices.


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the training set in `epoch`: a function of (seed, epoch) only."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def train_batch_indices(seed: int, step: int, n: int, global_batch: int, *, shuffle: bool = True) -> np.ndarray:
    """Indices of the global training batch of `step` (the last partial batch of an epoch is dropped)."""
    steps_per_epoch = n // global_batch
    epoch, i = divmod(step, steps_per_epoch)
    order = epoch_permutation(seed, epoch, n) if shuffle else np.arange(n)
    return order[i * global_batch:(i + 1) * global_batch]


def host_slice(global_indices: np.ndarray, process_index: int, process_count: int) -> np.ndarray:
    """This host's contiguous part of a global batch (global batch divisible by the process count)."""
    per_host = len(global_indices) // process_count
    return global_indices[process_index * per_host:(process_index + 1) * per_host]


def eval_batches(n: int, global_batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Sequential (indices, mask) covering 0..n-1 once; the last batch is padded (mask 0) to `global_batch`."""
    for start in range(0, n, global_batch):
        idx = np.arange(start, min(start + global_batch, n))
        mask = np.ones(global_batch, np.float32)
        if len(idx) < global_batch:
            mask[len(idx):] = 0.0
            idx = np.concatenate([idx, np.zeros(global_batch - len(idx), idx.dtype)])
        yield idx, mask


def prefetch(iterator: Iterator, size: int = 2) -> Iterator:
    """Runs `iterator` in a background thread, `size` items ahead, so the step never waits on the host."""
    q: queue.Queue = queue.Queue(maxsize=size)
    sentinel = object()

    def worker():
        try:
            for item in iterator:
                q.put(item)
        except BaseException as e:  # handed to the consumer
            q.put(e)
        q.put(sentinel)

    threading.Thread(target=worker, daemon=True).start()
    while True:
        item = q.get()
        if item is sentinel:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
