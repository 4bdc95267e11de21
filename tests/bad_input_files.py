"""The scratch directory of ``tests/test_bad_inputs.py``: the input files its cases name (paths relative to it)."""
from __future__ import annotations

import json


def good_measurements() -> dict:
    steps = [dict(model=m, batch=b, measured_s=0.001 * b * (1 + i))
             for i, m in enumerate(("resnet8", "resnet20", "resnet32", "resnet56")) for b in (4, 8, 16, 32, 64)]
    ars = [dict(bytes=n, ranks=r, measured_s=1e-4 + n * 1e-9 * r) for n in (4096, 65536) for r in (2, 3)]
    return {"measurements": {"steps": steps, "allreduces": ars}}


def bad_measurements() -> dict[str, dict]:
    def edit(fn):
        d = good_measurements()
        fn(d["measurements"])
        return d

    out = {
        "meas_missing_key": edit(lambda m: m["steps"][0].pop("batch")),
        "meas_unknown_model": edit(lambda m: m["steps"][0].update(model="resnet7")),
        "meas_batch_text": edit(lambda m: m["steps"][1].update(batch="four")),
        "meas_batch_zero": edit(lambda m: m["steps"][1].update(batch=0)),
        "meas_one_rank": edit(lambda m: m["allreduces"][0].update(ranks=1)),
        "meas_time_negative": edit(lambda m: m["steps"][2].update(measured_s=-0.5)),
        "meas_time_nan": edit(lambda m: m["allreduces"][1].update(measured_s=float("nan"))),
        "meas_bytes_zero": edit(lambda m: m["allreduces"][1].update(bytes=0)),
        "meas_steps_not_list": edit(lambda m: m.update(steps={"a": 1})),
        "meas_record_not_dict": edit(lambda m: m["steps"].append(3)),
        "meas_ranks_text": edit(lambda m: m["allreduces"][0].update(ranks="two")),
        "meas_no_steps": edit(lambda m: m.update(steps=[])),
        "meas_records_missing_shape": {"records": [{"measured_s": 0.1}]},
    }
    return out


def preset(**figures) -> dict:
    """A preset file's JSON as experiments/calibrate.py writes it, with `figures` changed."""
    from jaxsprint.perf import machines, presets

    m = machines.get("cpu")
    data = dict(format=presets.PRESET_FORMAT, name="test", description="test",
                figures={f: float(getattr(m, f)) for f in machines.FIELDS}, sources=dict(m.sources))
    data["figures"].update(figures)
    for k, v in figures.items():
        if v is None:
            del data["figures"][k]
    return data


def write(path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def write_scratch(d) -> None:
    """Writes every input the cases name into the directory `d` (a ``pathlib.Path``)."""
    import numpy as np

    from jaxsprint.runtime import events

    (d / "w").mkdir()
    (d / "w" / "keep.txt").write_text("earlier results")
    (d / "afile").write_text("a file, not a directory")
    (d / "run" / "checkpoints").mkdir(parents=True)   # polish: checked before any checkpoint is read
    write(d / "broken_config.py", "def get_config(:\n")
    write(d / "no_get_config.py", "X = 1\n")
    write(d / "bad_figure.json", preset(peak_flops_per_s="fast"))
    write(d / "nan_figure.json", preset(peak_flops_per_s=float("nan")))
    write(d / "missing_figure.json", preset(peak_flops_per_s=None))
    write(d / "not_json.json", "{not json")
    write(d / "wrong_format.json", {"format": "something-else"})
    write(d / "list.json", [1, 2, 3])
    write(d / "good_meas.json", good_measurements())
    for name, data in bad_measurements().items():
        write(d / "bad" / f"{name}.json", data)
    write(d / "bad_results.json", "{truncated")
    # run_sprint.py's saved logs, calibrate_runtime.py's runs_from and measurements.
    events.save(str(d / "good_events.npz"), events.simulate_log(2, 0.01, 0.02, 0.3, 0.2, duration_s=2.0,
                                                               warmup_s=0.5, sub_batch=8, seed=0))
    np.savez(d / "not_events.npz", a=np.zeros(3))
    (d / "results_no_runs.json").write_text(json.dumps({"runs": []}))
    (d / "results_bad_run.json").write_text(json.dumps({"runs": [{"name": "x", "measured": {}}]}))
    (d / "cal_meas.json").write_text(json.dumps({"format": "something-else"}))
