"""Tests of the jaxsprint.perf package as a whole: it stays apart from the training stack."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_model_imports_nothing_of_training_or_timing():
    code = textwrap.dedent("""
        import sys
        import jaxsprint.perf
        from jaxsprint.perf import (calibrate, collectives, machines, networks, plan, presets, renewal, search,
                                    sensitivity, simulate, space, sprint, times, zoo)
        loaded = sorted(m for m in sys.modules if m.startswith("jaxsprint"))
        print(" ".join(loaded))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = set(r.stdout.split())
    assert {"jaxsprint.perf.search", "jaxsprint.perf.plan", "jaxsprint.perf.renewal"} <= loaded
    outside = {m for m in loaded if not m.startswith("jaxsprint.perf")} - {"jaxsprint", "jaxsprint.errors"}
    assert not outside, outside  # no train, models, data, timing, cpu, ...
