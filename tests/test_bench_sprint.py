"""scripts/bench_sprint.py end to end at a tiny size: the table and the JSON rows (no timing assertions)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a script: CI's second step (scripts/test.sh -m slow)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench_sprint.py")


def test_tiny_benchmark_prints_both_throughputs(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, SCRIPT, "--learners=1,2", "--sub_batch=4", "--duration_s=1.5",
                        "--warmup_s=0.3", "--sync_warmup_steps=1", "--config.model=tiny", f"--json={out}"],
                       capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "async images/s" in r.stdout and "sync images/s" in r.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [x["learners"] for x in rows] == [1, 2]
    for x in rows:
        assert x["asynchronous"]["images_per_s"] > 0 and x["synchronous"]["images_per_s"] > 0
        assert x["synchronous"]["steps"] >= 2


def test_bad_flag_exits_2():
    r = subprocess.run([sys.executable, SCRIPT, "--learners=0"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), cwd=ROOT)
    assert r.returncode == 2 and "error: invalid --learners='0'" in r.stderr
