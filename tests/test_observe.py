"""What a run reports about itself: a jax.profiler trace of chosen updates, the hyper-parameters and the speed
in TensorBoard (read back from the event file), every output through epath (a local path and a file:// URI)."""
import json
import struct

import pytest

from experiments.configs import testing
from jaxsprint.errors import ConfigError
from jaxsprint.train import settings, trainer


def _events(folder):
    """Every Event of the TensorBoard files in `folder` (TFRecord framing: length, its CRC, data, its CRC)."""
    from tensorboardX.proto import event_pb2

    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            yield event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4


def _hparams(events):
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    found = {}
    for event in events:
        for value in event.summary.value:
            if value.tag.startswith("_hparams_/"):
                found[value.tag] = HParamsPluginData.FromString(value.metadata.plugin_data.content)
    return found


@pytest.mark.parametrize("uri", [False, True])
def test_a_run_traces_its_updates_and_reports_hparams_and_speed(tmp_path, uri):
    c = testing.get_config()
    c.profile_steps = (2, 4)
    local = tmp_path / "run"
    out = trainer.train_and_evaluate(c, f"file://{local}" if uri else str(local))
    assert out["steps"] == 6
    assert {p.name for p in local.iterdir()} >= {"checkpoints", "config.json", "metrics.jsonl", "profile",
                                                 "summary.json", "tensorboard"}
    traces = list((local / "profile" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert list(traces[0].parent.glob("*.trace.json.gz"))

    events = list(_events(local / "tensorboard"))
    hp = _hparams(events)
    start = hp["_hparams_/session_start_info"].session_start_info.hparams
    assert start["lr.base"].number_value == 0.5 and start["model"].string_value == "tiny"
    assert start["augment.area_range"].string_value == "0.35,1.0" and start["progress_bar"].bool_value is False
    assert "data_dir" not in start  # an unset placeholder
    names = {h.name for h in hp["_hparams_/experiment"].experiment.hparam_infos}
    assert {"seed", "batch_size", "optimizer.name", "profile_steps"} <= names
    speeds = {}
    for event in events:
        for value in event.summary.value:
            if value.tag in ("steps_per_s", "images_per_s"):
                speeds.setdefault(event.step, {})[value.tag] = value.simple_value
    assert sorted(speeds) == [4, 6]  # the log steps after the first window (which compiles)
    for s in speeds.values():
        assert s["steps_per_s"] > 0 and s["images_per_s"] == pytest.approx(64 * s["steps_per_s"], rel=1e-5)
    lines = [json.loads(x) for x in (local / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "images_per_s" in x] == [4, 6]


@pytest.mark.parametrize("value", [(), ("",), None])
def test_no_profile_steps_no_trace(value):
    c = testing.get_config()
    c.profile_steps = value
    assert settings.profile_range(c) is None


@pytest.mark.parametrize("value,expected", [((0, 1), (0, 1)), (("2,6",), (2, 6)), (("3", "5"), (3, 5))])
def test_profile_steps_are_a_half_open_range_of_updates(value, expected):
    c = testing.get_config()
    c.profile_steps = value
    assert settings.profile_range(c, 6) == expected
    settings.validate_config(c, 8)


@pytest.mark.parametrize("value", [(3, 3), (4, 2), (-1, 2), (1,), (1, 2, 3), ("a,b",), (1.5, 2), (True, 2),
                                   (0, 7)])
def test_bad_profile_steps_are_refused_before_anything_runs(value):
    c = testing.get_config()  # 6 updates
    c.profile_steps = value
    with pytest.raises(ConfigError, match=r"^invalid config\.profile_steps=.*two integers a,b with 0 <= a < b"):
        settings.validate_config(c, 8)


def test_profile_steps_beyond_a_run_counted_in_epochs_are_refused_by_the_experiment():
    c = testing.get_config()
    c.num_train_steps, c.num_epochs, c.profile_steps = -1, 1, (0, 24)  # 23 updates per epoch at batch 64
    settings.validate_config(c, 8)  # the length is known once the data is
    with pytest.raises(ConfigError, match=r"within the run's 23 updates"):
        trainer.build_experiment(c)
