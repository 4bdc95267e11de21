"""Test setup: 8 fake CPU devices, set before JAX starts; XLA's backend optimisations off in the fast set; no test
may reach a real TFDS download; one XLA compilation cache shared by every process of a test run."""
import os
import shutil
import tempfile

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ["XLA_FLAGS"] = _flags
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A directory that never holds data: a TFDS read outside mock_data fails fast instead of downloading.
os.environ["TFDS_DATA_DIR"] = "/nonexistent-tfds-data-dir"

# Many tests compile the same programs (the testing config's train step in every train_and_evaluate call, the
# launchers' subprocesses, the resume tests' second and third runs): a persistent compilation cache, keyed by
# the program, its options and the JAX version, compiles each once per test run. The controller makes a fresh
# directory before the xdist workers start (they and every launcher subprocess inherit the environment) and
# removes it at the end, so every run starts cold, as CI does. A directory given in JAX_COMPILATION_CACHE_DIR
# is used as it is and kept. The size bound turns on the cache's file lock: the two workers read and write it
# at the same time.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="jaxsprint-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 * 2 ** 30))


def _stable_custom_partitioning_cache_keys() -> None:
    """Lets the persistent cache hit on programs holding the native kernels' custom_partitioning calls.

    JAX puts the address of a per-lowering Python object in each such call, so the cache key of every
    sharded train step with the kernels differs from one build to the next and the cache never hits (every
    train_and_evaluate compiled its step again). JAX's own switch drops the address from the key, but then
    two calls with equal operands and different static arguments (strides, paddings) or partition rules
    would share a key. Here the address is replaced, in the key only, by what the partitioner's result
    depends on beside the program: the rule functions' names, the static arguments, the operand trees and
    the mesh. In this process only (subprocesses keep JAX's default), and only where JAX's internals are as
    expected: otherwise the cache just misses, as before.
    """
    try:
        import jax
        from jax._src import cache_key, custom_partitioning
        from jax._src.lib.mlir import ir

        callbacks = custom_partitioning._sharding_callbacks
        ignore = cache_key.IgnoreCallbacks
        original = cache_key._remove_callbacks
    except (ImportError, AttributeError):
        return

    def describe(key: str) -> str | None:
        info = callbacks.get(key.encode())
        if info is None:
            return None
        fns = (info.partition, info.infer_sharding_from_operands, info.propagate_user_sharding)
        names = [f"{f.__module__}.{f.__qualname__}" if f is not None else "-" for f in fns]
        return "|".join([*names, repr(info.static_args), str(info.in_tree), str(info.out_tree), repr(info.mesh)])

    def remove_callbacks(m, ignore_callbacks):
        if ignore_callbacks != ignore.CUSTOM_PARTITIONING:
            return original(m, ignore_callbacks)

        def visit(op):
            if (op.name == "stablehlo.custom_call" and "call_target_name" in op.attributes
                    and ir.StringAttr(op.attributes["call_target_name"]).value == "CustomSPMDPartitioning"):
                described = describe(ir.StringAttr(op.attributes["backend_config"]).value)
                if described is not None:  # else the address stays: a key of its own
                    op.attributes["backend_config"] = ir.StringAttr.get(described)
            return ir.WalkResult.ADVANCE

        m.operation.walk(visit)
        return m

    cache_key._remove_callbacks = remove_callbacks
    jax.config.update("jax_remove_custom_partitioning_ptr_from_cache_key", True)


def pytest_configure(config):
    # The fast set's time is mostly XLA:CPU compiling small programs that then run a few steps: without the
    # backend's optimisation passes it compiles them about a quarter faster, and its tests check values and
    # invariants (both sides of each comparison compiled alike), never speed. The slow set (end-to-end runs of
    # the launchers, multi-process runs) keeps the level programs are compiled at in use, as does an explicit
    # XLA_FLAGS=--xla_backend_optimization_level=N. Set here, before any test module imports JAX; the xdist
    # workers and every launcher subprocess inherit it.
    flags = os.environ.get("XLA_FLAGS", "")
    if config.getoption("markexpr", "") == "not slow" and "xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = flags + " --xla_backend_optimization_level=0"
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        _stable_custom_partitioning_cache_keys()  # where tests run (an xdist controller runs none)
    config.addinivalue_line("markers", "devices(n): needs at least n JAX devices (the 8 fake CPU devices here; "
                                       "skipped on a machine with fewer accelerators)")
    config.addinivalue_line("markers", "slow: an end-to-end run of a benchmark or study script; left out of "
                                       "scripts/test.sh unless asked for (-m slow), run by CI as a second step")


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("devices")
    if marker is not None:
        import jax
        import pytest

        if jax.device_count() < marker.args[0]:
            pytest.skip(f"needs {marker.args[0]} devices, this backend has {jax.device_count()}")


def pytest_unconfigure(config):
    if _OWN_CACHE is not None and not hasattr(config, "workerinput"):  # the process that made it
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
