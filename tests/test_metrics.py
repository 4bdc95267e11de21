"""jaxsprint.train.metrics: JSON lines and TensorBoard files, histogram counts, the summary table."""
import json
import math

import numpy as np
import pytest

from jaxsprint.train import metrics


@pytest.mark.parametrize("uri", [False, True])
def test_writer_appends_json_lines_and_tensorboard_events(tmp_path, uri):
    w = metrics.MetricWriter(f"file://{tmp_path / 'run'}" if uri else str(tmp_path / "run"))
    w.write(2, {"train_loss": np.float32(1.5), "lr": 0.1})
    w.write_histograms(2, {"staleness_hist": np.array([3, 0, 1])})
    w.write_histograms(3, {})  # nothing to write: no line
    w.close()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 2, "train_loss": 1.5, "lr": 0.1}, {"step": 2, "staleness_hist": [3, 0, 1]}]
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "run" / "tensorboard").iterdir())


def test_hparams_keep_scalars_and_text_and_join_lists():
    flat = {"lr.base": 0.1, "seed": 0, "model": "tiny", "flip": False, "area": [0.35, 1.0], "pmf": [],
            "data_dir": None}
    assert metrics.hparams(flat) == {"lr.base": 0.1, "seed": 0, "model": "tiny", "flip": False,
                                     "area": "0.35,1.0", "pmf": ""}


def test_disabled_writer_writes_nothing(tmp_path):
    w = metrics.MetricWriter(str(tmp_path / "run"), enabled=False)
    w.write(1, {"x": 1.0})
    w.close()
    assert not (tmp_path / "run").exists()


def test_add_histogram_counts_values_below_the_size():
    h = metrics.add_histogram(None, [0, 2, 2, 5], 4)
    np.testing.assert_array_equal(h, [1, 0, 2, 0])
    np.testing.assert_array_equal(metrics.add_histogram(h, [1, 3], 4), [1, 1, 2, 1])


def _summary(**kw):
    s = {"dataset": "digits", "model": "tiny", "devices": 8, "global_batch": 64, "steps": 6, "epochs": 0.3,
         "peak_lr": 0.5, "final_train_loss": 1.25, "eval_accuracy": 0.5, "eval_loss": 1.5, "polish_mode": "none",
         "eval_polished_accuracy": math.nan, "eval_polished_loss": math.nan, "polish_time_s": math.nan,
         "step_time_s": 0.02, "images_per_s": 3200.0, "wall_time_s": 4.0}
    s.update(kw)
    return s


def test_summary_table_rows_follow_what_ran():
    plain = metrics.format_summary(_summary())
    assert "| eval top-1 accuracy |" in plain and "50.00%" in plain and "polished" not in plain
    lines = plain.splitlines()
    assert lines[0] == lines[-1] and len({len(x) for x in lines}) == 1  # a closed box of equal-width lines
    polished = metrics.format_summary(_summary(polish_mode="recompute", eval_polished_accuracy=0.75,
                                               eval_polished_loss=1.0, polish_time_s=2.0,
                                               staleness_hist=[1, 0, 3], minibatch_hist=[0, 2, 2]))
    assert "75.00%" in polished and "| mean realised staleness" in polished and "1.50" in polished
