"""experiments/polish.py end to end: polishes a real run's checkpoint (train.py's and polish.py's workdir given
as a file:// URI), leaves the run's checkpoints alone, and refuses a work directory without one (exit 2, one
line). A SPRINT run's workdir: tests/test_polish_sprint.py."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTING = os.path.join(ROOT, "experiments", "configs", "testing.py")
ENV = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")


def _launch(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", script), f"--config={TESTING}", *args],
                          capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)


def _tree(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def test_polishes_the_latest_checkpoint_of_a_run(tmp_path):
    r = _launch("train.py", f"--workdir=file://{tmp_path}")  # a URI (epath maps file:// to the local path)
    assert r.returncode == 0, r.stderr[-3000:]
    checkpoints = _tree(tmp_path / "checkpoints")
    r = _launch("polish.py", f"--workdir=file://{tmp_path}", "--config.polish.num_samples=200")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "eval top-1, polished statistics" in r.stdout
    result = json.loads((tmp_path / "polish.json").read_text())
    assert result["step"] == 6 and result["num_samples"] == 200 and result["num_passes"] >= 1
    assert 0.0 <= result["ema_accuracy"] <= 1.0 and 0.0 <= result["polished_accuracy"] <= 1.0
    assert (tmp_path / "polished_batch_stats").is_dir()
    assert json.loads((tmp_path / "polish_config.json").read_text())["polish"]["num_samples"] == 200
    assert _tree(tmp_path / "checkpoints") == checkpoints  # the run's own checkpoints are left as they are


def test_a_workdir_without_checkpoints_is_refused(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    r = _launch("polish.py", f"--workdir={tmp_path}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: invalid --workdir=") and "no checkpoints/ directory" in r.stderr
    assert os.listdir(tmp_path) == ["keep.txt"]
