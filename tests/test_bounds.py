"""jaxsprint.runtime.bounds: what one host can start (threads, memory, times), refused before a run starts."""
import resource

import pytest

from experiments.configs import sprint
from jaxsprint import runtime
from jaxsprint.errors import ConfigError
from jaxsprint.runtime import bounds


def _config(model="resnet8", **fields):
    c = sprint.get_config()
    with c.unlocked():
        c.model = model
        for k, v in fields.items():
            c.sprint[k] = v
    return c


def test_the_thread_limit_is_the_cap_or_what_the_os_allows_below_it():
    most, why = bounds.learner_thread_limit()
    assert 0 < most <= bounds.MAX_LEARNERS_PER_HOST and why
    runtime.validate_config(_config("tiny", learners_per_host=most), 8)  # a small model: its memory fits
    with pytest.raises(ConfigError, match=rf"invalid config\.sprint\.learners_per_host={most + 1}: at most {most} "):
        runtime.validate_config(_config("tiny", learners_per_host=most + 1), 8)


def test_a_low_process_limit_bounds_the_learners(monkeypatch):
    real = resource.getrlimit
    monkeypatch.setattr(bounds.resource, "getrlimit",
                        lambda r: (200, 200) if r == resource.RLIMIT_NPROC else real(r))
    monkeypatch.setattr(bounds, "_running_threads", lambda: 10)  # this process's threads, fixed for the test
    monkeypatch.setattr(bounds, "_cgroup_pids_left", lambda: None)
    most, why = bounds.learner_thread_limit()
    assert most == 200 - 10 - bounds.RESERVED_THREADS and "RLIMIT_NPROC=200" in why
    bounds.check_host(_config("tiny", learners_per_host=most), 8)
    with pytest.raises(ConfigError, match=rf"learners_per_host={most + 1}: at most {most} learner threads .*"
                                          r"RLIMIT_NPROC=200"):
        bounds.check_host(_config("tiny", learners_per_host=most + 1), 8)


def test_memory_names_the_part_that_does_not_fit():
    c = _config(learners_per_host=8, sub_batch=32)
    f = bounds.footprint_bytes(c, 8, 8)
    assert f["learners"] == 8 * f["learner"] and f["learners_busiest_device"] == f["learner"]
    assert f["learner"] > f["learner_activations"] > 0 and f["polish"] == 0
    need = f["state"] + f["learners"] + f["eval"]
    bounds.check_host(c, 8, memory_limit_bytes=need)
    with pytest.raises(ConfigError, match=r"invalid config\.sprint\.sub_batch=32: a value for which the run fits"):
        bounds.check_host(c, 8, memory_limit_bytes=need - 1)
    with c.unlocked():
        c.eval_batch_size = 100_000
    with pytest.raises(ConfigError, match=r"invalid config\.eval_batch_size=100000: .*the evaluation"):
        bounds.check_host(c, 8, memory_limit_bytes=need)


@pytest.mark.parametrize("fields,field", [
    (dict(warmup_s=10.0), "warmup_s"), (dict(network_time_s=12.0), "network_time_s"),
    (dict(duration_s=bounds.MAX_SECONDS * 2), "duration_s"), (dict(join_timeout_s=1e9), "join_timeout_s"),
])
def test_times_a_run_cannot_use(fields, field):
    with pytest.raises(ConfigError, match=rf"invalid config\.sprint\.{field}="):
        runtime.validate_config(_config(**fields), 8)
    runtime.validate_config(_config(duration_s=0.0, num_updates=5, warmup_s=30.0), 8)  # no duration: no relation
