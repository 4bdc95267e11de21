"""jaxsprint.train.cpu: the one switch (config value, environment variable), what each mode hands a model, and that
"require" fails loudly where the kernels cannot be built."""
import os
import subprocess
import sys

import pytest

from jaxsprint.train import cpu, models
from jaxsprint.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_auto_defers_to_the_environment_and_explicit_values_win(monkeypatch):
    monkeypatch.delenv(cpu.ENV_VAR, raising=False)
    assert [cpu.resolve(m) for m in cpu.MODES] == ["auto", "off", "require"]
    monkeypatch.setenv(cpu.ENV_VAR, "off")
    assert cpu.resolve("auto") == "off" and cpu.resolve("require") == "require"
    monkeypatch.setenv(cpu.ENV_VAR, "require")
    assert cpu.resolve("auto") == "require" and cpu.resolve("off") == "off"
    monkeypatch.setenv(cpu.ENV_VAR, "")
    assert cpu.resolve("auto") == "auto"


def test_bad_values_name_the_field_or_the_variable(monkeypatch):
    monkeypatch.delenv(cpu.ENV_VAR, raising=False)
    with pytest.raises(ConfigError, match=r"invalid config.cpu_kernels='fast': allowed: auto, off, require"):
        cpu.resolve("fast")
    monkeypatch.setenv(cpu.ENV_VAR, "on")
    with pytest.raises(ConfigError, match=r"invalid JAXSPRINT_CPU_KERNELS='on': allowed: auto, off, require"):
        cpu.resolve("auto")


def test_off_hands_the_model_nothing(monkeypatch):
    monkeypatch.delenv(cpu.ENV_VAR, raising=False)
    accel = cpu.acceleration("off")
    assert not accel.active and not accel.kernels and accel.compiler_options is None
    assert accel.model_kwargs() == {}
    assert cpu.configure_host_memory("off") == "host allocator: system defaults (cpu_kernels=off)"
    plain = models.create_model("resnet8", num_classes=10, **accel.model_kwargs())
    assert plain.norm_cls is models.BatchNorm and plain.block_cls is models.BasicBlock


def test_auto_on_the_cpu_hands_the_model_the_fused_blocks(monkeypatch):
    from jaxsprint.train.cpu import fused, kernels

    monkeypatch.delenv(cpu.ENV_VAR, raising=False)
    monkeypatch.setattr(kernels, "suits_this_cpu", lambda: (True, ""))  # an AVX-512 CPU, whatever this one is
    accel = cpu.acceleration("auto")
    assert accel.active and accel.conv_general_dilated is not None
    m = models.create_model("resnet50", num_classes=10, **accel.model_kwargs())
    assert m.norm_cls is fused.BatchNorm and m.block_cls is fused.BottleneckBlock
    assert m.block_cls.__name__ == models.BottleneckBlock.__name__  # so parameter names stay the same


def test_auto_without_avx512_uses_xla_and_require_still_uses_the_kernels(monkeypatch):
    """Where the kernels' 16-float vectors do not fit one register, "auto" hands the model XLA's paths (the
    kernels are slower there); "require" still builds and uses them (so CI tests them on any x86 CPU)."""
    from jaxsprint.train.cpu import kernels

    monkeypatch.delenv(cpu.ENV_VAR, raising=False)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "flags\t\t: fpu sse2 avx avx2 fma")
    assert kernels.suits_this_cpu() == (False, "this CPU has no AVX-512, for whose 16-float vectors the native "
                                               "kernels are written")
    accel = cpu.acceleration("auto")
    assert not accel.active and not accel.kernels and accel.model_kwargs() == {}
    assert accel.describe() == "CPU kernels: off (this CPU has no AVX-512, for whose 16-float vectors the native " \
                               "kernels are written)"
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "flags\t\t: fpu sse2 avx2 avx512f avx512bw")
    assert kernels.suits_this_cpu() == (True, "")
    monkeypatch.setenv(cpu.ENV_VAR, "require")  # as CI: "auto" defers to it, on this CPU whatever its flags
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "flags\t\t: fpu sse2 avx avx2 fma")
    if kernels.available():
        required = cpu.acceleration("auto")
        assert required.mode == "require" and required.active and required.kernels


def _fresh_process(code: str, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ, JAX_PLATFORMS="cpu", **env)
    full.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def test_require_fails_loudly_where_the_kernels_cannot_be_built(tmp_path):
    """No compiler (CXX names a missing program) and an empty kernel cache: "require" raises a ConfigError
    naming the setting and the reason, "auto" falls back to XLA's kernels with the custom-VJP convolution."""
    code = (
        "from jaxsprint.train import cpu\n"
        "from jaxsprint.train.cpu import kernels\n"
        "kernels.suits_this_cpu = lambda: (True, '')\n"  # an AVX-512 CPU, whatever this one is
        "a = cpu.acceleration('auto'); assert a.active and not a.kernels, a\n"
        "print(a.describe())\n"
        "try:\n"
        "    cpu.acceleration('require')\n"
        "except cpu.ConfigError as e:\n"
        "    print('refused:', e)\n")
    r = _fresh_process(code.replace("cpu.ConfigError", "__import__('jaxsprint.errors').errors.ConfigError"),
                       CXX="/nonexistent/c++", JAXSPRINT_NATIVE_CACHE=str(tmp_path), JAXSPRINT_CPU_KERNELS="")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "custom-VJP convolution with XLA's kernels" in r.stdout
    assert "refused: invalid config.cpu_kernels='require': the native CPU kernels cannot be built here" in r.stdout
    assert "/nonexistent/c++" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_require_from_the_environment_stops_a_training_launch_with_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "experiments/train.py", "--config=experiments/configs/testing.py",
                        f"--workdir={tmp_path / 'w'}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", CXX="/nonexistent/c++",
                                JAXSPRINT_NATIVE_CACHE=str(tmp_path / "cache"), JAXSPRINT_CPU_KERNELS="require"))
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith("error: invalid config.cpu_kernels='require'") and "Traceback" not in r.stderr
    assert not (tmp_path / "w").exists()
