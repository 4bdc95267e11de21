"""jaxsprint.train.run_config: a resumed run is compared with the config it was made with (pure function, the
trainer, the launcher end to end): trajectory fields must match unless config.resume_allow_changes names them."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from experiments.configs import testing
from jaxsprint.errors import ConfigError
from jaxsprint.train import run_config, settings, trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _saved(**overrides):
    """The testing config as its config.json holds it, with dotted overrides."""
    data = run_config.as_json(testing.get_config())
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = data
        for p in parents:
            node = node[p]
        node[leaf] = value
    return data


def test_flatten_names_every_leaf_by_its_dotted_field():
    assert run_config.flatten({"lr": {"base": 0.1, "s": {"p": [1, 2]}}, "seed": 0, "empty": {}}) == {
        "lr.base": 0.1, "lr.s.p": [1, 2], "seed": 0, "empty": {}}


def test_changed_fields_ignore_the_trajectory_neutral_ones():
    old = _saved()
    new = _saved(**{"lr.base": 0.2, "num_epochs": 50, "log_every_steps": 1, "eval_every_epochs": 1.0,
                    "checkpoint_every_epochs": 3.0, "keep_checkpoints": 9, "progress_bar": True,
                    "resume": "latest_good", "resume_allow_changes": ["lr.base"], "profile_steps": [1, 2],
                    "data_dir": "/elsewhere"})
    assert run_config.changed_fields(old, new) == [("lr.base", 0.5, 0.2), ("num_epochs", 40, 50)]
    assert run_config.changed_fields(old, _saved()) == []


@pytest.mark.parametrize("field,old,new", [
    ("model", "tiny", "resnet20"), ("batch_size", 64, 32), ("grad_accum_steps", 1, 2), ("seed", 0, 1),
    ("optimizer.name", "sgd", "lars"), ("lr.schedule", "poly", "cosine"), ("num_train_steps", 6, 12),
    ("augment.area_range", [0.35, 1.0], [0.5, 1.0]), ("bn.reduction", "per_device", "global"),
    ("async_emulation.enabled", False, True), ("polish.mode", "none", "recompute"), ("cpu_kernels", "auto", "off"),
    ("dataset", "digits", "mnist5k"), ("image_size", 8, 16),
])
def test_every_field_that_changes_the_trajectory_must_match(field, old, new):
    assert run_config.changed_fields(_saved(**{field: old}), _saved(**{field: new})) == [(field, old, new)]


def test_values_compare_as_json_nan_equal_and_bools_apart_from_numbers():
    assert run_config.changed_fields({"x": float("nan"), "y": [1, 2.0]}, {"x": float("nan"), "y": [1.0, 2]}) == []
    assert run_config.changed_fields({"x": 1}, {"x": True}) == [("x", 1, True)]


def test_a_field_new_to_this_version_differs_and_a_removed_one_is_only_named():
    old, new = _saved(), _saved()
    del old["lr"]["end_lr"]
    new.pop("label_smoothing")
    assert run_config.changed_fields(old, new) == [("lr.end_lr", run_config.MISSING, 0.0)]
    assert run_config.dropped_fields(dict(old, launcher={"x": 1}), new) == ["label_smoothing"]
    with pytest.raises(ConfigError, match=r"was made without config\.lr\.end_lr;"):
        run_config.check_resume(old, new, [], "W")


def test_the_refusal_names_each_field_both_values_and_the_setting_that_allows_it():
    old, new = _saved(), _saved(**{"lr.base": 0.2, "num_epochs": 50, "log_every_steps": 1})
    with pytest.raises(ConfigError) as e:
        run_config.check_resume(old, new, [], "/runs/a")
    assert str(e.value) == (
        "invalid config.lr.base=0.2: the run in /runs/a was made with config.lr.base=0.5; also differ: "
        "config.num_epochs=50 (made with config.num_epochs=40); config.resume_allow_changes=lr.base,num_epochs "
        "allows these changes (or use another workdir)")
    with pytest.raises(ConfigError, match=r"^invalid config\.num_epochs=50: .*resume_allow_changes=lr,num_epochs "
                                          r"allows this change"):
        run_config.check_resume(old, new, ["lr"], "/runs/a")  # a group allows each of its fields
    assert run_config.check_resume(old, new, ["lr.base", "num_epochs"], "/runs/a") == [
        ("lr.base", 0.5, 0.2), ("num_epochs", 40, 50)]


@pytest.mark.parametrize("value,names", [((), []), (("lr.base,num_epochs",), ["lr.base", "num_epochs"]),
                                         (("lr", "config.seed"), ["lr", "seed"]), (("",), [])])
def test_allowed_changes_are_config_fields_or_groups(value, names):
    c = testing.get_config()
    c.resume_allow_changes = value
    assert run_config.allowed_changes(c) == names
    settings.validate_config(c, 8)


@pytest.mark.parametrize("value", [("lr.bse",), ("seed", "no_such"), ("lr.base.x",)])
def test_an_allowed_change_that_names_no_field_is_refused(value):
    c = testing.get_config()
    c.resume_allow_changes = value
    with pytest.raises(ConfigError, match=r"^invalid config\.resume_allow_changes=.*names of config fields"):
        settings.validate_config(c, 8)


# ------------------------------------------------------------------------------------------------------------
# The trainer and the launcher.


def _snapshot(root) -> dict:
    """Every path under `root` with its size, modification time and content hash: what 'unchanged' means."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.stat(p)
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest() if name in files else None
            out[os.path.relpath(p, root)] = (st.st_size if digest else None, st.st_mtime_ns, digest)
    return out


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run of the testing config stopped after 3 of its 6 updates (a checkpoint at 3, its config.json)."""
    workdir = tmp_path_factory.mktemp("interrupted") / "run"
    trainer.train_and_evaluate(testing.get_config(), str(workdir), stop_after_steps=3)
    assert json.loads((workdir / "config.json").read_text()) == run_config.as_json(testing.get_config())
    return workdir


def _copy(interrupted, tmp_path):
    shutil.copytree(interrupted, tmp_path / "run")
    return tmp_path / "run"


def test_the_trainer_refuses_a_changed_config_before_it_writes(interrupted, tmp_path):
    workdir = _copy(interrupted, tmp_path)
    before = _snapshot(workdir)
    c = testing.get_config()
    c.lr.base, c.optimizer.momentum = 0.2, 0.5
    with pytest.raises(ConfigError, match=r"^invalid config\.lr\.base=0\.2: the run in .* config\.lr\.base=0\.5; "
                                          r"also differ: config\.optimizer\.momentum=0\.5"):
        trainer.train_and_evaluate(c, str(workdir))
    assert _snapshot(workdir) == before


def test_an_allowed_change_continues_and_keeps_the_previous_config(interrupted, tmp_path):
    workdir = _copy(interrupted, tmp_path)
    c = testing.get_config()
    c.lr.base, c.resume_allow_changes = 0.2, ("lr.base",)
    out = trainer.train_and_evaluate(c, str(workdir))
    assert out["steps"] == 6 and out["peak_lr"] == pytest.approx(0.2 * 64 / 256)
    assert json.loads((workdir / "config.3.json").read_text())["lr"]["base"] == 0.5
    assert json.loads((workdir / "config.json").read_text())["lr"]["base"] == 0.2


def test_a_workdir_without_config_json_resumes_with_a_warning(interrupted, tmp_path, caplog):
    workdir = _copy(interrupted, tmp_path)
    (workdir / "config.json").unlink()
    with caplog.at_level("WARNING"):
        out = trainer.train_and_evaluate(testing.get_config(), str(workdir))
    assert out["steps"] == 6 and "no config.json (written by an older version)" in caplog.text
    assert (workdir / "config.json").exists()


def _launch(workdir, *args):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "train.py"),
                           f"--config={os.path.join(ROOT, 'experiments', 'configs', 'testing.py')}",
                           f"--workdir={workdir}", *args], capture_output=True, text=True, timeout=300, env=env,
                          cwd=ROOT)


def test_the_launcher_refuses_a_changed_lr_and_writes_nothing(interrupted, tmp_path):
    workdir = _copy(interrupted, tmp_path)
    before = _snapshot(workdir)
    r = _launch(workdir, "--config.lr.base=0.2", "--config.log_every_steps=1")
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.splitlines()[-1] == (
        f"error: invalid config.lr.base=0.2: the run in {workdir} was made with config.lr.base=0.5; "
        "config.resume_allow_changes=lr.base allows this change (or use another workdir)")
    assert "Traceback" not in r.stderr and _snapshot(workdir) == before


@pytest.mark.slow
def test_the_launcher_resumes_with_an_allowed_lr_or_other_intervals(interrupted, tmp_path):
    workdir = _copy(interrupted, tmp_path / "lr")
    r = _launch(workdir, "--config.lr.base=0.2", "--config.resume_allow_changes=lr.base")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from the checkpoint at step 3" in r.stdout
    assert json.loads((workdir / "summary.json").read_text())["steps"] == 6
    assert json.loads((workdir / "config.json").read_text())["lr"]["base"] == 0.2
    assert json.loads((workdir / "config.3.json").read_text())["lr"]["base"] == 0.5

    workdir = _copy(interrupted, tmp_path / "intervals")
    r = _launch(workdir, "--config.log_every_steps=1", "--config.eval_every_epochs=0.05",
                "--config.checkpoint_every_epochs=0.05")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from the checkpoint at step 3" in r.stdout and not (workdir / "config.3.json").exists()
    written = json.loads((workdir / "config.json").read_text())
    assert written["log_every_steps"] == 1 and written["eval_every_epochs"] == 0.05
    steps = [json.loads(x)["step"] for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert {4, 5, 6} <= set(steps)  # the new log interval: every update after the resume
