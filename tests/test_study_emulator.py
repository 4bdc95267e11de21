"""experiments/study_emulator.py: the emulator's config from measured pmfs (fast), and a --quick end-to-end
run at a tiny model (slow), and a bad study block refused with exit status 2 before anything is written."""
import json
import os
import subprocess
import sys

import pytest
from launcher_util import launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "experiments", "study_emulator.py")
CONFIG = os.path.join(ROOT, "experiments", "configs", "emulator_study.py")
sys.path.insert(0, ROOT)


def _run(*args, timeout=900):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_emulator_config_follows_the_measured_pmfs():
    study_emulator = launcher("study_emulator")
    from experiments.configs import emulator_study
    from jaxsprint.emulation import adapter

    base = emulator_study.get_config()
    stats = {"staleness_pmf": {"1": 0.25, "3": 0.75}, "count_pmf": {"0": 0.5, "2": 0.2, "5": 0.3}}
    c = study_emulator.emulator_config(base, 1, 4, stats, 123)
    a = c.async_emulation
    assert a.enabled and a.sampler == "pmf" and a.max_staleness == 3
    assert a.pmf == pytest.approx((0.0, 0.25, 0.0, 0.75))
    assert a.num_sub_batches == 5 and c.batch_size == 5 * base.sprint.sub_batch
    assert a.k_pmf == pytest.approx((0, 0, 0.4, 0, 0, 0.6))  # K >= 1, renormalised
    assert c.num_train_steps == 123 and c.seed == 4 and "study" not in c
    assert c.bn.reduction == "group" and c.bn.group_size == base.sprint.sub_batch
    # The runtime's peak rate: linear scaling for sub_batch x learners, given to the emulator unscaled.
    assert c.lr.scaling == "none"
    assert c.lr.base == pytest.approx(base.lr.base * base.sprint.sub_batch * base.study.learners[1]
                                      / base.lr.reference_batch)
    adapter.validate_config(c)
    # A configuration with its own sub-batch: the runtime's and the emulator's sub-batch and rate follow it.
    i = 2
    with base.unlocked():
        base.study.sub_batches = (16, 16, 128)
    b = 128
    assert b != base.sprint.sub_batch
    assert study_emulator.runtime_config(base, i, 0).sprint.sub_batch == b
    c = study_emulator.emulator_config(base, i, 0, stats, 10)
    assert c.batch_size == 5 * b and c.bn.group_size == b
    assert c.lr.base == pytest.approx(base.lr.base * b * base.study.learners[i] / base.lr.reference_batch)


@pytest.mark.slow  # two short trainings (runtime and emulator) of a tiny model, with their compiles
def test_quick_study_end_to_end(tmp_path):
    from experiments.configs import emulator_study

    out = tmp_path / "study"
    r = _run(f"--config={CONFIG}", f"--out={out}", "--quick", "--config.model=tiny")
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((tmp_path / "study.json").read_text())
    assert sorted(results) == ["quick_s0_emulator", "quick_s0_runtime"]
    rt = results["quick_s0_runtime"]
    assert rt["published_updates"] >= 6 and 1 <= rt["applied_updates"] <= rt["published_updates"]
    assert 0.0 <= rt["eval_accuracy"] <= 1.0 and abs(sum(rt["staleness_pmf"].values()) - 1) < 1e-6
    em = results["quick_s0_emulator"]
    assert em["diverged"] or 0.0 <= em["eval_accuracy"] <= 1.0
    table = (tmp_path / "study.md").read_text()
    sub = emulator_study.get_config().sprint.sub_batch
    assert "| config | learners | sub-batch | network ms |" in table and f"| quick | 2 | {sub} | 10 |" in table
    written = json.loads((tmp_path / "study.config.json").read_text())  # the resolved (quick) config
    assert written["model"] == "tiny" and written["study"]["names"] == ["quick"]
    assert written["study"]["num_updates"] == 6


@pytest.mark.slow  # a subprocess that starts JAX: about a minute on the loaded machine
def test_bad_study_block_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "study"
    r = _run(f"--config={CONFIG}", f"--out={out}", "--config.study.learners=(8, 8)", timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: invalid config.study.learners" in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "study.json")


def test_tiny_study_trains_every_configuration_at_one_constant_rate():
    """The staleness-8 study (emulator_study_tiny.py): no linear scaling, so the runtime and the emulator of
    every configuration share one constant rate, and each configuration's own sub-batch reaches both."""
    study_emulator = launcher("study_emulator")
    from experiments.configs import emulator_study_tiny
    from jaxsprint.emulation import adapter

    base = emulator_study_tiny.get_config()
    assert base.model == "tiny_nobn" and base.lr.scaling == "none"
    stats = {"staleness_pmf": {"7": 0.5, "9": 0.5}, "count_pmf": {"1": 0.8, "2": 0.2}}
    for i in range(len(base.study.names)):
        rt = study_emulator.runtime_config(base, i, 1)
        em = study_emulator.emulator_config(base, i, 1, stats, 900)
        assert rt.sprint.sub_batch == base.study.sub_batches[i] and em.bn.group_size == base.study.sub_batches[i]
        assert em.lr.base == base.lr.base == 0.1 and em.optimizer.momentum == rt.optimizer.momentum == 0.5
        assert em.model == rt.model == "tiny_nobn" and em.batch_size == 2 * base.study.sub_batches[i]
        adapter.validate_config(em)
    study_emulator.validate_study(base, 8)
