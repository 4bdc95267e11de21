r"""The parts of scripts/gpu_check.sh that judge the SPRINT model on the machine the check runs on (docs/gpu.md).

``--part=model``: the specs model (:mod:`jaxsprint.perf`) next to the step that scripts/bench_gpu.py measured
(``--bench``, its JSON). The network's cost table comes from the zoo (:mod:`jaxsprint.perf.zoo`). The bench must
have run the zoo's input shape: ResNet-50 at 224x224 with 1000 classes, or a CIFAR ResNet at 32x32 with 10
classes. The machine is ``--machine``. With ``--peak=bench`` its peak is replaced by the bench's (the peak its
MFU used: bf16 tensor cores on an H200). Two times are predicted:
``predicted_step_s`` (:func:`jaxsprint.perf.times.device_step_time_s`: forward, backward and overheads, which is
what the bench times, with its batch already on the device) and ``predicted_compute_s``
(:func:`~jaxsprint.perf.times.compute_time_s`, T_c of one learner: the step plus reading the input and copying
the weights and the gradient). Then ``relative_error = predicted_step_s / measured_step_s - 1``.

``--part=sprint``: experiments/run_sprint.py ``--json`` with each of ``--learners`` learner threads on one device
(``--config.sprint.devices=1 --config.sprint.learners_per_host=N``), for ``--duration_s`` each. It records the
measured images/s, the model's prediction from the measured cycles, and the errors of that prediction. Next to
that is the synchronous train step of the same model and sub-batch on that device (scripts/bench_gpu.py:
:func:`jaxsprint.train.trainer.make_train_step`, batch on the device). ``--config`` and its ``--config.<field>``
overrides go to every run.

Both parts write ``--json``; the sprint part rewrites it after every run, so a part that is cut short keeps what
it measured. A part exits 1 when something it ran failed (the failure is recorded in the JSON) and 2 on a bad
flag.

  python scripts/gpu_parts.py --part=model --bench=bench.json --machine=dgx_h200 --peak=bench --json=model.json
  python scripts/gpu_parts.py --part=sprint --learners=1,2,4 --duration_s=10 --workdir=DIR --json=sprint.json
"""
from __future__ import annotations

import json
import os
import sys
import time

from absl import flags
from ml_collections import config_flags

import benchlib
from jaxsprint import cli, subprocs
from jaxsprint.errors import ConfigError, check

_PART = flags.DEFINE_enum("part", None, ["model", "sprint"], "Which part to run.")
_JSON = flags.DEFINE_string("json", None, "Write the part's figures to this JSON file.")
_BENCH = flags.DEFINE_string("bench", None, "model: the JSON of scripts/bench_gpu.py.")
_MACHINE = flags.DEFINE_string("machine", "dgx_h200", "model: machine preset (jaxsprint.perf.machines.PRESETS).")
_PEAK = flags.DEFINE_enum("peak", "preset", ["preset", "bench"], "model: the peak FLOP/s of the prediction: the "
                          "preset's, or the bench's peak_flops_per_s (its MFU's peak).")
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(benchlib.ROOT, "experiments", "configs", "sprint.py"), "sprint: the SPRINT config.")
_LEARNERS = flags.DEFINE_list("learners", ["1", "2", "4"], "sprint: learner thread counts, one run each.")
_DURATION = flags.DEFINE_float("duration_s", 10.0, "sprint: seconds of each run after its common start.")
_WARMUP = flags.DEFINE_float("warmup_s", 2.0, "sprint: seconds at the start of each run left out.")
_RUN_TIMEOUT = flags.DEFINE_float("run_timeout_s", 180.0, "sprint: bound on each run, start-up included.")
_SYNC_STEPS = flags.DEFINE_integer("sync_steps", 20, "sprint: steps per timed round of the synchronous step.")
_WORKDIR = flags.DEFINE_string("workdir", None, "sprint: directory of the runs.")

_FAILURE_TAIL_CHARS = 1500


def _zoo_network(model: str, image_size: int, channels: int, num_classes: int):
    """The zoo's cost table of `model` at that input shape (a ConfigError names the ones there are)."""
    from jaxsprint.perf import zoo

    # The input shapes the zoo's tables are built for (jaxsprint.perf.zoo).
    shapes = {name: (32, 3, 10) for name in ("resnet8", "resnet20", "resnet32", "resnet56")}
    shapes["resnet50"] = (224, 3, 1000)
    if shapes.get(model) != (image_size, channels, num_classes):
        allowed = ", ".join(f"{n} at {s[0]}x{s[0]}x{s[1]}, {s[2]} classes" for n, s in shapes.items())
        raise ConfigError("bench model", (model, image_size, channels, num_classes),
                          f"one with a zoo cost table: {allowed}")
    return zoo.get(model)


def model_part(bench: dict) -> dict:
    """The specs model's step time for the bench's network, batch and device (see the module docstring)."""
    from jaxsprint.perf import machines, presets, times

    network = _zoo_network(bench["model"], bench["image_size"], bench.get("channels", 3), bench["num_classes"])
    preset = presets.load_machine(_MACHINE.value)
    machine = preset
    if _PEAK.value == "bench":
        machine = machines.with_figures(preset, peak_flops_per_s=bench["peak_flops_per_s"])
    b, measured = bench["batch"], bench["step_s"]
    step_s = float(times.device_step_time_s(network, machine, b))
    return dict(
        network=network.name, machine=machine.name, peak=_PEAK.value,
        peak_flops_per_s=presets.figure(machine.peak_flops_per_s),
        preset_peak_flops_per_s=presets.figure(preset.peak_flops_per_s), batch=b, dtype=bench["dtype"],
        device_kind=bench["device_kind"], predicted_step_s=step_s,
        predicted_compute_s=float(times.compute_time_s(network, machine, b, gpus_per_node=1)),
        predicted_step_s_at_preset_peak=float(times.device_step_time_s(network, preset, b)),
        measured_step_s=measured, relative_error=step_s / measured - 1.0,
        model_flops_per_step=float(network.summary()["train_flops"]) * b, xla_flops_per_step=bench["flops_per_step"],
        model_bytes_per_value=4)


def _call(cmd: list[str]) -> tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of `cmd` within --run_timeout_s (124 and the threads' stacks when hung)."""
    try:
        done = subprocs.run_together([cmd], timeout_s=_RUN_TIMEOUT.value)[0]
    except subprocs.Hung as e:
        return 124, "", str(e)
    return done.returncode, done.stdout, done.stderr


def _tail(text: str) -> str:
    return text[-_FAILURE_TAIL_CHARS:]


def _scalars(d: dict | None) -> dict | None:
    """The figures of a run_sprint.py JSON section without its pmfs."""
    return None if d is None else {k: v for k, v in d.items() if not isinstance(v, (dict, list))}


def _sync(config, sub_batch: int, workdir: str) -> dict:
    """images/s of jaxsprint.train.trainer's step, same model and sub-batch, on the first device (bench_gpu.py)."""
    from jaxsprint.train import data

    num_classes, channels = data.expected_shape(config.dataset)
    path = os.path.join(workdir, "sync.json")
    cmd = [sys.executable, os.path.join(benchlib.ROOT, "scripts", "bench_gpu.py"), f"--model={config.model}",
           f"--batch={sub_batch}", f"--image_size={config.image_size}", f"--channels={channels}",
           f"--num_classes={num_classes}", f"--dtype={config.dtype}", "--warmup=3", f"--steps={_SYNC_STEPS.value}",
           "--rounds=3", f"--json={path}"]
    rc, _, err = _call(cmd)
    if rc != 0:
        return {"rc": rc, "error": _tail(err)}
    with open(path) as fh:
        bench = json.load(fh)
    return {"rc": 0, **{k: bench[k] for k in ("model", "batch", "image_size", "channels", "dtype", "device_kind",
                                               "step_s", "images_per_s")}}


def _run(n: int, overrides: list[str], workdir: str) -> dict:
    """One run_sprint.py run with `n` learner threads on one device: its JSON's figures, or its failure."""
    config_file = config_flags.get_config_filename(flags.FLAGS["config"])
    cmd = [sys.executable, os.path.join(benchlib.ROOT, "experiments", "run_sprint.py"), f"--config={config_file}",
           *overrides, f"--workdir={os.path.join(workdir, f'learners{n}')}",
           "--config.sprint.devices=1", f"--config.sprint.learners_per_host={n}",
           f"--config.sprint.duration_s={_DURATION.value}", f"--config.sprint.warmup_s={_WARMUP.value}",
           "--config.sprint.num_updates=0", "--config.sprint.num_epochs=0", "--config.sprint.checkpoint=False",
           "--nospecs", "--json"]
    t0 = time.perf_counter()
    rc, stdout, stderr = _call(cmd)
    out = {"learners": n, "rc": rc, "seconds": time.perf_counter() - t0}
    if rc != 0:
        return {**out, "error": _tail(stderr)}
    report = json.loads(stdout.strip().splitlines()[-1])
    return {**out, "measured": _scalars(report["measured"]),
            "predicted_from_timings": _scalars(report["predicted_from_timings"]),
            "errors_from_timings": report["errors_from_timings"], "eval_accuracy": report["eval_accuracy"]}


def sprint_part(learners: list[int], workdir: str, write) -> dict:
    """The runs of `learners` threads and the synchronous step; `write(figures)` after each (module docstring)."""
    config = _CONFIG.value
    sub_batch = int(config.sprint.sub_batch)
    overrides = [a for a in sys.argv[1:] if a.startswith("--config.")]
    out = dict(model=config.model, image_size=config.image_size, dataset=config.dataset, dtype=config.dtype,
               sub_batch=sub_batch, duration_s=_DURATION.value, warmup_s=_WARMUP.value, devices=1,
               synchronous=None, runs=[])
    out["synchronous"] = _sync(config, sub_batch, workdir)
    write(out)
    sync_rate = out["synchronous"].get("images_per_s")
    for n in learners:
        run = _run(n, overrides, workdir)
        rate = (run.get("measured") or {}).get("images_per_s")
        run["images_per_s_over_sync"] = rate / sync_rate if rate and sync_rate else None
        out["runs"].append(run)
        write(out)
    return out


def main(argv):
    if len(argv) > 1:
        raise ConfigError("arguments", argv[1:], "none besides flags")
    check(_PART.value is not None, "--part", None, "one of model, sprint")
    check(bool(_JSON.value), "--json", _JSON.value, "a file to write the figures to")
    if _PART.value == "model":
        check(bool(_BENCH.value) and os.path.isfile(_BENCH.value), "--bench", _BENCH.value,
              "the JSON file scripts/bench_gpu.py wrote")
        from jaxsprint.perf import machines

        check(_MACHINE.value in machines.PRESETS, "--machine", _MACHINE.value,
              f"one of {', '.join(machines.PRESETS)}")
        with open(_BENCH.value) as fh:
            out = model_part(json.load(fh))
        benchlib.write_json(_JSON.value, out)
        print(f"{out['network']} batch {out['batch']} on {out['machine']} (peak {out['peak_flops_per_s']:.4g} "
              f"FLOP/s): predicted {1e3 * out['predicted_step_s']:.2f} ms, measured "
              f"{1e3 * out['measured_step_s']:.2f} ms, relative error {out['relative_error']:+.1%}")
        return
    learners = []
    for v in _LEARNERS.value:
        check(v.isdigit() and int(v) >= 1, "--learners", v, "comma-separated integers >= 1")
        learners.append(int(v))
    check(_DURATION.value > _WARMUP.value >= 0, "--duration_s", _DURATION.value,
          f"longer than --warmup_s={_WARMUP.value} (which is >= 0)")
    check(_RUN_TIMEOUT.value > _DURATION.value, "--run_timeout_s", _RUN_TIMEOUT.value, "longer than --duration_s")
    check(_SYNC_STEPS.value >= 1, "--sync_steps", _SYNC_STEPS.value, "an integer >= 1")
    check(bool(_WORKDIR.value), "--workdir", _WORKDIR.value, "a directory for the runs")
    os.makedirs(_WORKDIR.value, exist_ok=True)
    out = sprint_part(learners, _WORKDIR.value, lambda figures: benchlib.write_json(_JSON.value, figures))
    sync = out["synchronous"].get("images_per_s")
    print(f"synchronous step: {sync:.0f} images/s" if sync else f"synchronous step failed: {out['synchronous']}")
    for run in out["runs"]:
        if run["rc"] != 0:
            print(f"{run['learners']} learners: failed (rc {run['rc']})")
            continue
        m, p = run["measured"], run["predicted_from_timings"]
        print(f"{run['learners']} learners: {m['images_per_s']:.0f} images/s measured, {p['images_per_s']:.0f} "
              f"predicted from the timings; mean staleness {m['mean_staleness']:.2f} measured, "
              f"{p['mean_staleness']:.2f} predicted")
    if out["synchronous"]["rc"] != 0 or any(run["rc"] != 0 for run in out["runs"]):
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
