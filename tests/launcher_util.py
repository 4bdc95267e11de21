"""Importing a launcher (``experiments/<name>.py``) inside a test process.

Every launcher defines its absl flags (``--config``, ``--out``, ...) at import, as a launcher runs alone in its
process. Tests that call a launcher's functions in-process may land in one pytest-xdist worker, where the second
import would fail with absl's DuplicateFlagError (whichever order the workers took). ``launcher`` removes the
flags the other launchers defined before it imports one.
"""
import importlib
import os
import sys

from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launcher(name: str):
    """``experiments.<name>``, imported once; the flags other launchers defined are removed first."""
    full = f"experiments.{name}"
    if full in sys.modules:
        return sys.modules[full]
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if module.startswith("experiments.") or module == "jaxsprint.cli":
            for flag in defined:
                if flag.name in flags.FLAGS:
                    delattr(flags.FLAGS, flag.name)
    return importlib.import_module(full)
