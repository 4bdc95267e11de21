"""The package's layering: every import, at module level or inside a function, points down the layers.

    plumbing (errors, cli, subprocs, paths, cluster) < perf < emulation < train < runtime < calibration < plan

The SPRINT model (``perf``) and the law (``plan.law``) load nothing of training when imported.
"""
import ast
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "jaxsprint")
LAYERS = ("plumbing", "perf", "emulation", "train", "runtime", "calibration", "plan")
PLUMBING = {"errors", "cli", "subprocs", "paths", "cluster", "__init__"}


def _layer(module: str) -> str:
    """The layer of a dotted module name under jaxsprint."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in PLUMBING:
        return "plumbing"
    return parts[1]


def _imports(path: str, module: str):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("jaxsprint"):
                    yield a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("jaxsprint"):
                for a in node.names:
                    yield f"{node.module}.{a.name}" if node.module == "jaxsprint" else node.module


def _modules():
    for dirpath, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield path, rel.removesuffix(".__init__")


def test_every_layer_is_known_and_every_import_points_down():
    upward = []
    for path, module in _modules():
        src = _layer(module)
        assert src in LAYERS, f"{module}: a layer outside {LAYERS}"
        for target in _imports(path, module):
            dst = _layer(target)
            assert dst in LAYERS, f"{module} imports {target}: a layer outside {LAYERS}"
            if LAYERS.index(dst) > LAYERS.index(src):
                upward.append(f"{module} -> {target}")
    assert not upward, upward


def test_at_most_six_modules_at_the_top_and_none_over_600_lines():
    top = [f for f in os.listdir(PACKAGE) if f.endswith(".py")]
    assert len(top) <= 6, top
    long = [m for path, m in _modules() if sum(1 for _ in open(path)) > 600]
    assert not long, long


def test_the_model_and_the_law_import_nothing_of_training():
    code = textwrap.dedent("""
        import sys
        import jaxsprint.perf
        from jaxsprint.perf import (collectives, machines, networks, presets, renewal, search, sensitivity,
                                    simulate, space, sprint, times, zoo)
        from jaxsprint.plan import law
        print(" ".join(sorted(m for m in sys.modules if m.startswith("jaxsprint"))))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = set(r.stdout.split())
    assert {"jaxsprint.perf.search", "jaxsprint.plan.law", "jaxsprint.perf.renewal"} <= loaded
    outside = {m for m in loaded if not m.startswith("jaxsprint.perf")} - {
        "jaxsprint", "jaxsprint.errors", "jaxsprint.plan", "jaxsprint.plan.law"}
    assert not outside, outside


def _targets(path: str, module: str, known: set[str]):
    """The jaxsprint modules `module` imports (a name imported from a package is its submodule if one exists)."""
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    yield a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in known:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                yield sub if sub in known else node.module


def test_no_module_imports_itself_through_others():
    # Also within a layer, and also through an import inside a function: no cycle is broken by a lazy import.
    mods = dict((m, p) for p, m in _modules())
    graph = {m: set(_targets(p, m, set(mods))) - {m} for m, p in mods.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m, stack):
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle.extend(stack[stack.index(t):] + [t])
                return True
            if t not in state and visit(t, stack + [t]):
                return True
        state[m] = 2
        return False

    for m in sorted(graph):
        if m not in state and visit(m, [m]):
            break
    assert not cycle, " -> ".join(cycle)
