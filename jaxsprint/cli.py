"""Shared launcher plumbing: a bad flag or a `JaxsprintError` ends in exit status 2 and one line, no traceback.

Every message has the form of `jaxsprint.errors`: ``error: invalid <field>=<value>: <what is allowed>``. Flag
errors from absl and config-file errors from ml_collections (a file that does not exist or does not load, an
override of a field the file does not have) are put into that form here, before a launcher's ``main`` runs.
The output checks (`check_output_dir`, `check_output_file`) let a launcher refuse an unusable output path
before it computes or writes anything.

The one config system of the launchers: each takes an ml_collections config file (`define_config_file` when it
has a default one), reads list fields given as tuples or comma-separated text (`text_list`, `float_list`),
names config fields in the errors of library calls (`as_config_fields`) and keeps the resolved config beside
its outputs (`write_config`, `config_beside_outputs`).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
import tempfile
from typing import Callable, Sequence

from absl import app, flags

from jaxsprint import paths
from jaxsprint.errors import ConfigError, JaxsprintError

__all__ = ["as_config_fields", "check_output_dir", "check_output_file", "config_beside_outputs",
           "define_config_file", "fail", "float_list", "guarded", "load_config_file", "override_error",
           "parse_flags", "run", "text_list", "write_config"]


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    """The last value given to ``--name`` in `argv` (``--name=v`` or ``--name v``), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}=") or arg.startswith(f"-{name}="):
            value = arg.split("=", 1)[1]
        elif arg in (f"--{name}", f"-{name}") and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def _load_config_file(flag_name: str, path: str, parser):
    """The config of ``--flag_name=path`` (ml_collections' own parser), or ConfigError saying why not."""
    from ml_collections.config_flags import config_flags as cf

    allowed = "the path of an ml_collections config file with a get_config() function"
    try:
        config = parser.parse(path)
    except Exception as e:  # noqa: BLE001 (a syntax error or a bug in the file: the user's file)
        cause = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--{flag_name}", path, f"{allowed} (loading it failed: {cause[:200]})") from None
    if isinstance(config, cf._ErrorConfig):  # what ml_collections returns for a file it cannot open
        raise ConfigError(f"--{flag_name}", path, f"{allowed} (no such file, or not readable)")
    return config


def load_config_file(field: str, path: str):
    """The ConfigDict of an ml_collections config file named by a config field (e.g. a plan's training config).

    Raises:
      ConfigError: naming `field`: the file cannot be opened or loaded.
    """
    from ml_collections.config_flags import config_flags as cf

    try:
        return _load_config_file(field, path, cf.ConfigFileFlagParser(field))
    except ConfigError as e:
        raise ConfigError(field, path, e.allowed) from None


def _has_field(config, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        try:
            if part not in node:
                return False
            node = node[part]
        except TypeError:  # a leaf value reached before the path ends
            return False
    return True


def _check_config_flags(argv: Sequence[str]) -> None:
    """Loads every ml_collections config file named in `argv` and checks that each override names a field.

    ml_collections would report a missing file only when the config is first used (as an ``OSError``), and an
    override of a field that does not exist as an ``AttributeError`` from inside the flag parser.
    """
    from ml_collections.config_flags import config_flags as cf

    for name, flag in list(flags.FLAGS._flags().items()):  # noqa: SLF001 (absl has no public iterator of Flags)
        if name != flag.name or not cf.is_config_flag(flag):
            continue
        path = _flag_value(argv, name)
        if path is None:  # the flag's default file (loaded when the flag was defined), if it has one
            if flag.default is None:
                continue
            config, path = flag.default, str(flag.default_as_str).strip("'\"")
        else:
            config = _load_config_file(name, path, flag.parser)
        pattern = re.compile(rf"^--?(?:no)?{re.escape(name)}\.([^=]+)(?:=(.*))?$")
        for arg in argv:
            m = pattern.match(arg)
            if m and not _has_field(config, m.group(1)):
                raise ConfigError(f"{name}.{m.group(1)}", m.group(2),
                                  f"not a field of the config file {path} (an override must name one of its "
                                  "fields; new fields go into the file)")


def override_error(name: str, path: str, argv: Sequence[str], error: BaseException) -> ConfigError:
    """The ConfigError of an override that ml_collections could not apply to the config file `path` of the flag
    `name` (it raises a KeyError or AttributeError from inside the flag's parser): the first override in `argv`
    that names no field of the file, or else the file and the cause."""
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location(f"_{name}_file_for_the_error", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config()
    except Exception:  # noqa: BLE001 (the file itself is broken: say so below)
        config = None
    pattern = re.compile(rf"^--?(?:no)?{re.escape(name)}\.([^=]+)(?:=(.*))?$")
    for arg in argv:
        m = pattern.match(arg)
        if m and config is not None and not _has_field(config, m.group(1)):
            return ConfigError(f"{name}.{m.group(1)}", m.group(2),
                               f"not a field of the config file {path} (an override must name one of its fields; "
                               "new fields go into the file)")
    cause = " ".join(str(error).split())[:200] or type(error).__name__
    return ConfigError(f"--{name}", path, f"an ml_collections config file whose overrides apply ({cause})")


def define_config_file(name: str, default: str, help_text: str):
    """``config_flags.DEFINE_config_file(name, default, help_text, lock_config=True)`` for a launcher whose
    config file has a default, so that ``--name.<field>=...`` works without ``--name=``.

    ml_collections loads the default file and applies the command line's overrides as the flag is defined (at
    the launcher's import); an override naming no field of the file would end there in a traceback. Here it
    ends, as every bad input does, in exit status 2 and one line.
    """
    from ml_collections import config_flags

    try:
        return config_flags.DEFINE_config_file(name, default, help_text, lock_config=True)
    except (KeyError, AttributeError, TypeError, ValueError) as e:
        fail(override_error(name, default, sys.argv, e))


_ILLEGAL = re.compile(r"^flag --(?P<name>[^=]+)=(?P<value>.*?): (?P<why>.*)$", re.S)
_UNKNOWN = re.compile(r"^Unknown command line flag '(?P<name>[^']+)'(?P<rest>.*)$", re.S)


def _flag_error_message(error: flags.Error, argv: Sequence[str]) -> str:
    """absl's message in the ``invalid <field>=<value>: <allowed>`` form where it can be parsed."""
    text = str(error).strip()
    m = _ILLEGAL.match(text)
    if m:
        why = " ".join(m.group("why").split())
        return str(ConfigError(f"--{m.group('name')}", m.group("value"), why))
    m = _UNKNOWN.match(text)
    if m:
        hint = m.group("rest").strip(" .")
        return str(ConfigError(f"--{m.group('name')}", _flag_value(argv, m.group("name")),
                               "not a flag of this launcher (--helpfull lists them)" + (f"; {hint}" if hint else "")))
    return " ".join(text.split())


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parser for ``app.run(main, flags_parser=parse_flags)``.

    A malformed or unknown flag, a config file that cannot be loaded or an override of a field that the config
    file does not have prints one line ``error: invalid ...`` to stderr and exits with status 2, without a
    traceback (absl's default is status 1 with a usage text, ml_collections' a traceback).
    """
    try:
        _check_config_flags(argv)
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {_flag_error_message(e, argv)}", file=sys.stderr)
        sys.exit(2)
    except JaxsprintError as e:
        fail(e)


def fail(error: BaseException) -> None:
    """Prints ``error: <message>`` to stderr and exits with status 2."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def _first_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def check_output_dir(field: str, path: str) -> None:
    """Checks, leaving nothing behind, that `path` is a directory that exists or can be created (a local path
    or `file://` URI; a remote URI is left to orbax).

    Raises:
      ConfigError: named `field`: an empty path, a path that is a file, or one below a file or below a
        directory that this process may not write to.
    """
    allowed = "a directory that exists or can be created"
    if not path:
        raise ConfigError(field, path, allowed)
    if paths.is_uri(path) and not str(path).startswith("file://"):
        return  # a remote filesystem (gs://...): orbax and epath report what fails there
    local = os.fspath(paths.as_path(path))
    if os.path.exists(local) and not os.path.isdir(local):
        raise ConfigError(field, path, f"{allowed} (it is a file)")
    base = _first_existing(local)
    if not os.path.isdir(base):
        raise ConfigError(field, path, f"{allowed} ({base} is a file)")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(field, path, f"{allowed} ({base} is not writable)")
    times = os.stat(base)
    try:  # permission bits do not tell everything (/proc, a read-only mount): try, and leave nothing behind
        os.rmdir(tempfile.mkdtemp(prefix=".jaxsprint-write-check-", dir=base))
    except OSError as e:
        raise ConfigError(field, path, f"{allowed} (nothing can be created in {base}: {e.strerror})") from None
    with contextlib.suppress(OSError):  # not even the directory's mtime (a refused run writes nothing)
        os.utime(base, ns=(times.st_atime_ns, times.st_mtime_ns))


def check_output_file(field: str, path: str) -> None:
    """Checks, without creating anything, that a file can be written at `path` (its directory exists or can
    be created, and `path` is not a directory).

    Raises:
      ConfigError: named `field`, as :func:`check_output_dir` for the directory, or `path` is a directory.
    """
    if not path or (not paths.is_uri(path) and os.path.isdir(path)):
        raise ConfigError(field, path, "the path of a file to write (not a directory)")
    if paths.is_uri(path) and not str(path).startswith("file://"):
        return
    local = os.fspath(paths.as_path(path))
    try:
        check_output_dir(field, os.path.dirname(local))
    except ConfigError as e:
        why = e.allowed.partition(" (")[2].rstrip(")") or "its directory cannot be created"
        raise ConfigError(field, path, f"a file whose directory exists or can be created ({why})") from None
    if os.path.exists(local) and not os.access(local, os.W_OK):
        raise ConfigError(field, path, "a file that can be written (it is read-only)")


def text_list(field: str, value) -> list[str]:
    """The items of a config field that holds a list: a tuple or list of values, where any text item may itself
    be comma-separated (``--config.limits=2,8,inf`` arrives as the one-item tuple ``("2,8,inf",)``).

    Raises:
      ConfigError: named `field`, for a value that is neither text nor a tuple or list.
    """
    if value is None:
        return []
    items = [value] if isinstance(value, (str, int, float)) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(field, value, "a tuple of values (or comma-separated text)")
    out: list[str] = []
    for item in items:
        out += [part.strip() for part in item.split(",") if part.strip()] if isinstance(item, str) else [item]
    return out


def float_list(field: str, value) -> list[float]:
    """:func:`text_list` as numbers (``inf`` allowed). Raises ConfigError named `field` for any other item."""
    items = text_list(field, value)
    try:
        if any(isinstance(v, bool) for v in items):
            raise ValueError("booleans are not numbers")
        return [float(v) for v in items]
    except (TypeError, ValueError):
        raise ConfigError(field, value, "numbers (a tuple, or comma-separated text such as 2,8,inf)") from None


@contextlib.contextmanager
def as_config_fields(prefix: str = "config."):
    """Re-raises a `ConfigError` or `DataError` from a library call with `prefix` before its field, so that a
    launcher's message names the config field (``config.machine``) the value came from."""
    from jaxsprint.errors import DataError

    try:
        yield
    except (ConfigError, DataError) as e:
        if e.field.startswith(prefix) or e.field.startswith("--"):
            raise
        raise type(e)(prefix + e.field, e.value, e.allowed) from None


def write_config(directory: str, config, name: str = "config.json", **extra) -> str:
    """Writes the resolved `config` (an ml_collections ConfigDict), and any `extra` launcher settings under
    ``"launcher"``, as JSON to ``directory/name`` (a local path or a URI, through ``etils.epath``); returns
    the path. Every run keeps what produced it. The file is replaced whole (written beside, then renamed), so
    a process reading it meanwhile reads the old or the new config, never a part."""
    folder = paths.as_path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(config.to_json_best_effort())
    if extra:
        data = {**data, "launcher": extra}
    path, part = folder / name, folder / f".{name}.part"
    part.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    part.replace(path)
    return os.fspath(path)


def _listing(directory: str) -> set[str]:
    folder = paths.as_path(directory)
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


@contextlib.contextmanager
def config_beside_outputs(directory: str, config, name: str = "config.json", enabled: bool = True):
    """Writes the resolved `config` into `directory` when the body has written anything there (at the end of
    the body, also when it raises after writing): a run that is refused before it writes (bad data, a bad
    checkpoint, a resume with another config) leaves the directory as it was, and every run that wrote
    results has the config that produced them (a resumed run, whose directory already had one, rewrites it
    when it ends)."""
    before = _listing(directory) if enabled else set()
    completed = False
    try:
        yield
        completed = True
    finally:
        if enabled and (_listing(directory) - before - {name} or (completed and name in before)):
            write_config(directory, config, name=name)


def guarded(main: Callable[[list[str]], object]) -> Callable[[list[str]], object]:
    """Wraps an absl ``main`` so that a `JaxsprintError` becomes exit status 2 with its message alone."""

    @functools.wraps(main)
    def wrapper(argv):
        try:
            return main(argv)
        except JaxsprintError as e:
            fail(e)

    return wrapper


def run(main: Callable[[list[str]], object]) -> None:
    """``app.run`` with this module's flag parser and error handling: the one call at a launcher's bottom."""
    app.run(guarded(main), flags_parser=parse_flags)
