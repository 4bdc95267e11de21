"""jaxsprint.calibration.grids: the fixed grids and the seeded random draw of the held-out protocol."""
import json

import numpy as np
import pytest

from jaxsprint.calibration import grids
from jaxsprint.errors import ConfigError


def test_fixed_grids_are_disjoint_and_named_uniquely():
    val = {grids.key(e) for e in grids.VALIDATION_GRID}
    cal = {grids.key(e) for e in grids.CALIBRATION_GRID}
    assert not val & cal
    for grid in (grids.VALIDATION_GRID, grids.CALIBRATION_GRID, grids.QUICK_GRID):
        assert len({e.name for e in grid}) == len(grid)


def test_draw_is_seeded_distinct_in_range_and_balanced():
    a = grids.draw(12, random_seed=3)
    assert a == grids.draw(12, random_seed=3) and a != grids.draw(12, random_seed=4)
    keys = [grids.key(e) for e in a]
    assert len(set(keys)) == 12 and not set(keys) & {grids.key(e) for e in grids.CALIBRATION_GRID}
    for e in a:
        assert 1 <= e.hosts <= 2 and 1 <= e.learners_per_host <= 8 and 0 <= e.network_ms <= 100
        assert 8 <= e.sub_batch <= 128 and e.sub_batch % 8 == 0
        assert e.name.endswith(f"_h{e.hosts}_l{e.learners_per_host}_b{e.sub_batch}_n{e.network_ms}_{e.updater_device}")
    assert sorted(e.updater_device for e in a) == ["own"] * 6 + ["shared"] * 6


def test_draw_follows_its_distribution():
    """Sub-batch about log-uniform (each octave alike), network 0 with its share, hosts uniform."""
    e = grids.draw(300, random_seed=0, exclude=())  # 300 of the 25,856: nearly draws with replacement
    b = np.array([x.sub_batch for x in e])
    n = np.array([x.network_ms for x in e])
    octave = [np.mean((b >= lo) & (b < 2 * lo)) for lo in (16, 32, 64)]  # 8 alone and 128 alone are single points
    assert max(octave) / min(octave) < 1.6
    assert 0.17 < np.mean(n == 0) < 0.33  # zero_network_share 1/4
    assert 0.38 < np.mean([x.hosts == 2 for x in e]) < 0.6


def test_draw_excludes_and_refuses_what_it_cannot_draw():
    only = grids.draw(3, hosts=(1, 1), learners_per_host=(1, 1), sub_batch=(8, 16), network_ms=(0, 1),
                      exclude=[(1, 1, 8, 0)])
    assert {grids.key(e) for e in only} == {(1, 1, 8, 1), (1, 1, 16, 0), (1, 1, 16, 1)}
    with pytest.raises(ConfigError, match="num_random"):
        grids.draw(4, hosts=(1, 1), learners_per_host=(1, 1), sub_batch=(8, 16), network_ms=(0, 1),
                   exclude=[(1, 1, 8, 0)])
    for kwargs, field in [(dict(num_random=0), "num_random"), (dict(random_seed=-1), "random_seed"),
                          (dict(hosts=(2, 1)), "hosts"), (dict(sub_batch=(1, 7)), "sub_batch"),
                          (dict(placements=("gpu",)), "placements"), (dict(zero_network_share=1.0),
                                                                       "zero_network_share")]:
        args = {"num_random": 2, **kwargs}
        with pytest.raises(ConfigError, match=field):
            grids.draw(args.pop("num_random"), **args)


def test_preset_calibration_runs_reads_the_measurement_file(tmp_path):
    meas = tmp_path / "meas.json"
    meas.write_text(json.dumps({"measurements": {"runs": [
        dict(hosts=2, learners_per_host=3, sub_batch=24, network_time_s=0.02),
        dict(hosts=1, learners_per_host=1, sub_batch=8, network_time_s=0.0)]}}))
    preset = tmp_path / "preset.json"
    preset.write_text(json.dumps({"measurements": str(meas)}))
    assert grids.preset_calibration_runs(str(preset)) == (str(meas), ((1, 1, 8, 0), (2, 3, 24, 20)))
    assert grids.preset_calibration_runs(None) is None
    preset.write_text(json.dumps({"measurements": str(tmp_path / "missing.json")}))
    assert grids.preset_calibration_runs(str(preset)) is None
