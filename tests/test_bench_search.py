"""scripts/bench_search.py at a tiny size: both parts run, print their tables and write the JSON."""
import json
import os
import subprocess
import sys
import pytest

pytestmark = pytest.mark.slow  # an end-to-end run of a script: CI's second step (scripts/test.sh -m slow)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench_search.py")


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_tiny_benchmark_writes_both_parts(tmp_path):
    out = tmp_path / "bench.json"
    r = _run("--machines=abci", "--networks=resnet8", "--targets=256", "--max_nodes=8", "--max_sub_batch=32",
             "--precision_networks=resnet8", "--precision_targets=128", "--repeats=1", f"--out_json={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    (case,) = data["cases"]
    assert case["space_size"] == 8 * 4 * 32 and case["grid"]["evaluations"] == case["space_size"]
    assert case["gap"] is not None and case["gap"] >= -1e-6  # the grid is the optimum
    assert data["summary"]["cases"] == 1
    (prec,) = data["precision"]
    # The gradient search cannot beat the rigorous lower bound, nor lose to the fp32 grid it contains.
    assert prec["gradient"] >= prec["lower_bound"] * (1 - 1e-6)
    assert prec["gradient"] <= prec["fp32_grid"] * (1 + 1e-6)
    assert "gradient search" in r.stdout and "lower bd" in r.stdout


def test_bad_flags_exit_2():
    for args, words in ((["--repeats=0"], "invalid --repeats=0"), (["--machines=tsubame3"], "machine='tsubame3'"),
                        (["--networks=resnet51"], "network='resnet51'")):
        r = _run(*args)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
