"""Test setup: 8 fake CPU devices, set before JAX starts; no test may reach a real TFDS download."""
import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A directory that never holds data: a TFDS read outside mock_data fails fast instead of downloading.
os.environ["TFDS_DATA_DIR"] = "/nonexistent-tfds-data-dir"
