"""SPRINT for real: learner threads, node buffer, updater, cross-host all-reduce, event log.

    from jaxsprint import runtime
    runtime.validate_config(config, num_local_devices)   # ConfigError naming the field; writes nothing
    result = runtime.run(config, workdir)                  # -> runtime.RunResult; workdir/events.npz

Modules: `buffer` (node buffer, published weights), `learner` (learner threads), `updater` (the updater's
cycle), `collective` (cross-host psum and gather; the hosts join through `jaxsprint.cluster`), `run` (the
whole run);
`events` reads the event log (its comparison with the model is
:mod:`jaxsprint.calibration.compare`).
"""
from jaxsprint.runtime.run import RunResult, run, validate_config

__all__ = ["RunResult", "run", "validate_config"]
