"""experiments/studies.py: aggregation, tables, resumable JSON, one real cell (finished and diverged)."""
import json
import math

import pytest

from experiments import studies
from experiments.configs import testing
from jaxsprint.errors import ConfigError


def _config(**overrides):
    c = testing.get_config()
    c.eval_every_epochs = 0.0
    c.checkpoint_every_epochs = 0.0
    c.num_train_steps = 2
    c.log_every_steps = 1
    for key, value in overrides.items():
        node = c
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return c


def test_mean_std_uses_finite_values_and_counts_the_rest():
    m, s, bad = studies.mean_std([0.5, 0.7, float("nan"), None])
    assert m == pytest.approx(0.6) and s == pytest.approx(math.sqrt(0.02)) and bad == 2  # sample std, ddof 1
    assert studies.mean_std([0.25]) == (0.25, 0.0, 0)
    m, s, bad = studies.mean_std([float("inf"), float("nan")])
    assert math.isnan(m) and math.isnan(s) and bad == 2


def test_fmt_cell_scales_and_notes_divergence():
    assert studies.fmt_cell([0.5, 0.7]) == "60.00 ± 14.14"
    assert studies.fmt_cell([0.5, float("nan")]) == "50.00 ± 0.00 (1 diverged)"
    assert studies.fmt_cell([float("nan")] * 3) == "diverged (3/3)"


def test_markdown_table_has_header_rule_and_rows():
    lines = studies.markdown_table(["a", "b"], [[1, "x"], [2, "y"]]).splitlines()
    assert lines == ["| a | b |", "|---|---|", "| 1 | x |", "| 2 | y |"]


def test_json_round_trip_is_atomic_and_resumable(tmp_path):
    path = str(tmp_path / "sub" / "out.json")
    assert studies.load_json(path, dict) == {}
    studies.save_json(path, {"k": [1, 2.5]})
    assert studies.load_json(path, dict) == {"k": [1, 2.5]}
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["out.json"]  # no temporary left behind


def test_a_corrupt_results_file_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="out.json"):
        studies.load_json(str(path), dict)


def test_loss_curve_reads_train_loss_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    recs = [{"step": 1, "train_loss": 2.0}, {"step": 1, "eval_accuracy": 0.1}, {"step": 2, "train_loss": 1.5}]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert studies.loss_curve(str(path)) == [(1, 2.0), (2, 1.5)]
    assert studies.loss_curve(str(tmp_path / "missing.jsonl")) == []


def test_require_study_names_the_missing_piece():
    with pytest.raises(ConfigError, match="--config"):
        studies.require_study(None, ("seeds",))
    with pytest.raises(ConfigError, match="config.study"):
        studies.require_study(testing.get_config(), ("seeds",))


def test_validate_cells_stops_at_the_first_bad_cell():
    good = _config()
    assert studies.validate_cells([("a", good), ("b", good)]) == 2
    with pytest.raises(ConfigError, match="config.batch_size"):
        studies.validate_cells([("a", good), ("b", _config(batch_size=60))])


def test_run_cell_returns_a_json_summary_with_the_loss_curve():
    r = studies.run_cell(_config())
    json.dumps(r)  # the whole record is JSON-able
    assert r["diverged"] is False and 0.0 <= r["eval_accuracy"] <= 1.0
    assert [step for step, _ in r["loss_curve"]] == [1, 2]
    assert all(math.isfinite(loss) for _, loss in r["loss_curve"])


def test_run_cell_reports_divergence_instead_of_raising():
    r = studies.run_cell(_config(**{"lr.base": 1e30, "num_train_steps": 6}))
    assert r["diverged"] is True and 1 <= r["diverged_step"] <= 6 and math.isnan(r["eval_accuracy"])


def test_check_out_and_write_config(tmp_path):
    """The resolved config goes beside a study's results, as PREFIX.config.json; check_out covers that file."""
    c = _config(seed=3)
    path = studies.write_config(str(tmp_path / "out" / "study"), c)
    assert path == str(tmp_path / "out" / "study.config.json")
    written = json.loads((tmp_path / "out" / "study.config.json").read_text())
    assert written["seed"] == 3 and written["num_train_steps"] == 2 and written["lr"]["base"] == c.lr.base
    (tmp_path / "taken.config.json").mkdir()
    with pytest.raises(ConfigError, match="--out"):
        studies.check_out(str(tmp_path / "taken"))
