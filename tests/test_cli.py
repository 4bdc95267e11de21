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
