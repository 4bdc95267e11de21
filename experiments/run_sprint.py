r"""Runs SPRINT for real (jaxsprint.runtime) and judges the SPRINT model against what it measured.

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python experiments/run_sprint.py \
      --config=experiments/configs/sprint.py --workdir=/tmp/jaxsprint_sprint [--config.sprint.sub_batch=64 ...] \
      [--plot=/tmp/jaxsprint_sprint/pmfs.png] [--json]

Runs the learners and the updater (``runtime.run``), reads the event log (``workdir/events.npz``) without its
warm-up, and prints the measured statistics against two predictions of the SPRINT model: from the measured
cycles (T_c mean and cv, T_u mean and cv) and from specs (``--machine``/``--machine_file`` and the network's
cost table). ``--json`` prints one JSON object instead of the table: ``measured``, ``predicted_from_timings``,
``predicted_from_specs`` (each with ``epoch_time_s``, ``mean_minibatch``, ``mean_staleness``,
``minibatch_pmf``, ``staleness_pmf``: value as a string -> probability; ``measured`` also with the cycles,
``images_per_s``, ``gradients``, ``updates``), ``errors_from_timings``, ``errors_from_specs`` and
``eval_accuracy``. ``--events=FILE`` analyses a saved log instead of running. A run writes its resolved config
to ``workdir/config.json``. ``--series=B:NET_S:DUR_S,...`` runs several configurations in a row in the same
processes (each item's sub-batch, network time and length; everything else as the config says), each in
``workdir/run<i>``, with one report (one JSON line with ``--json``, with its ``series_index``) per item: what
a calibration measuring many configurations saves is the processes' start-up, seconds per run.

Multi-host: under srun or mpirun, or with ``--coordinator_address/--num_processes/--process_id``, as
experiments/train.py (``jaxsprint.cluster``); every
process runs this with the same config, process 0 prints and writes. A bad flag or config value exits with
status 2 and one message, before anything is written.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments import common_flags  # noqa: E402
from jaxsprint import cli  # noqa: E402
from jaxsprint.errors import ConfigError, DataError, check  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to an ml_collections SPRINT config file "
                                          "(experiments/configs/sprint.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the run: events.npz, summary.json, checkpoints.")
_CLUSTER = common_flags.define_cluster_flags()  # --coordinator_address, --num_processes, --process_id
_COORD, _NPROC, _PID = _CLUSTER
# --plot, --json, --machine (cpu_runtime when neither it nor --machine_file is given), --machine_file.
_PLOT, _JSON = common_flags.PLOT, common_flags.JSON
_MACHINE, _MACHINE_FILE = common_flags.MACHINE, common_flags.MACHINE_FILE
_DEFAULT_MACHINE = "cpu_runtime"
_SPECS = flags.DEFINE_bool("specs", True, "Also predict from specs (costs a few seconds of XLA cost analysis).")
_PREDICT = flags.DEFINE_bool("predict", True, "Predict at all (--nopredict: the measured statistics alone, without "
                             "the model's programs to compile; what the calibration's runs need).")
_UPDATE_CV = flags.DEFINE_bool("update_cv", True, "Give the model the measured jitter of the updater cycle "
                               "(False: the protocol's fixed cycle).")
_SERIES = flags.DEFINE_list("series", None, "Run these configurations in a row in the same processes, each "
                            "SUB_BATCH:NETWORK_TIME_S:DURATION_S (overriding those three config fields), each in "
                            "workdir/run<i>, one report each.")
_EVENTS = flags.DEFINE_string("events", None, "Analyse this events.npz instead of running (--config is then "
                              "only needed for --specs; --workdir is not used).")

_PLOT_EXTENSIONS = (".png", ".pdf", ".svg")


def _check_processes() -> None:
    """The multi-process flags one by one (whether they make a launch is `_initialize_distributed`'s)."""
    n, pid, address = _NPROC.value, _PID.value, _COORD.value
    check(n is None or n >= 1, "--num_processes", n, "an integer >= 1")
    check(pid is None or (pid >= 0 and (n is None or pid < n)), "--process_id", pid,
          f"an integer in [0, {n})" if n else "an integer >= 0")
    if address is not None:
        host, _, port = address.rpartition(":")
        check(bool(host) and port.isdigit() and 1 <= int(port) <= 65535, "--coordinator_address", address,
              "HOST:PORT of process 0, the port in [1, 65535]")


def _check_flags() -> None:
    if _EVENTS.value is None:
        check(_CONFIG.value is not None, "--config", None, "a config file is required "
                                                           "(e.g. experiments/configs/sprint.py)")
        check(bool(_WORKDIR.value), "--workdir", _WORKDIR.value, "a directory is required")
        cli.check_output_dir("--workdir", _WORKDIR.value)
    else:
        check(os.path.isfile(_EVENTS.value), "--events", _EVENTS.value, "an events.npz written by a run")
        if _CONFIG.value is None:
            check(not flags.FLAGS["specs"].present or not _SPECS.value, "--specs", True,
                  "needs --config (the network and the run's config) when --events is given")
    _check_processes()
    if _SERIES.value is not None:
        check(_EVENTS.value is None, "--series", _SERIES.value, "not with --events (a series runs)")
        check(_PLOT.value is None, "--series", _SERIES.value, "not with --plot (one figure per run)")
        _series()  # every item checked before anything runs
    if _PLOT.value is not None:
        check(os.path.splitext(_PLOT.value)[1].lower() in _PLOT_EXTENSIONS, "--plot", _PLOT.value,
              f"a file name ending in {', '.join(_PLOT_EXTENSIONS)}")
        parent = os.path.dirname(os.path.abspath(_PLOT.value))
        check(os.path.isdir(parent) or (_WORKDIR.value and os.path.abspath(parent).startswith(
            os.path.abspath(_WORKDIR.value))), "--plot", _PLOT.value,
            "a path in an existing directory (or in the workdir)")
        cli.check_output_file("--plot", _PLOT.value)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot", _PLOT.value, "needs matplotlib (pip install 'jaxsprint[plot]')") from None


def _series() -> list[tuple[int, float, float]]:
    """``(sub_batch, network_time_s, duration_s)`` of every --series item."""
    from jaxsprint.errors import is_real

    items = []
    for item in _SERIES.value:
        parts = item.split(":")
        ok = len(parts) == 3 and parts[0].isdigit() and int(parts[0]) >= 1
        try:
            net, dur = (float(parts[1]), float(parts[2])) if ok else (None, None)
        except ValueError:
            ok = False
        ok = ok and is_real(net) and net >= 0 and is_real(dur) and dur > 0
        check(ok, "--series", item, "items SUB_BATCH:NETWORK_TIME_S:DURATION_S, an integer >= 1, a number of "
              "seconds >= 0 and one > 0 (e.g. 32:0.02:10)")
        items.append((int(parts[0]), net, dur))
    check(bool(items), "--series", _SERIES.value, "at least one item SUB_BATCH:NETWORK_TIME_S:DURATION_S")
    return items


def _runs(config):
    """``(config, workdir)`` of every run: the config itself, or one per --series item (``workdir/run<i>``)."""
    import copy

    if _SERIES.value is None:
        return [(config, _WORKDIR.value)]
    out = []
    for i, (b, net, dur) in enumerate(_series()):
        c = copy.deepcopy(config)
        c.sprint.sub_batch, c.sprint.network_time_s, c.sprint.duration_s = b, net, dur
        out.append((c, os.path.join(_WORKDIR.value, f"run{i}")))
    return out


def _report(config, log, machine, eval_accuracy, json_out, series_index=None) -> None:
    """Prints the measured statistics of ``log`` against the model's predictions (table, or JSON)."""
    from jaxsprint.calibration import compare
    from jaxsprint.runtime import events

    measured = events.statistics(log)
    predictions = {"timings": compare.predict_from_timings(measured, use_update_cv=_UPDATE_CV.value)
                   if _PREDICT.value else None, "specs": None}
    if machine is not None and _PREDICT.value:
        network = compare.network_cost(config)
        predictions["specs"] = compare.predict_from_specs(
            *machine, network, config, num_hosts=measured["num_hosts"],
            learners_per_host=measured["learners_per_host"], dataset_size=measured["dataset_size"])
    if _PLOT.value is not None:
        os.makedirs(os.path.dirname(os.path.abspath(_PLOT.value)), exist_ok=True)
        compare.plot(_PLOT.value, measured, predictions)
    if _JSON.value:
        out = compare.report(measured, predictions)
        out["eval_accuracy"] = compare.jsonable(eval_accuracy)
        if series_index is not None:
            out["series_index"] = series_index
        print(json.dumps(out, allow_nan=False), file=json_out, flush=True)
    else:
        if series_index is not None:
            print(f"run {series_index} of the series: sub-batch {config.sprint.sub_batch}, network "
                  f"{config.sprint.network_time_s:g} s")
        print(compare.format_table(measured, predictions))
        if eval_accuracy is not None:
            print(f"eval accuracy of the last published weights: {eval_accuracy:.4f}")
        if _PLOT.value is not None:
            print(f"wrote {_PLOT.value}")


def _initialize_distributed(config) -> None:
    """Joins the processes of a multi-process run (flags, srun, mpirun; `jaxsprint.cluster`), bounded by
    ``config.sprint.init_timeout_s``; nothing for one process."""
    from jaxsprint import cluster
    from jaxsprint.errors import is_int

    timeout_s = config.sprint.init_timeout_s
    check(is_int(timeout_s) and timeout_s >= 1, "config.sprint.init_timeout_s", timeout_s, "an integer >= 1")
    cluster.initialize(**_CLUSTER.values(), timeout_s=timeout_s)


def _check_machine() -> None:
    """Refuses a bad --machine/--machine_file without building it (a Machine holds jax arrays, and nothing may
    start JAX's backend before ``jax.distributed.initialize``)."""
    from jaxsprint.perf import machines

    if _MACHINE_FILE.value:
        check(os.path.isfile(_MACHINE_FILE.value), "--machine_file", _MACHINE_FILE.value,
              "a preset file written by experiments/calibrate.py or experiments/calibrate_runtime.py")
    else:
        name = _MACHINE.value or _DEFAULT_MACHINE
        check(name in machines.PRESETS, "machine", name, f"one of {', '.join(machines.PRESETS)}")


def _machine():
    """``(machine, host figures)`` of --machine or --machine_file."""
    from jaxsprint.calibration import host
    from jaxsprint.perf import presets

    name = None if _MACHINE_FILE.value else (_MACHINE.value or _DEFAULT_MACHINE)
    machine = presets.load_machine(name, _MACHINE_FILE.value)
    return machine, host.load_host(machine, name, _MACHINE_FILE.value)


def _stdout_for_json():
    """A file on the original standard output, with file descriptor 1 sent to standard error from now on, so
    that what native libraries print on stdout (gloo's "[Gloo] Rank 0 is connected ...") stays out of the JSON."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


def main(argv):
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides flags")
    _check_flags()
    json_out = _stdout_for_json() if _JSON.value else None
    specs = _SPECS.value and _CONFIG.value is not None
    if specs:
        _check_machine()
    from jaxsprint.runtime import events

    config = _CONFIG.value
    if _EVENTS.value is not None:
        machine = _machine() if specs else None
        try:
            log = events.load(_EVENTS.value)
        except DataError as e:
            raise ConfigError("--events", _EVENTS.value, e.allowed) from None
        summary = os.path.join(os.path.dirname(os.path.abspath(_EVENTS.value)), "summary.json")
        eval_accuracy = None
        if os.path.exists(summary):
            with open(summary) as fh:
                eval_accuracy = json.load(fh).get("eval", {}).get("accuracy")
        _report(config, log, machine, eval_accuracy, json_out)
        return
    from jaxsprint.train import cpu
    from jaxsprint import runtime
    from jaxsprint.runtime import bounds

    print_info = cpu.configure_host_memory(config.cpu_kernels)  # before JAX starts its threads
    if not flags.FLAGS["verbosity"].present:  # libraries (orbax) log every save at INFO
        logging.set_verbosity(logging.WARNING)
    # What the start-up reads of the config, before JAX's backend starts (the rest: validate_config below).
    check("sprint" in config, "config.sprint", None, "a SPRINT config (see experiments/configs/sprint.py)")
    t = config.sprint.get("init_timeout_s")
    check(isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= bounds.MAX_SECONDS,
          "config.sprint.init_timeout_s", t, f"an integer number of seconds in [1, {bounds.MAX_SECONDS:g}]")
    _initialize_distributed(config)
    import jax

    runs = _runs(config)
    for c, _ in runs:
        runtime.validate_config(c, jax.local_device_count())  # every run's, before anything is written
    machine = _machine() if specs else None  # a bad preset file is refused before the run too
    logging.info(print_info)
    for i, (c, workdir) in enumerate(runs):
        # The resolved config (every override applied) goes into the workdir once the run has written there.
        with cli.config_beside_outputs(workdir, c, enabled=jax.process_index() == 0):
            result = runtime.run(c, workdir)
        if result.process_index == 0:
            _report(c, result.events, machine, result.eval.get("accuracy"), json_out,
                    None if _SERIES.value is None else i)


if __name__ == "__main__":
    cli.run(main)
