"""Bad inputs through the real launchers: each ends in exit status 2, one line ``error: invalid <field>=...``
that names the field, no traceback, and nothing written (the whole directory the launcher runs in, workdirs
included, has the same files, sizes and mtimes before and after).

One subprocess per launcher runs all of that launcher's cases (``tests/bad_input_driver.py``: the flags are
reset and ``cli.run``'s two steps are repeated in-process, so JAX is imported once per launcher); a few
cases also run as their own process, to show that the driver reports what the command line does.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import bad_input_cases_runs
import bad_input_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "bad_input_driver.py")
CONFIGS = os.path.join(ROOT, "experiments", "configs")
TESTING = os.path.join(CONFIGS, "testing.py")
DEFAULT = os.path.join(CONFIGS, "default.py")
POLISH_STUDY = os.path.join(CONFIGS, "polish_study.py")
ASYNC_STUDY = os.path.join(CONFIGS, "async_study.py")
NOISE_STUDY = os.path.join(CONFIGS, "noise_study.py")
TIMEOUT_S = 240

# ---------------------------------------------------------------------------------------------------------
# The cases: launcher -> [(argv, text the error line must contain: the field)].
# Paths are relative to the scratch directory the launchers run in (see `scratch`).

_T = [f"--config={TESTING}", "--workdir=w"]
_NEW = [f"--config={TESTING}", "--workdir=fresh"]  # a workdir that does not exist and must not appear
_ASYNC = ["--config.async_emulation.enabled=True"]


def _train_cases():
    c = "--config."
    cases = [
        # The loop.
        ([c + "seed=-1"], "config.seed"), ([c + f"seed={2**31}"], "config.seed"), ([c + "seed=1.5"], "config.seed"),
        ([c + "num_train_steps=0"], "config.num_train_steps"), ([c + "num_train_steps=-5"], "config.num_train_steps"),
        ([c + "num_train_steps=-1", c + "num_epochs=nan"], "config.num_epochs"),
        ([c + "num_train_steps=-1", c + "num_epochs=0"], "config.num_epochs"),
        ([c + "num_train_steps=-1", c + "num_epochs=inf"], "config.num_epochs"),
        ([c + "eval_every_epochs=nan"], "config.eval_every_epochs"),
        ([c + "eval_every_epochs=inf"], "config.eval_every_epochs"),
        ([c + "checkpoint_every_epochs=nan"], "config.checkpoint_every_epochs"),
        ([c + "checkpoint_every_epochs=-inf"], "config.checkpoint_every_epochs"),
        ([c + "log_every_steps=-1"], "config.log_every_steps"),
        ([c + "keep_checkpoints=0"], "config.keep_checkpoints"),
        ([c + "progress_bar=3"], "config.progress_bar"),
        # The recipe.
        ([c + "lr.reference_batch=0"], "config.lr.reference_batch"),
        ([c + "lr.reference_batch=-256"], "config.lr.reference_batch"),
        ([c + "lr.reference_batch=nan"], "config.lr.reference_batch"),
        ([c + "lr.base=-0.1"], "config.lr.base"), ([c + "lr.base=nan"], "config.lr.base"),
        ([c + "lr.base=inf"], "config.lr.base"),
        ([c + "lr.scaling=sqrt"], "config.lr.scaling"),
        ([c + "lr.warmup_epochs=nan"], "config.lr.warmup_epochs"),
        ([c + "lr.warmup_epochs=-1"], "config.lr.warmup_epochs"),
        ([c + "lr.warmup_epochs=inf"], "config.lr.warmup_epochs"),
        ([c + "lr.warmup_init=1.5"], "config.lr.warmup_init"),
        ([c + "lr.warmup_init=-0.1"], "config.lr.warmup_init"),
        ([c + "lr.schedule=step"], "config.lr.schedule"),
        ([c + "lr.poly_power=0"], "config.lr.poly_power"),
        ([c + "lr.end_lr=-1"], "config.lr.end_lr"),
        ([c + "optimizer.name=adamw"], "config.optimizer.name"),
        ([c + "optimizer.momentum=1.0"], "config.optimizer.momentum"),
        ([c + "optimizer.momentum=nan"], "config.optimizer.momentum"),
        ([c + "optimizer.weight_decay=-1e-4"], "config.optimizer.weight_decay"),
        ([c + "optimizer.lars_eps=-1"], "config.optimizer.lars_eps"),
        ([c + "optimizer.lamb_eps=nan"], "config.optimizer.lamb_eps"),
        ([c + "optimizer.lamb_b1=1"], "config.optimizer.lamb_b1"),
        ([c + "optimizer.lamb_b2=-0.5"], "config.optimizer.lamb_b2"),
        ([c + "optimizer.lars_trust_coefficient=0"], "config.optimizer.lars_trust_coefficient"),
        ([c + "optimizer.lars_nesterov=maybe"], "config.optimizer.lars_nesterov"),
        ([c + "label_smoothing=1.0"], "config.label_smoothing"),
        ([c + "label_smoothing=-0.1"], "config.label_smoothing"),
        # Data.
        ([c + "dataset="], "config.dataset"),
        ([c + "dataset=cifar10"], "config.data_dir"),
        ([c + "train_split="], "config.train_split"),
        ([c + "test_split="], "config.test_split"),
        ([c + "image_size=3"], "config.image_size"), ([c + "image_size=4096"], "config.image_size"),
        ([c + "image_size=129"], "config.image_size"), ([c + "image_size=-8"], "config.image_size"),
        ([c + "augment.kind=mixup"], "config.augment.kind"),
        ([c + "augment.area_range=(0.9, 0.1)"], "config.augment.area_range"),
        ([c + "augment.area_range=(0.0, 1.0)"], "config.augment.area_range"),
        ([c + "augment.area_range=(0.5,)"], "config.augment.area_range"),
        ([c + "augment.area_range=(0.1, 1.5)"], "config.augment.area_range"),
        ([c + "augment.area_range=(nan, 1.0)"], "config.augment.area_range"),
        ([c + "augment.area_range=(0.1, 0.5, 1.0)"], "config.augment.area_range"),
        ([c + "augment.area_range=0.5"], "config.augment.area_range"),
        ([c + "augment.aspect_range=(2.0, 1.0)"], "config.augment.aspect_range"),
        ([c + "augment.aspect_range=(0.0, 1.0)"], "config.augment.aspect_range"),
        ([c + "augment.pad=-1"], "config.augment.pad"),
        ([c + "augment.eval_crop_fraction=0.0"], "config.augment.eval_crop_fraction"),
        ([c + "augment.eval_crop_fraction=1.5"], "config.augment.eval_crop_fraction"),
        # Model.
        ([c + "model=resnet7"], "config.model"), ([c + "dtype=float16"], "config.dtype"),
        ([c + "bn.momentum=1.0"], "config.bn.momentum"), ([c + "bn.momentum=nan"], "config.bn.momentum"),
        ([c + "bn.momentum=-0.1"], "config.bn.momentum"),
        ([c + "bn.epsilon=0"], "config.bn.epsilon"), ([c + "bn.epsilon=nan"], "config.bn.epsilon"),
        ([c + "bn.reduction=ghost"], "config.bn.reduction"),
        ([c + "bn.group_size=-1"], "config.bn.group_size"),
        ([c + "bn.reduction=group", c + "bn.group_size=3"], "config.bn.group_size"),
        ([c + "cpu_kernels=turbo"], "config.cpu_kernels"),
        ([c + "zero_init_last_bn=2"], "config.zero_init_last_bn"),
        # Parallel layout and sizes.
        ([c + "num_devices=3"], "config.batch_size"), ([c + "num_devices=0"], "config.num_devices"),
        ([c + "batch_size=60"], "config.batch_size"), ([c + "batch_size=0"], "config.batch_size"),
        ([c + "batch_size=-64"], "config.batch_size"),
        ([c + "batch_size=4096"], "config.batch_size"),
        ([c + "eval_batch_size=60"], "config.eval_batch_size"),
        ([c + "eval_batch_size=0"], "config.eval_batch_size"),
        ([c + f"eval_batch_size={2**30}"], "config.eval_batch_size"),
        ([c + "grad_accum_steps=0"], "config.grad_accum_steps"),
        ([c + "grad_accum_steps=3"], "config.batch_size"),
        ([c + "model=resnet50", c + "image_size=128", c + "batch_size=65536",
          c + "dataset=cifar10", c + "data_dir=nowhere"], "config.batch_size"),
        # Final Polishing.
        ([c + "polish.mode=always"], "config.polish.mode"),
        ([c + "polish.num_passes=-1"], "config.polish.num_passes"),
        ([c + "polish.num_samples=0"], "config.polish.num_samples"),
        ([c + "polish.num_samples=-2"], "config.polish.num_samples"),
        ([c + "polish.batch_size=-8"], "config.polish.batch_size"),
        ([c + "polish.batch_size=12"], "config.polish.batch_size"),
        ([c + "polish.mode=recompute", c + f"polish.batch_size={2**30}"], "config.polish.batch_size"),
        ([c + "polish.no_augment_epochs=nan"], "config.polish.no_augment_epochs"),
        ([c + "polish.no_augment_epochs=-1"], "config.polish.no_augment_epochs"),
        ([c + "model=tiny_nobn", c + "polish.mode=recompute"], "config.polish.mode"),
        ([c + "model=tiny_nobn", c + "polish.mode=both"], "config.polish.mode"),
        # Asynchronous emulation.
        (_ASYNC + [c + "async_emulation.max_staleness=-1"], "config.async_emulation.max_staleness"),
        (_ASYNC + [c + "async_emulation.max_staleness=100000000"], "config.async_emulation.max_staleness"),
        (_ASYNC + [c + "async_emulation.sampler=poisson"], "config.async_emulation.sampler"),
        (_ASYNC + [c + "async_emulation.max_staleness=2", c + "async_emulation.staleness=5"],
         "config.async_emulation.staleness"),
        (_ASYNC + [c + "async_emulation.max_staleness=1", c + "async_emulation.sampler=geometric",
                   c + "async_emulation.mean_staleness=4.0"], "config.async_emulation.mean_staleness"),
        (_ASYNC + [c + "async_emulation.max_staleness=8", c + "async_emulation.sampler=geometric",
                   c + "async_emulation.mean_staleness=nan"], "config.async_emulation.mean_staleness"),
        (_ASYNC + [c + "async_emulation.max_staleness=2", c + "async_emulation.sampler=pmf",
                   c + "async_emulation.pmf=(0.5, 0.6)"], "config.async_emulation.pmf"),
        (_ASYNC + [c + "async_emulation.max_staleness=1", c + "async_emulation.sampler=pmf",
                   c + "async_emulation.pmf=(0.2, 0.3, 0.5)"], "config.async_emulation.pmf"),
        (_ASYNC + [c + "async_emulation.mitigation=magic"], "config.async_emulation.mitigation"),
        (_ASYNC + [c + "async_emulation.dc_lambda=-1"], "config.async_emulation.dc_lambda"),
        (_ASYNC + [c + "async_emulation.num_sub_batches=5"], "config.async_emulation.num_sub_batches"),
        (_ASYNC + [c + "async_emulation.num_sub_batches=4", c + "async_emulation.k_pmf=(0.5, 0.5)"],
         "config.async_emulation.k_pmf"),
        (_ASYNC + [c + "async_emulation.sampler=perf_model", c + "async_emulation.workers=0"],
         "config.async_emulation.workers"),
        (_ASYNC + [c + "async_emulation.sampler=perf_model", c + "async_emulation.t_update_s=nan"],
         "config.async_emulation.t_update_s"),
        (_ASYNC + [c + "async_emulation.sampler=perf_model", c + "async_emulation.t_compute_cv=-1"],
         "config.async_emulation.t_compute_cv"),
        ([c + "async_emulation.enabled=2"], "config.async_emulation.enabled"),
    ]
    out = [(_T + argv, field) for argv, field in cases]
    out += [(_NEW + [c + "lr.reference_batch=0"], "config.lr.reference_batch"),
            (_NEW + [c + "checkpoint_every_epochs=nan"], "config.checkpoint_every_epochs"),
            (_NEW + [c + "polish.no_augment_epochs=nan", c + "polish.mode=no_augment_epochs"],
             "config.polish.no_augment_epochs")]
    # Files and flags.
    out += [
        (["--config=no_such_config.py", "--workdir=w"], "--config"),
        (["--config=no_such_config.py", "--workdir=w", "--config.seed=1"], "--config"),
        (["--config=broken_config.py", "--workdir=w"], "--config"),
        (["--config=no_get_config.py", "--workdir=w"], "--config"),
        (_T + [c + "no_such_field=1"], "config.no_such_field"),
        (_T + [c + "lr.no_such=1"], "config.lr.no_such"),
        (_T + [c + "lr.base=fast"], "config.lr.base"),
        ([f"--config={TESTING}", "--workdir=afile"], "--workdir"),
        ([f"--config={TESTING}", "--workdir=afile/sub"], "--workdir"),
        ([f"--config={TESTING}"], "--workdir"),
        (["--workdir=w"], "--config"),
        (_T + ["extra"], "arguments"),
        (_T + ["--no_such_flag=1"], "no_such_flag"),
        (_T + ["--num_processes=0"], "num_processes"),
    ]
    return out


def _polish_cases():
    p = [f"--config={TESTING}", "--workdir=run"]
    return [
        ([f"--config={TESTING}", "--workdir=w"], "--workdir"),            # no checkpoints/
        ([f"--config={TESTING}", "--workdir=no_such_run"], "--workdir"),
        ([f"--config={TESTING}", "--workdir=afile"], "--workdir"),
        ([f"--config={TESTING}"], "--config/--workdir"),
        (["--config=no_such_config.py", "--workdir=run"], "--config"),
        (p + ["--config.polish.num_passes=-1"], "config.polish.num_passes"),
        (p + ["--config.polish.num_samples=0"], "config.polish.num_samples"),
        (p + ["--config.polish.batch_size=12"], "config.polish.batch_size"),
        (p + [f"--config.polish.batch_size={2**30}"], "config.polish.batch_size"),
        (p + ["--config.model=tiny_nobn"], "config.model"),
        (p + ["--config.lr.reference_batch=0"], "config.lr.reference_batch"),
        (p + ["--config.bn.epsilon=-1"], "config.bn.epsilon"),
        (p + ["--config.no_such=1"], "config.no_such"),
        (p + ["extra"], "arguments"),
    ]


def _predict_cases():
    t = ["--workers=8", "--t_compute=0.1", "--t_update=0.05"]
    s = ["--machine=tsubame_kfc_dl", "--network=resnet50"]
    return [
        (["--machine_file=bad_figure.json", "--network=resnet50"], "machine_file"),
        (["--machine_file=missing_figure.json", "--network=resnet50"], "machine_file"),
        (["--machine_file=no_such.json", "--network=resnet50"], "machine_file"),
        (["--machine_file=not_json.json", "--network=resnet50"], "machine_file"),
        (["--machine_file=wrong_format.json", "--network=resnet50"], "machine_file"),
        (["--machine_file=w", "--network=resnet50"], "machine_file"),
        (["--machine_file=list.json", "--network=resnet50"], "machine_file"),
        (["--machine_file=nan_figure.json", "--network=resnet50"], "machine_file"),
        (t + ["--plot=p.png", "--sim_cycles=-1"], "sim_cycles"),
        (t + ["--plot=p.png", "--sim_cycles=0"], "sim_cycles"),
        (t + ["--plot=p.png", f"--sim_cycles={10**12}"], "sim_cycles"),
        (t + ["--plot=p.png", "--seed=-1"], "seed"),
        (t + ["--plot=afile/p.png"], "plot"),
        (t + ["--plot=w"], "plot"),
        (["--workers=0", "--t_compute=0.1", "--t_update=0.05"], "workers"),
        (["--workers=-3", "--t_compute=0.1", "--t_update=0.05"], "workers"),
        (["--workers=8", "--t_compute=0", "--t_update=0.05"], "t_compute"),
        (["--workers=8", "--t_compute=nan", "--t_update=0.05"], "t_compute"),
        (["--workers=8", "--t_compute=inf", "--t_update=0.05"], "t_compute"),
        (["--workers=8", "--t_compute=0.1", "--t_update=-1"], "t_update"),
        (["--workers=8", "--t_compute=0.1", "--t_update=nan"], "t_update"),
        (t + ["--t_compute_cv=-0.5"], "t_compute_cv"),
        (t + ["--t_compute_cv=nan"], "t_compute_cv"),
        (t + ["--t_compute_cv=5"], "t_compute_cv"),
        (t + ["--sub_batch=0"], "sub_batch"),
        (t + ["--dataset_size=0"], "dataset_size"),
        (t + ["--workers=abc"], "workers"),
        (["--workers=8", "--t_compute=0.1"], "t_update"),
        (t + ["--machine=tsubame_kfc_dl"], "--machine"),
        (["--machine=no_such_machine", "--network=resnet50"], "machine"),
        (["--machine=tsubame_kfc_dl", "--network=no_such_net"], "network"),
        (["--machine=tsubame_kfc_dl"], "--network"),
        (["--network=resnet50"], "machine"),
        (s + ["--machine_file=bad_figure.json"], "machine_file"),
        (s + ["--nodes=0"], "nodes"),
        (s + ["--gpus_per_node=0"], "gpus_per_node"),
        (s + ["--gpus_per_node=99"], "gpus_per_node"),
        (s + ["--allreduce=star"], "--allreduce"),
        (s + ["--sub_batch=100000000"], "sub_batch"),
        (s + ["extra"], "arguments"),
    ]


def _search_cases():
    s = ["--machine=tsubame_kfc_dl", "--network=resnet50", "--target_minibatch=8192"]
    return [
        (["--network=resnet50", "--target_minibatch=8192"], "machine"),
        (["--machine=no_such", "--network=resnet50", "--target_minibatch=8192"], "machine"),
        (["--machine_file=bad_figure.json", "--network=resnet50", "--target_minibatch=8192"], "machine_file"),
        (["--machine_file=no_such.json", "--network=resnet50", "--target_minibatch=8192"], "machine_file"),
        (["--machine=tsubame_kfc_dl", "--target_minibatch=8192"], "--network"),
        (["--machine=tsubame_kfc_dl", "--network=nope", "--target_minibatch=8192"], "network"),
        (["--machine=tsubame_kfc_dl", "--network=resnet50"], "--target_minibatch"),
        (s[:2] + ["--target_minibatch=0.5"], "target_minibatch"),
        (s[:2] + ["--target_minibatch=nan"], "target_minibatch"),
        (s[:2] + ["--target_minibatch=inf"], "target_minibatch"),
        (s + ["--tolerance=0"], "tolerance"), (s + ["--tolerance=1.5"], "tolerance"),
        (s + ["--tolerance=nan"], "tolerance"),
        (s + ["--max_staleness=0.5"], "max_staleness"), (s + ["--max_staleness=nan"], "max_staleness"),
        (s + ["--max_nodes=0"], "max_nodes"), (s + ["--max_nodes=-4"], "max_nodes"),
        (s + ["--max_gpus_per_node=0"], "max_gpus_per_node"),
        (s + ["--max_gpus_per_node=99"], "max_gpus_per_node"),
        (s + ["--max_sub_batch=0"], "max_sub_batch"),
        (s + ["--min_sub_batch=0"], "min_sub_batch"),
        (s + ["--min_sub_batch=64", "--max_sub_batch=32"], "max_sub_batch"),
        (s + ["--dataset_size=0"], "dataset_size"),
        (s + ["--allreduce=star"], "algorithm"),
        (s + ["--starts=0"], "--starts"), (s + ["--starts=-1"], "--starts"),
        (s + [f"--starts={10**9}"], "--starts"),
        (s + ["--precision", "--low_peak_factor=0"], "low_peak_factor"),
        (s + ["--precision", "--max_low_fraction=1.5"], "max_low_fraction"),
        (s + ["--precision", "--max_low_fraction=nan"], "max_low_fraction"),
        (s + ["--grid", "--max_nodes=100000000"], "grid size"),
        (s + ["--plot=afile/p.png"], "plot"),
        (s + ["--plot=w"], "plot"),
        (s + ["extra"], "arguments"),
    ]


def _calibrate_cases():
    c = "--config."
    bad = ["meas_missing_key", "meas_unknown_model", "meas_batch_text", "meas_batch_zero", "meas_one_rank",
           "meas_time_negative", "meas_time_nan", "meas_bytes_zero", "meas_steps_not_list",
           "meas_record_not_dict", "meas_records_missing_shape", "meas_no_steps", "meas_ranks_text"]
    out = [([f"{c}measurements=bad/{name}.json", "--out=out/x.json"], "config.measurements") for name in bad]
    g = [c + "measurements=good_meas.json", "--out=out/x.json"]
    out += [
        ([c + "measurements=no_such.json", "--out=out/x.json"], "config.measurements"),
        ([c + "measurements=not_json.json", "--out=out/x.json"], "config.measurements"),
        ([c + "measurements=wrong_format.json", "--out=out/x.json"], "config.measurements"),
        ([c + "measurements=good_meas.json", "--out=afile/x.json"], "--out"),
        ([c + "measurements=good_meas.json", "--out=w"], "--out"),
        (g + [c + "models=resnet7"], "config.models"),
        (g + [c + "fit_fields=nope"], "config.fit_fields"),
        (g + [c + "rounds=0"], "config.rounds"),
        (g + [c + "starts=0"], "config.starts"),
        (g + [c + "starts=two"], "config.starts"),
        (g + [c + "allreduce_timeout_s=0"], "config.allreduce_timeout_s"),
        (g + [c + "holdout_fraction=1"], "config.holdout_fraction"),
        (g + [c + "holdout_fraction=nan"], "config.holdout_fraction"),
        (g + [c + "batches=0"], "config.batches"),
        (g + [c + "batches=x"], "config.batches"),
        (g + [c + "ranks=1"], "config.ranks"),
        (g + [c + "allreduce_bytes=2"], "config.allreduce_bytes"),
        (g + [c + "bounds=efficiency_fwd=2:1"], "config.bounds"),
        (g + [c + "bounds=nope=1:2"], "config.bounds"),
        (g + [c + "loss=cubic"], "config.loss"),
        (g + [c + "loss_scale=0"], "config.loss_scale"),
        (g + [c + "loss_scale=nan"], "config.loss_scale"),
        (g + [c + "min_time_s=-1"], "config.min_time_s"),
        (g + [c + "base=nope"], "config.base"),
        (g + [c + "holdout_batches=4,8,16,32,64"], "config.holdout_batches"),
        (g + [c + "cpu_kernels=fast"], "config.cpu_kernels"),
        (g + [c + "no_such=1"], "config.no_such"),
        (g + ["--rounds=2"], "--rounds"),  # a setting of the config, not a flag
        (g + ["extra"], "arguments"),
    ]
    return out


def _validate_model_cases():
    c = "--config."
    q = [c + "num_configs=2", c + "num_deterministic=0", c + "num_lognormal=0", c + "speed_configs=0",
         "--out_json=", "--plot="]
    return [
        (q + [c + "num_configs=-1"], "config.num_configs"),
        (q + [c + "num_deterministic=-1"], "config.num_deterministic"),
        (q + [c + "num_lognormal=-5"], "config.num_lognormal"),
        (q + [c + "num_configs=0"], "config.num_configs"),
        (q + [c + "speed_configs=-1"], "config.speed_configs"),
        (q + [c + f"speed_configs={10**12}"], "config.speed_configs"),
        (q + [c + f"num_configs={10**9}"], "config.num_configs"),
        (q + [c + "event_budget=nan"], "config.event_budget"),
        (q + [c + "event_budget=inf"], "config.event_budget"),
        (q + [c + "event_budget=0"], "config.event_budget"),
        (q + [c + "event_budget=-1"], "config.event_budget"),
        (q + [c + "min_cycles=0"], "config.min_cycles"),
        (q + [c + "min_gradients=0"], "config.min_gradients"),
        (q + [c + "seed=-1"], "config.seed"),
        (q + [c + "num_configs=two"], "config.num_configs"),
        (q + [c + "no_such=1"], "config.no_such"),
        (q + ["--config=no_such_config.py"], "--config"),
        (q + ["--out_json=afile/x.json"], "--out_json"),
        (q + ["--out_json=w"], "--out_json"),
        (q + ["--rows_json=afile/rows.json"], "--rows_json"),
        (q + ["--plot=afile/p.png"], "--plot"),
        (q + ["--num_configs=2"], "--num_configs"),  # a setting of the config, not a flag
        (q + ["extra"], "arguments"),
    ]


def _study_polish_cases():
    s = [f"--config={POLISH_STUDY}", "--out=study/p"]
    return [
        (["--out=study/p"], "--config"),
        (["--config=no_such_config.py", "--out=study/p"], "--config"),
        ([f"--config={TESTING}", "--out=study/p"], "config.study"),
        (s + ["--config.study.batch_sizes=(0, 64)"], "config.study.batch_sizes"),
        (s + ["--config.study.batch_sizes=()"], "config.study.batch_sizes"),
        (s + ["--config.study.batch_sizes=(60,)"], "config.batch_size"),
        (s + ["--config.study.seeds=(-1,)"], "config.seed"),
        (s + ["--config.study.seeds=(0.5,)"], "config.study.seeds"),
        (s + ["--config.lr.reference_batch=0"], "config.lr.reference_batch"),
        (s + ["--config.model=tiny_nobn"], "config.polish.mode"),
        (s + ["--config.polish.no_augment_epochs=nan"], "config.polish.no_augment_epochs"),
        (s + ["--config.study.no_such=1"], "config.study.no_such"),
        (s + ["--out=afile/p"], "--out"),
        (s + ["--out=bad_results"], "--out"),
        (s + ["extra"], "arguments"),
    ]


def _study_async_cases():
    s = [f"--config={ASYNC_STUDY}", "--out=study/a"]
    return [
        (["--out=study/a"], "--config"),
        (["--config=no_such_config.py", "--out=study/a"], "--config"),
        ([f"--config={TESTING}", "--out=study/a"], "config.study"),
        (s + ["--config.study.kinds=('poisson',)"], "config.study.kinds"),
        (s + ["--config.study.kinds=('constant', 'uniform')"], "config.study.kinds"),
        (s + ["--config.study.mitigations=('magic',)"], "config.study.mitigations"),
        (s + ["--config.study.mean_staleness=(-1,)"], "config.study.mean_staleness"),
        (s + ["--config.study.mean_staleness=(1.5,)"], "config.study.mean_staleness"),
        (s + ["--config.study.mean_staleness=(nan,)"], "config.study.mean_staleness"),
        (s + ["--config.study.kinds=('geometric',)", "--config.study.mean_staleness=(inf,)"],
         "config.study.mean_staleness"),
        (s + ["--config.study.kinds=('geometric',)", "--config.study.mean_staleness=(100,)"],
         "config.async_emulation.mean_staleness"),
        (s + ["--config.study.seeds=(-1,)"], "config.seed"),
        (s + ["--config.study.seeds=()"], "config.study.seeds"),
        (s + ["--config.lr.base=nan"], "config.lr.base"),
        (s + ["--config.async_emulation.dc_lambda=-1"], "config.async_emulation.dc_lambda"),
        (s + ["--out=afile/a"], "--out"),
        (s + ["extra"], "arguments"),
    ]


def _study_noise_cases():
    s, c = [f"--config={NOISE_STUDY}", "--out=study/n"], "--config.study."
    return [
        (["--out=study/n"], "--config"),
        ([f"--config={TESTING}", "--out=study/n"], "config.study"),
        (s + [c + "batch_sizes=(0, 64)"], "config.study.batch_sizes"),
        (s + [c + "batch_sizes=(24, 128)"], "config.study.batch_sizes"),
        (s + [c + "batch_sizes=()"], "config.study.batch_sizes"),
        (s + [c + "reference_batch=256", c + "batch_sizes=(16, 128)"], "config.study.reference_batch"),
        (s + [c + "reference_batch=16"], "config.study.reference_batch"),
        (s + [c + "seeds=(0.5,)"], "config.study.seeds"),
        (s + [c + "seeds=(-1,)"], "config.seed"),
        (s + [c + "warmup_steps=-1"], "config.study.warmup_steps"),
        (s + [c + "eval_every_examples=0"], "config.study.eval_every_examples"),
        (s + [c + "examples_per_device=0"], "config.study.examples_per_device"),
        (s + ["--config.stop_at_accuracy=0"], "config.stop_at_accuracy"),
        (s + ["--config.lr.base=nan"], "config.lr.base"),
        (s + ["--config.bn.group_size=3"], "config.bn.group_size"),
        (s + ["--out=afile/n"], "--out"),
        (s + ["extra"], "arguments"),
    ]


CASES = {
    "train.py": _train_cases() + bad_input_cases_runs.train_cases(),  # + the resume and profiling fields
    "polish.py": _polish_cases(),
    "predict.py": _predict_cases(),
    "search.py": _search_cases(),
    "calibrate.py": _calibrate_cases(),
    "validate_model.py": _validate_model_cases(),
    "study_polish.py": _study_polish_cases(),
    "study_async.py": _study_async_cases(),
    "study_noise.py": _study_noise_cases(),
    **bad_input_cases_runs.CASES,  # run_sprint, plan, validate_runtime, calibrate_runtime, study_emulator
}

# ---------------------------------------------------------------------------------------------------------
# The scratch directory: the inputs the cases name.


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The directory every launcher runs in, with the inputs the cases name (tests/bad_input_files.py)."""
    d = tmp_path_factory.mktemp("bad_inputs")
    bad_input_files.write_scratch(d)
    return d


def _env() -> dict[str, str]:
    return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
                TFDS_DATA_DIR="/nonexistent-tfds-data-dir")


def _start_driver(scratch, tag: str, launcher: str, cases) -> tuple[subprocess.Popen, object]:
    payload = [{"id": str(i), "argv": argv} for i, (argv, _) in enumerate(cases)]
    cases_path = scratch.parent / f"{tag}.cases.json"
    out_path = scratch.parent / f"{tag}.out.json"
    cases_path.write_text(json.dumps(payload))
    proc = subprocess.Popen([sys.executable, DRIVER, os.path.join(ROOT, "experiments", launcher), str(cases_path),
                             str(out_path)], cwd=scratch, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, out_path


def _finish_driver(proc: subprocess.Popen, out_path) -> dict[str, dict]:
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:  # stopped, naming the case it was in
        proc.kill()
        started = [x for x in proc.communicate()[1].splitlines() if x.startswith("case ")] or ["its start"]
        pytest.fail(f"the driver outlived {TIMEOUT_S} s, in {started[-1]}")
    assert proc.returncode == 0, err[-3000:]
    return {x["id"]: x for x in json.loads(out_path.read_text())}


@pytest.fixture(scope="module")
def driven(scratch) -> dict[str, dict[str, dict]]:
    """Every launcher's cases, one driver process per launcher, all started at once: launcher -> id -> result.

    Each launcher runs in its own copy of the scratch directory (an output check's probe directory would show
    in a launcher beside it); a case that wrongly writes shows in its own result (and in later ones)."""
    procs = {}
    try:
        for launcher, cases in CASES.items():
            own = shutil.copytree(scratch, scratch.parent / f"scratch-{launcher}", symlinks=True)
            procs[launcher] = _start_driver(own, launcher, launcher, cases)
        return {launcher: _finish_driver(*procs[launcher]) for launcher in CASES}
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _problems(result: dict, field: str) -> list[str]:
    out = []
    err = result["stderr"]
    if result["code"] != 2:
        out.append(f"exit {result['code']}")
    if "Traceback" in err:
        out.append("traceback")
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    if len(lines) != 1:
        out.append(f"{len(lines)} error lines")
    elif not lines[0].startswith("error: invalid ") or field not in lines[0]:
        out.append(f"not 'error: invalid <field {field!r}>=<value>: <allowed>'")
    if result["changed"]:
        out.append(f"wrote {result['changed'][:5]}")
    return out


@pytest.mark.parametrize("launcher", sorted(CASES))
def test_every_bad_input_is_one_clear_error_and_writes_nothing(driven, launcher):
    cases, results = CASES[launcher], driven[launcher]
    failures = []
    for i, (argv, field) in enumerate(cases):
        bad = _problems(results[str(i)], field)
        if bad:
            failures.append(f"{launcher} {' '.join(argv)}: {', '.join(bad)}\n    "
                            + results[str(i)]["stderr"].strip()[-300:].replace("\n", "\n    "))
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures)


def test_cases_are_distinct_and_many():
    total = 0
    for launcher, cases in CASES.items():
        keys = [tuple(argv) for argv, _ in cases]
        assert len(set(keys)) == len(keys), launcher
        total += len(keys)
    assert total >= 150


# One process per case: the exit status and the error line are the driver's.
# validate_model.py 15: an override naming no field of the default config file, refused as the flag is defined.
# run_sprint.py 2: 100,000 learner threads; plan.py 71: initial_runs above budget_runs.
_REAL = [("train.py", 0), ("predict.py", 0), ("calibrate.py", 4), ("validate_model.py", 15), ("run_sprint.py", 2),
         ("plan.py", 71)]


@pytest.mark.parametrize("launcher,index", _REAL)
def test_the_driver_reports_what_the_command_line_does(scratch, driven, launcher, index):
    from bad_input_driver import changed, snapshot

    argv, field = CASES[launcher][index]
    before = snapshot(str(scratch))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", launcher), *argv], cwd=scratch,
                       env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    real = {"code": r.returncode, "stderr": r.stderr, "changed": changed(before, snapshot(str(scratch)))}
    assert _problems(real, field) == [], r.stderr[-2000:]
    line = lambda s: [x for x in s.splitlines() if x.startswith("error:")]  # noqa: E731
    got = driven[launcher][str(index)]
    assert (got["code"], line(got["stderr"])) == (real["code"], line(real["stderr"]))
