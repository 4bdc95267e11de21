"""jaxsprint.cli: a JaxsprintError or a bad flag becomes exit status 2 and one line, without a traceback."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LAUNCHER = textwrap.dedent("""
    from absl import flags
    from jaxsprint import cli
    from jaxsprint.errors import ConfigError
    _N = flags.DEFINE_integer("n", 1, "a number")

    def main(argv):
        if _N.value < 0:
            raise ConfigError("--n", _N.value, "allowed: >= 0")
        if _N.value == 7:
            raise RuntimeError("a bug, not a user error")
        print("ok", _N.value)

    cli.run(main)
""")


def _run(*args):
    return subprocess.run([sys.executable, "-c", _LAUNCHER, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))


def test_success_runs_main():
    r = _run("--n=3")
    assert r.returncode == 0 and r.stdout.strip() == "ok 3"


def test_a_project_error_is_one_line_and_exit_2():
    r = _run("--n=-1")
    assert r.returncode == 2 and r.stderr == "error: invalid --n=-1: allowed: >= 0\n"


def test_a_bad_flag_is_one_line_and_exit_2():
    for args in (["--n=abc"], ["--no_such_flag=1"]):
        r = _run(*args)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_a_bug_keeps_its_traceback():
    r = _run("--n=7")
    assert r.returncode == 1 and "Traceback" in r.stderr and "a bug, not a user error" in r.stderr


def test_config_lists_take_tuples_or_comma_separated_text():
    import math

    import pytest

    from jaxsprint import cli
    from jaxsprint.errors import ConfigError

    assert cli.text_list("config.x", ("2,8", "inf", 3)) == ["2", "8", "inf", 3]
    assert cli.text_list("config.x", ("",)) == [] and cli.text_list("config.x", None) == []
    assert cli.float_list("config.x", ("2,8,inf",)) == [2.0, 8.0, math.inf]
    for bad in (("2,x",), (True,), {"a": 1}):
        with pytest.raises(ConfigError, match=r"^invalid config\.x="):
            cli.float_list("config.x", bad)


def test_library_errors_name_the_config_field():
    import pytest

    from jaxsprint import cli
    from jaxsprint.errors import ConfigError, DataError

    for error in (ConfigError, DataError):
        with pytest.raises(error, match=r"^invalid config\.machine='x'"):
            with cli.as_config_fields():
                raise error("machine", "x", "a preset")
    with pytest.raises(ConfigError, match=r"^invalid --out="):  # a launcher flag keeps its name
        with cli.as_config_fields():
            raise ConfigError("--out", "x", "a file")


def test_the_config_goes_beside_what_a_run_wrote(tmp_path):
    import json

    import ml_collections

    from jaxsprint import cli

    config = ml_collections.ConfigDict({"seed": 3, "lr": {"base": 0.1}, "limits": (2.0, float("inf"))})
    with cli.config_beside_outputs(str(tmp_path / "refused"), config):
        pass  # nothing written: no config.json either
    assert not (tmp_path / "refused").exists()
    run = tmp_path / "run"
    with cli.config_beside_outputs(str(run), config):
        run.mkdir()
        (run / "summary.json").write_text("{}")
    written = json.loads((run / "config.json").read_text())
    assert written == {"seed": 3, "lr": {"base": 0.1}, "limits": [2.0, float("inf")]}


_DEFAULTED = textwrap.dedent("""
    import os, sys
    from jaxsprint import cli
    path = os.path.join(os.environ["CONFIG_DIR"], "c.py")
    _C = cli.define_config_file("config", path, "a config with a default file")

    def main(argv):
        print("seed", _C.value.seed)

    cli.run(main)
""")


def test_a_default_config_file_takes_overrides_and_refuses_unknown_fields(tmp_path):
    (tmp_path / "c.py").write_text("import ml_collections\n\ndef get_config():\n"
                                   "    return ml_collections.ConfigDict({'seed': 0})\n")
    env = dict(os.environ, PYTHONPATH=ROOT, CONFIG_DIR=str(tmp_path))
    run = lambda *a: subprocess.run([sys.executable, "-c", _DEFAULTED, *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=120, cwd=ROOT, env=env)
    r = run("--config.seed=5")
    assert r.returncode == 0 and "seed 5" in r.stdout, r.stderr
    r = run("--config.no_such=1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: invalid config.no_such='1': not a field of the config file {tmp_path / 'c.py'} (an override must "
        "name one of its fields; new fields go into the file)"]


def test_the_config_is_written_through_epath_and_a_refused_body_keeps_the_old_one(tmp_path):
    import json

    import ml_collections
    import pytest

    from jaxsprint import cli

    config = ml_collections.ConfigDict({"seed": 3})
    path = cli.write_config(f"file://{tmp_path / 'run'}", config)
    assert path == str(tmp_path / "run" / "config.json") and sorted(os.listdir(tmp_path / "run")) == ["config.json"]
    config.seed = 4
    with pytest.raises(RuntimeError):  # refused before it wrote anything: the run's config stays
        with cli.config_beside_outputs(str(tmp_path / "run"), config):
            raise RuntimeError("refused")
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"seed": 3}
    with cli.config_beside_outputs(str(tmp_path / "run"), config):
        pass  # a run that ended (a resumed one) rewrites it
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"seed": 4}
