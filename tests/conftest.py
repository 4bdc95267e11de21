"""Test setup: 8 fake CPU devices, set before JAX starts."""
import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TFDS_DATA_DIR", "/nonexistent-tfds-dir-for-tests")
