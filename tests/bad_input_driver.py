"""Runs many argument lists through one launcher in one process, as its command line would, and reports each.

    python tests/bad_input_driver.py LAUNCHER.py CASES.json OUT.json

CASES.json is a list of ``{"id": str, "argv": [str, ...]}``. For each case the absl flags are reset (a config
flag's default file is loaded afresh with the case's overrides, as at the launcher's import), parsed
from ``argv`` by :func:`jaxsprint.cli.parse_flags` and the launcher's ``main`` is called through
:func:`jaxsprint.cli.guarded`, exactly the two steps of :func:`jaxsprint.cli.run`; a ``SystemExit`` gives
the exit status, any other exception is printed as a traceback (status 1), as the interpreter would. The
whole tree under the current directory is snapshotted (paths, sizes, mtimes) before and after each case.

OUT.json: a list of ``{"id", "code", "stderr", "changed": [paths added, removed or modified]}``. Used by
``tests/test_bad_inputs.py``, which starts one such process per launcher so that JAX is imported once.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import traceback


def snapshot(root: str) -> dict[str, tuple[int, int]]:
    """Every file and directory under `root`: relative path -> (size, mtime in ns); directories size -1."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            rel = os.path.relpath(path, root)
            out[rel] = (-1 if name in dirnames else st.st_size, st.st_mtime_ns)
    return out


def changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def _reload_default_configs(argv: list[str]) -> None:
    """A config flag with a default file and no ``--name=`` in `argv`: a fresh copy of its default config, with
    the override flags of `argv` defined, as ml_collections does when the launcher is imported by the command."""
    from absl import flags
    from ml_collections.config_flags import config_flags as cf

    from jaxsprint import cli

    for name, flag in list(flags.FLAGS._flags().items()):  # noqa: SLF001 (absl has no public iterator)
        if name != flag.name or not cf.is_config_flag(flag) or flag.default is None:
            continue
        if any(a == f"--{name}" or a.startswith(f"--{name}=") for a in argv):
            continue
        path = str(flag.default_as_str).strip("'\"")
        try:
            flag.value = flag._parse(path)  # noqa: SLF001
        except (KeyError, AttributeError) as e:  # what jaxsprint.cli.define_config_file does at import
            cli.fail(cli.override_error(name, path, argv, e))


def run_case(module, launcher: str, argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``launcher argv`` in this process."""
    from absl import flags

    from jaxsprint import cli

    flags.FLAGS.unparse_flags()
    for name in [n for n in flags.FLAGS if "." in n]:  # ml_collections' per-override flags of the last case
        delattr(flags.FLAGS, name)
    for name in list(flags.FLAGS):  # ml_collections loads a config file into sys.modules["<flag>_config"] and
        sys.modules.pop(f"{name}_config", None)  # would reuse that module (and a get_config it no longer has)
    sys.argv = [launcher] + list(argv)  # ml_collections reads the overrides from sys.argv
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            _reload_default_configs(argv)
            remaining = cli.parse_flags([launcher] + list(argv))
            cli.guarded(module.main)(remaining)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 (what the interpreter would print)
            traceback.print_exc()
            code = 1
    return code, out.getvalue(), err.getvalue()


def main(argv: list[str]) -> None:
    launcher, cases_path, out_path = argv[1:4]
    with open(cases_path) as f:
        cases = json.load(f)
    spec = importlib.util.spec_from_file_location("launcher_under_test", launcher)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = os.getcwd()
    results = []
    for case in cases:
        print(f"case {case['id']}: {' '.join(case['argv'])}", file=sys.stderr, flush=True)  # the one that hangs
        before = snapshot(root)
        code, _, err = run_case(module, launcher, case["argv"])
        results.append({"id": case["id"], "code": code, "stderr": err,
                        "changed": [p for p in changed(before, snapshot(root)) if p != os.path.basename(out_path)]})
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv)
