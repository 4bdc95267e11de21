"""experiments/validate_model.py end to end at a tiny size: model against simulator on a few random
configurations of each kind, the JSON it writes, and bad config values (exit 2, one line)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "validate_model.py")
CONFIG = os.path.join(ROOT, "experiments", "configs", "validate_model.py")
TINY = [f"--config={CONFIG}", "--config.num_configs=3", "--config.num_deterministic=2", "--config.num_lognormal=1",
        "--config.speed_configs=1000", "--config.event_budget=2e4", "--config.min_cycles=200",
        "--config.min_gradients=2000", "--plot="]


def _run(*args):
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_tiny_validation_writes_its_summary(tmp_path):
    out = tmp_path / "validation.json"
    r = _run(*TINY, f"--out_json={out}")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert set(data["summary"]) == {"cv = 0", "cv > 0", "lognormal cv > 0"}
    for group in data["summary"].values():
        for metric in ("err_mean_minibatch", "err_mean_staleness", "tv_minibatch", "tv_staleness"):
            assert 0 <= group[metric]["median"] <= group[metric]["max"]
        # The model's means are exact: the simulator differs by sampling noise only (a few percent here).
        assert group["err_mean_staleness"]["max"] < 0.2
    assert data["speed"]["spec_summary_configs_per_s"] > 0
    assert "cv > 0 (3 configurations)" in r.stdout
    # The resolved config is kept with the results: the file's defaults with the overrides applied.
    assert data["config"] == {"num_configs": 3, "num_deterministic": 2, "num_lognormal": 1, "seed": 0,
                              "event_budget": 2e4, "min_cycles": 200, "min_gradients": 2000, "speed_configs": 1000}


def test_bad_config_values_exit_2_with_one_line(tmp_path):
    c = "--config."
    for args, words in (([c + "num_configs=-1"], "invalid config.num_configs=-1: an integer in [0, "),
                        ([c + "num_configs=0", c + "num_deterministic=0", c + "num_lognormal=0"],
                         "config.num_configs=0"),
                        ([c + "min_cycles=0"], "invalid config.min_cycles=0"),
                        ([c + "num_configs=abc"], "config.num_configs")):
        r = _run(*TINY, f"--out_json={tmp_path / 'x.json'}", *args)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert r.stderr.startswith("error: ") and words in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "x.json").exists()
