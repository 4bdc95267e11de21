"""experiments/study_polish.py end to end at a tiny size, and its config errors (exit 2, one line)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a script: CI's second step (scripts/test.sh -m slow)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "study_polish.py")
CONFIG = os.path.join(ROOT, "experiments", "configs", "polish_study.py")
TINY = {"model": "tiny", "image_size": "8", "num_train_steps": "2", "log_every_steps": "1",
        "polish.no_augment_epochs": "0.05", "polish.num_samples": "128", "study.batch_sizes": "(64,)",
        "study.seeds": "(0,)"}


def _overrides(changes=None):
    """--config.* flags of TINY updated by `changes`, each field once (ml_collections concatenates repeated
    overrides of a tuple field instead of keeping the last)."""
    return [f"--config.{k}={v}" for k, v in {**TINY, **(changes or {})}.items()]


def _run(*args, timeout=600):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_tiny_study_writes_results_and_table(tmp_path):
    r = _run(f"--config={CONFIG}", f"--out={tmp_path / 'study'}", *_overrides())
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((tmp_path / "study.json").read_text())
    assert sorted(results) == ["b64_s0_both", "b64_s0_recompute"]
    for x in results.values():
        assert not x["diverged"] and 0.0 <= x["eval_accuracy"] <= 1.0 and 0.0 <= x["eval_polished_accuracy"] <= 1.0
    table = (tmp_path / "study.md").read_text()
    assert "| global batch | per device (ghost BN) |" in table and "| 64 | 8 |" in table
    written = json.loads((tmp_path / "study.config.json").read_text())  # the resolved config, overrides applied
    assert written["model"] == "tiny" and written["study"]["batch_sizes"] == [64] and written["image_size"] == 8


@pytest.mark.parametrize("args,message", [
    ({"study.batch_sizes": "(0,)"}, "invalid config.study.batch_sizes=0: allowed: positive integers"),
    ({"study.batch_sizes": "(60,)"}, "config.batch_size"),  # not divisible by 8 devices
    ({"study.seeds": "()"}, "invalid config.study.seeds=()"),
])
def test_bad_study_config_exits_2_before_any_run(tmp_path, args, message):
    r = _run(f"--config={CONFIG}", f"--out={tmp_path / 'study'}", *_overrides(args))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert message in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []
