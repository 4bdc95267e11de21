"""End-to-end tests of experiments/search.py.

Many flag sets run in one child process (absl flags are process-global), as jaxsprint.cli.run would.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys
    module = sys.argv[1]
    sys.argv = [module + ".py"]
    sys.path.insert(0, "experiments")
    launcher = __import__(module)
    from jaxsprint import cli
    cases = json.loads(sys.stdin.read())
    results = []
    for args in cases:
        launcher.FLAGS.unparse_flags()
        err, out = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                argv = cli.parse_flags([module + ".py", *args])
                cli.guarded(launcher.main)(argv)
            except SystemExit as e:
                code = e.code
        results.append([code, out.getvalue(), err.getvalue()])
    print(json.dumps(results))
""")


def _drive(module, cases):
    r = subprocess.run([sys.executable, "-c", _DRIVER, module], input=json.dumps(cases),
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """A saved "this machine" preset (the cpu preset with a changed latency), as calibrate writes."""
    from jaxsprint.perf import machines, presets
    path = tmp_path_factory.mktemp("preset") / "this_machine.json"
    m = machines.with_figures(machines.get("cpu"), network_latency_s=2e-4).replace(name="this_machine")
    presets.save_preset(str(path), m, compute_cv=0.02)
    return str(path)


SMALL = ["--machine=abci", "--network=resnet8", "--max_nodes=16", "--max_sub_batch=64", "--starts=8"]


def test_search_launcher_cases(preset, tmp_path):
    plot = str(tmp_path / "search.png")
    cases = {
        "json": (SMALL + ["--target_minibatch=700", "--grid", "--json"], 0, None),
        "table": (SMALL + ["--target_minibatch=700", "--sensitivities", f"--plot={plot}"], 0,
                  "chosen configuration"),
        "none": (SMALL + ["--target_minibatch=10000000"], 0, "no configuration meets the target"),
        "none_json": (SMALL + ["--target_minibatch=10000000", "--json"], 0, None),
        "file": ([f"--machine_file={preset}", "--network=resnet8", "--target_minibatch=16",
                  "--max_nodes=8", "--max_sub_batch=64", "--starts=8", "--json"], 0, None),
        "zero_tol": (SMALL + ["--target_minibatch=700", "--tolerance=0"], 2,
                     "invalid tolerance=0.0: a number > 0 and < 1"),
        "neg_tol": (SMALL + ["--target_minibatch=700", "--tolerance=-0.1"], 2,
                    "invalid tolerance=-0.1: a number > 0 and < 1"),
        "zero_target": (SMALL + ["--target_minibatch=0"], 2, "invalid target_minibatch=0.0: a finite number >= 1"),
        "missing_target": (SMALL, 2, "invalid --target_minibatch=None: a number >= 1 (samples); the flag is required"),
        "staleness": (SMALL + ["--target_minibatch=700", "--max_staleness=0.5"], 2,
                      "invalid max_staleness=0.5: a finite number > 1"),
        "unknown_machine": (["--machine=tsubame3", "--network=resnet8", "--target_minibatch=64"], 2,
                            "invalid machine='tsubame3': one of tsubame25"),
        "unknown_network": (["--machine=abci", "--network=resnet51", "--target_minibatch=64"], 2,
                            "invalid network='resnet51': one of alexnet"),
        "both_machines": ([f"--machine_file={preset}", "--machine=abci", "--network=resnet8",
                           "--target_minibatch=64"], 2,
                          f"invalid machine_file={preset!r}: not given together with machine='abci'"),
        "missing_file": (["--machine_file=/nonexistent/m.json", "--network=resnet8",
                          "--target_minibatch=64"], 2,
                         "invalid machine_file='/nonexistent/m.json': an existing JSON machine preset"),
        "too_many_gpus": (SMALL + ["--target_minibatch=700", "--max_gpus_per_node=9"], 2,
                          "invalid max_gpus_per_node=9: 1..4"),
        "zero_starts": (SMALL + ["--target_minibatch=700", "--starts=0"], 2, "invalid --starts=0: an integer in [1, "),
        "bad_flag": (SMALL + ["--target_minibatch=abc"], 2, "target_minibatch"),
    }
    results = _drive("search", [c[0] for c in cases.values()])
    by_name = dict(zip(cases, results))
    for name, (_, code, text) in cases.items():
        got_code, out, err = by_name[name]
        assert got_code == code, (name, got_code, err[-2000:])
        if code == 2:
            assert err.startswith("error: ") and "Traceback" not in err, (name, err)
            assert text in err, (name, err)
        elif text:
            assert text in out, (name, out)
    out = json.loads(by_name["json"][1])  # exactly one JSON object on stdout
    assert out["feasible"] and abs(out["best"]["mean_minibatch"] / 700 - 1) <= 0.05
    assert out["best"]["epoch_time_s"] <= out["grid"]["best"]["epoch_time_s"] * 1.01
    assert out["evaluations"]["gradient"] > 0 and out["grid"]["evaluations"] == 16 * 4 * 64
    assert out["space_size"] == 16 * 4 * 64 and isinstance(out["runner_ups"], list)
    table = by_name["table"][1]
    assert "runner-ups" in table and "evaluations:" in table and "sensitivities" in table
    assert "peak_flops_per_s" in table and os.path.getsize(plot) > 10_000
    none = json.loads(by_name["none_json"][1])
    assert none["feasible"] is False and none["best"] is None and none["closest"]["violation"] > 0
    file_out = json.loads(by_name["file"][1])
    assert file_out["feasible"] and file_out["best"]["gpus_per_node"] <= 2  # the cpu preset's 2 cores
