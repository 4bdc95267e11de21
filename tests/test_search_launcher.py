"""End-to-end tests of experiments/search.py (and --machine_file in experiments/predict.py).

Many flag sets run in one child process (absl flags are process-global), as app.run would.
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
    cases = json.loads(sys.stdin.read())
    results = []
    for args in cases:
        launcher.FLAGS.unparse_flags()
        err, out = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                argv = launcher.parse_flags([module + ".py", *args])
                launcher.main(argv)
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
    from jaxsprint.perf import calibrate, machines
    path = tmp_path_factory.mktemp("preset") / "this_machine.json"
    m = machines.with_figures(machines.get("cpu"), network_latency_s=2e-4).replace(name="this_machine")
    calibrate.save_preset(str(path), m, compute_cv=0.02)
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
        "zero_tol": (SMALL + ["--target_minibatch=700", "--tolerance=0"], 2, "tolerance=0.0"),
        "neg_tol": (SMALL + ["--target_minibatch=700", "--tolerance=-0.1"], 2, "tolerance=-0.1"),
        "zero_target": (SMALL + ["--target_minibatch=0"], 2, "target_minibatch=0.0 is infeasible"),
        "missing_target": (SMALL, 2, "--target_minibatch is missing"),
        "staleness": (SMALL + ["--target_minibatch=700", "--max_staleness=0.5"], 2,
                      "max_staleness=0.5 is infeasible"),
        "unknown_machine": (["--machine=tsubame3", "--network=resnet8", "--target_minibatch=64"], 2,
                            "machine='tsubame3' is unknown; allowed: tsubame25"),
        "unknown_network": (["--machine=abci", "--network=resnet51", "--target_minibatch=64"], 2,
                            "network='resnet51' is unknown"),
        "both_machines": ([f"--machine_file={preset}", "--machine=abci", "--network=resnet8",
                           "--target_minibatch=64"], 2, "were both given"),
        "missing_file": (["--machine_file=/nonexistent/m.json", "--network=resnet8",
                          "--target_minibatch=64"], 2, "machine_file='/nonexistent/m.json' does not exist"),
        "too_many_gpus": (SMALL + ["--target_minibatch=700", "--max_gpus_per_node=9"], 2,
                          "max_gpus_per_node=9 is not allowed"),
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


def test_predict_launcher_reads_a_machine_file(preset):
    cases = [
        [f"--machine_file={preset}", "--network=resnet8", "--nodes=2", "--gpus_per_node=2",
         "--sub_batch=16", "--json"],
        ["--machine=cpu", "--network=resnet8", "--nodes=2", "--gpus_per_node=2", "--sub_batch=16",
         "--json"],
        [f"--machine_file={preset}", "--machine=cpu", "--network=resnet8"],
        ["--machine_file=/nonexistent/m.json", "--network=resnet8"],
    ]
    (c0, o0, e0), (c1, o1, e1), (c2, _, e2), (c3, _, e3) = _drive("predict", cases)
    assert c0 == 0 and c1 == 0, (e0, e1)
    from_file, preset_cpu = json.loads(o0), json.loads(o1)
    # Same compute figures, a larger all-reduce latency: same T_c, longer T_u.
    assert from_file["t_compute_s"] == pytest.approx(preset_cpu["t_compute_s"], rel=1e-6)
    assert from_file["t_update_s"] > preset_cpu["t_update_s"]
    assert c2 == 2 and "--machine_file" in e2 and "Traceback" not in e2
    assert c3 == 2 and "does not exist" in e3 and "Traceback" not in e3
