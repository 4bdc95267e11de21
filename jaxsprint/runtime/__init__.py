"""SPRINT for real: learner threads, node buffer, updater, cross-host all-reduce, event log.

    from jaxsprint import runtime
    runtime.validate_config(config, num_local_devices)   # ConfigError naming the field; writes nothing
    result = runtime.run(config, workdir)                  # -> runtime.RunResult; workdir/events.npz

Modules: `buffer` (node buffer, published weights), `learner` (learner threads), `updater` (the updater's
cycle), `collective` (cross-host psum and gather, `initialize_distributed`), `run` (the whole run);
`events` reads the event log (its comparison with the model is
:mod:`jaxsprint.calibration.compare`).
"""
from jaxsprint.runtime.collective import initialize_distributed
from jaxsprint.runtime.run import RunResult, run, validate_config

__all__ = ["RunResult", "initialize_distributed", "run", "validate_config"]
