"""Test setup: 8 fake CPU devices, set before JAX starts; no test may reach a real TFDS download."""
import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A directory that never holds data: a TFDS read outside mock_data fails fast instead of downloading.
os.environ["TFDS_DATA_DIR"] = "/nonexistent-tfds-data-dir"


def pytest_configure(config):
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
