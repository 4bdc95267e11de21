"""The real launcher end to end (built-in data in a subprocess, TFDS mock data in-process) and its errors."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "train.py")
TESTING = os.path.join(ROOT, "experiments", "configs", "testing.py")


def _run(*args, timeout=300):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, LAUNCHER, f"--config={TESTING}", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


# mnist5k through the launcher is slow (CI's second step): the launcher end to end is test ...[digits], the
# loading of mnist5k tests/test_data.py::test_mnist5k_real_images_fixed_stratified_split.
@pytest.mark.parametrize("dataset", ["digits", pytest.param("mnist5k", marks=pytest.mark.slow)])
def test_launcher_trains_on_builtin_data(tmp_path, dataset):
    r = _run(f"--workdir={tmp_path}", f"--config.dataset={dataset}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "eval top-1 accuracy" in r.stdout and f"{dataset} / tiny" in r.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["devices"] == 8 and 0.0 <= summary["eval_accuracy"] <= 1.0
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_accuracy" in x for x in lines) and any("train_loss" in x for x in lines)
    assert (tmp_path / "checkpoints").is_dir() and any((tmp_path / "checkpoints").iterdir())
    written = json.loads((tmp_path / "config.json").read_text())  # the resolved config, the override applied
    assert written["dataset"] == dataset and written["model"] == "tiny" and written["lr"]["base"] > 0


# The first five, one launcher process each, are slow (CI's second step): the same flags are cases of
# tests/test_bad_inputs.py::test_every_bad_input_is_one_clear_error_and_writes_nothing[train.py] (exit 2, one
# error line naming the field, no traceback, nothing written in a workdir holding keep.txt), whose driver is
# checked against the real command line by test_the_driver_reports_what_the_command_line_does[train.py-0].
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("args,field", [
    pytest.param(["--config.batch_size=60"], "config.batch_size", marks=_SLOW),
    pytest.param(["--config.model=resnet7"], "config.model", marks=_SLOW),
    pytest.param(["--config.optimizer.name=adamw"], "config.optimizer.name", marks=_SLOW),
    pytest.param(["--config.lr.base=-0.1"], "config.lr.base", marks=_SLOW),
    pytest.param(["--config.dataset=cifar10"], "config.data_dir", marks=_SLOW),
    (["--config.dataset=no_such_dataset_xyz", "--config.data_dir=/tmp"], "config.dataset"),
    (["--config.dataset=cifar10", "--config.data_dir=/nonexistent-tfds-dir"], "tfds build cifar10"),
])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, args, field):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "keep.txt").write_text("earlier results")
    r = _run(f"--workdir={workdir}", *args)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert field in r.stderr and "Traceback" not in r.stderr
    assert sorted(os.listdir(workdir)) == ["keep.txt"]  # nothing written, nothing lost
    assert (workdir / "keep.txt").read_text() == "earlier results"


_MOCK_RUNNER = """
import runpy, sys
import tensorflow_datasets as tfds
sys.argv = sys.argv[1:]
with tfds.testing.mock_data(num_examples=24):
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


# imagenet2012 through the launcher is slow (CI's second step): a TFDS dataset through the launcher is
# test ...[cifar10-extra0]; imagenet2012's validation split is read by
# tests/test_data.py::test_tfds_mock_cifar10_and_imagenet_read_through_data_source and the rrc augmentation is
# tests/test_data.py::test_train_preprocess_shapes_and_determinism[rrc].
@pytest.mark.parametrize("dataset,extra", [
    ("cifar10", []),
    pytest.param("imagenet2012", ["--config.test_split=validation", "--config.augment.kind=rrc"],
                 marks=pytest.mark.slow),
])
def test_launcher_on_tfds_mock_data(tmp_path, dataset, extra):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    argv = [LAUNCHER, f"--config={TESTING}", f"--workdir={tmp_path}", f"--config.dataset={dataset}",
            f"--config.data_dir={tmp_path / 'tfds'}", "--config.batch_size=16", "--config.eval_batch_size=16",
            "--config.num_train_steps=2", *extra]
    r = subprocess.run([sys.executable, "-c", _MOCK_RUNNER, *argv], capture_output=True, text=True, timeout=300,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{dataset} / tiny" in r.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["dataset"] == dataset
