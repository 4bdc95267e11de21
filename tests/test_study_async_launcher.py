"""experiments/study_async.py end to end at a tiny size, and its config errors (exit 2, one line)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a script: CI's second step (scripts/test.sh -m slow)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "study_async.py")
CONFIG = os.path.join(ROOT, "experiments", "configs", "async_study.py")
TINY = {"model": "tiny", "num_train_steps": "2", "log_every_steps": "1", "study.mean_staleness": "(0, 2)",
        "study.kinds": "('constant', 'geometric')", "study.mitigations": "('none',)", "study.seeds": "(0,)"}


def _overrides(changes=None):
    """--config.* flags of TINY updated by `changes`, each field once (ml_collections concatenates repeated
    overrides of a tuple field instead of keeping the last)."""
    return [f"--config.{k}={v}" for k, v in {**TINY, **(changes or {})}.items()]


def _run(*args, timeout=600):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_tiny_study_writes_results_table_and_resumes(tmp_path):
    out = tmp_path / "study"
    r = _run(f"--config={CONFIG}", f"--out={out}", *_overrides())
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((tmp_path / "study.json").read_text())
    # staleness 0 runs once for both distributions; 2 runs per distribution
    assert sorted(results) == ["tau0_constant_none_s0", "tau2_constant_none_s0", "tau2_geometric_none_s0"]
    assert all(not x["diverged"] and 0.0 <= x["eval_accuracy"] <= 1.0 for x in results.values())
    table = (tmp_path / "study.md").read_text()
    assert "| mean staleness | distribution | none top-1 % |" in table and "| 2 | geometric |" in table
    written = json.loads((tmp_path / "study.config.json").read_text())  # the resolved config, overrides applied
    assert written["model"] == "tiny" and written["study"]["kinds"] == ["constant", "geometric"]
    assert written["study"]["mean_staleness"] == [0, 2] and written["num_train_steps"] == 2
    again = _run(f"--config={CONFIG}", f"--out={out}", *_overrides())
    assert again.returncode == 0 and "tau" not in again.stdout.split("Model")[0]  # nothing rerun


@pytest.mark.parametrize("args,message", [
    ({"study.kinds": "('uniform',)"}, "invalid config.study.kinds='uniform': allowed: constant, geometric"),
    ({"study.mitigations": "('dc-asgd',)"}, "invalid config.study.mitigations='dc-asgd'"),
    ({"study.mean_staleness": "(-1,)"}, "invalid config.study.mean_staleness=-1"),
    ({"study.mean_staleness": "(1.5,)"}, "invalid config.study.mean_staleness=1.5"),
    ({"batch_size": "0"}, "config.batch_size"),
])
def test_bad_study_config_exits_2_before_any_run(tmp_path, args, message):
    r = _run(f"--config={CONFIG}", f"--out={tmp_path / 'study'}", *_overrides(args))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert message in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written


def test_missing_config_exits_2(tmp_path):
    r = _run(f"--out={tmp_path / 'study'}")
    assert r.returncode == 2 and "invalid --config=None" in r.stderr and "Traceback" not in r.stderr
