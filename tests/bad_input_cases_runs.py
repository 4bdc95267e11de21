"""Bad inputs of the launchers that run SPRINT or plan with it (run_sprint, plan, validate_runtime,
calibrate_runtime, study_emulator), for ``tests/test_bad_inputs.py``: launcher -> [(argv, the field the error
line must name)]; the scratch files they name are written by ``tests/bad_input_files.py``.

Paths are relative to the scratch directory the launchers run in. Every base argument list names outputs
inside it (a workdir, a cache directory, an output prefix), so that a case that wrongly writes is seen.
"""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "experiments", "configs")
SPRINT = os.path.join(CONFIGS, "sprint.py")
TESTING = os.path.join(CONFIGS, "testing.py")
EMULATOR_STUDY = os.path.join(CONFIGS, "emulator_study.py")
# A directory that exists and in which nothing can be created, where the platform has one.
UNWRITABLE = "/proc/jaxsprint-bad-input" if os.path.isdir("/proc") else None
HUGE = 100_000  # learner threads per host: more than any OS lets one process start
C = "--config."
S = C + "sprint."


def _unwritable(argv_of, field):
    return [(argv_of(UNWRITABLE), field)] if UNWRITABLE else []


def _sprint_fields(base):
    """Cases of the SPRINT config's own fields (``config.sprint`` and what a run reads of the rest)."""
    s, f = S, "config.sprint."
    cases = [
        ([s + "learners_per_host=0"], f + "learners_per_host"),
        ([s + "learners_per_host=-2"], f + "learners_per_host"),
        ([s + f"learners_per_host={HUGE}"], f + "learners_per_host"),
        ([s + "learners_per_host=2000"], f + "learners_per_host"),
        ([s + "learners_per_host=1.5"], f + "learners_per_host"),
        ([s + "devices=0"], f + "devices"), ([s + "devices=9"], f + "devices"),
        ([s + "devices=-1"], f + "devices"),
        ([s + "updater_device=both"], f + "updater_device"),
        ([s + "updater_device=own"], f + "devices"),
        ([s + "updater_device=own", s + "devices=8"], f + "devices"),
        ([s + "sub_batch=0"], f + "sub_batch"), ([s + "sub_batch=-4"], f + "sub_batch"),
        ([s + f"sub_batch={10**9}"], f + "sub_batch"),
        ([s + "network_time_s=-1"], f + "network_time_s"), ([s + "network_time_s=nan"], f + "network_time_s"),
        ([s + "network_time_s=inf"], f + "network_time_s"),
        ([s + "network_time_s=30"], f + "network_time_s"),  # longer than the whole run (duration_s=10)
        ([s + "lockstep=2"], f + "lockstep"),
        ([s + "duration_s=-1"], f + "duration_s"), ([s + "duration_s=nan"], f + "duration_s"),
        ([s + "duration_s=inf"], f + "duration_s"), ([s + "duration_s=1e12"], f + "duration_s"),
        ([s + "duration_s=0"], f + "duration_s"),  # no stop at all
        ([s + "num_updates=-1"], f + "num_updates"), ([s + "num_updates=1.5"], f + "num_updates"),
        ([s + "num_epochs=-1"], f + "num_epochs"), ([s + "num_epochs=nan"], f + "num_epochs"),
        ([s + "num_epochs=inf"], f + "num_epochs"),
        ([s + "warmup_s=-1"], f + "warmup_s"), ([s + "warmup_s=nan"], f + "warmup_s"),
        ([s + "warmup_s=20"], f + "warmup_s"),  # the whole run (duration_s=10) would be warm-up
        ([s + "eval_every_updates=-1"], f + "eval_every_updates"),
        ([s + "eval_deferred=True"], f + "num_updates"), ([s + "eval_deferred=2"], f + "eval_deferred"),
        ([s + "schedule_updates=0"], f + "schedule_updates"),
        ([s + "seed=-1"], f + "seed"), ([s + f"seed={2**31}"], f + "seed"), ([s + "seed=1.5"], f + "seed"),
        ([s + "checkpoint=3"], f + "checkpoint"),
        ([s + "join_timeout_s=0"], f + "join_timeout_s"), ([s + "join_timeout_s=nan"], f + "join_timeout_s"),
        ([s + "join_timeout_s=inf"], f + "join_timeout_s"), ([s + "join_timeout_s=1e12"], f + "join_timeout_s"),
        ([s + "init_timeout_s=0"], f + "init_timeout_s"), ([s + f"init_timeout_s={10**9}"], f + "init_timeout_s"),
        # What the run reads of the rest of the config.
        ([C + "model=resnet7"], "config.model"), ([C + "dataset="], "config.dataset"),
        ([C + "image_size=3"], "config.image_size"), ([C + "optimizer.name=adamw"], "config.optimizer.name"),
        ([C + "optimizer.momentum=nan"], "config.optimizer.momentum"), ([C + "lr.base=nan"], "config.lr.base"),
        ([C + "lr.reference_batch=0"], "config.lr.reference_batch"), ([C + "bn.epsilon=0"], "config.bn.epsilon"),
        ([C + "cpu_kernels=turbo"], "config.cpu_kernels"), ([C + "label_smoothing=1.0"], "config.label_smoothing"),
        ([C + "eval_batch_size=0"], "config.eval_batch_size"),
        ([C + "polish.mode=both"], "config.polish.mode"),
        ([C + "polish.mode=recompute", C + "polish.num_samples=0"], "config.polish.num_samples"),
        # Host memory: every learner holds the activations of its sub-batch for the backward pass.
        ([C + "model=resnet50", C + "image_size=128", s + "learners_per_host=512", s + "sub_batch=1024"],
         f + "sub_batch"),
        ([C + "model=resnet50", C + "image_size=128", C + "eval_batch_size=1000000"], "config.eval_batch_size"),
        ([C + "no_such=1"], "config.no_such"), ([s + "no_such=1"], f + "no_such"),
    ]
    return [(base + argv, field) for argv, field in cases]


def run_sprint_cases():
    r = [f"--config={SPRINT}", "--workdir=w"]
    cases = _sprint_fields(r)
    cases += [(["--config=" + SPRINT, "--workdir=fresh", S + "sub_batch=0"], "config.sprint.sub_batch"),
              (["--config=" + SPRINT, "--workdir=fresh", f"{S}learners_per_host={HUGE}"],
               "config.sprint.learners_per_host")]
    cases += [
        # The workdir.
        ([f"--config={SPRINT}"], "--workdir"), ([f"--config={SPRINT}", "--workdir="], "--workdir"),
        ([f"--config={SPRINT}", "--workdir=afile"], "--workdir"),
        ([f"--config={SPRINT}", "--workdir=afile/sub"], "--workdir"),
        *_unwritable(lambda p: [f"--config={SPRINT}", f"--workdir={p}"], "--workdir"),
        # The config file.
        (["--workdir=w"], "--config"), (["--config=no_such_config.py", "--workdir=w"], "--config"),
        (["--config=broken_config.py", "--workdir=w"], "--config"),
        (["--config=no_get_config.py", "--workdir=w"], "--config"),
        ([f"--config={TESTING}", "--workdir=w"], "config.sprint"),
        # The prediction from specs, the plot, a saved log.
        (r + ["--machine=nope"], "machine"), (r + ["--machine_file=no_such.json"], "--machine_file"),
        (r + ["--machine_file=bad_figure.json"], "machine_file"),
        (r + ["--machine_file=w"], "--machine_file"),
        (r + ["--plot=p.txt"], "--plot"), (r + ["--plot=nowhere/p.png"], "--plot"),
        (r + ["--plot=afile/p.png"], "--plot"), (r + ["--plot=w"], "--plot"),
        (["--events=no_such.npz", "--specs=False"], "--events"),
        (["--events=afile", "--specs=False"], "--events"), (["--events=w", "--specs=False"], "--events"),
        (["--events=not_events.npz", "--specs=False"], "--events"),
        (["--events=good_events.npz", "--specs=True"], "--specs"),
        ([f"--config={SPRINT}", "--events=good_events.npz", "--machine=nope"], "machine"),
        (["--events=good_events.npz", "--specs=False", "--plot=p.txt"], "--plot"),
        # Several processes.
        (r + ["--num_processes=0"], "--num_processes"), (r + ["--num_processes=-2"], "--num_processes"),
        (r + ["--process_id=-1"], "--process_id"),
        (r + ["--num_processes=2"], "coordinator_address"),
        (r + ["--num_processes=2", "--process_id=2", "--coordinator_address=127.0.0.1:1234"], "--process_id"),
        (r + ["--num_processes=2", "--process_id=0", "--coordinator_address=nohost"], "--coordinator_address"),
        (r + ["--num_processes=2", "--process_id=0", "--coordinator_address=127.0.0.1:0"], "--coordinator_address"),
        (r + ["--num_processes=2", "--process_id=0", "--coordinator_address=127.0.0.1:99999"],
         "--coordinator_address"),
        (r + ["--num_processes=abc"], "--num_processes"),
        (r + ["extra"], "arguments"), (r + ["--no_such_flag=1"], "no_such_flag"),
        # A series of runs in the same processes: every item checked before anything runs.
        (r + ["--series=32:0"], "--series"), (r + ["--series=0:0:5"], "--series"),
        (r + ["--series=32:-1:5"], "--series"), (r + ["--series=32:0:0"], "--series"),
        (r + ["--series=32:0:nan"], "--series"), (r + ["--series=x:0:5"], "--series"),
        (r + ["--series=32:0:5,16:0.02"], "--series"), (r + ["--series="], "--series"),
        (r + ["--series=32:0:5", "--plot=p.png"], "--series"),
        (["--events=good_events.npz", "--specs=False", "--series=32:0:5"], "--series"),
        (r + ["--series=32:0:5,99999:0:5"], "config.sprint.sub_batch"),
    ]
    return cases


def plan_cases():
    p = [C + "machine=tsubame_kfc_dl", C + "network=resnet50", C + "cache_dir=cache"]
    t = p + [C + "target_accuracy=0.9"]
    cases = [(p, "config.target_accuracy")]
    cases += [(p + [C + f"target_accuracy={v}"], "config.target_accuracy") for v in ("0", "1.5", "nan", "-0.1")]
    bad = [
        # The cluster.
        ("machine=nope", "config.machine"), ("machine_file=no_such.json", "config.machine_file"),
        ("machine_file=bad_figure.json", "config.machine_file"), ("network=nope", "config.network"),
        ("max_nodes=0", "config.max_nodes"), ("max_nodes=-1", "config.max_nodes"),
        ("max_gpus_per_node=0", "config.max_gpus_per_node"), ("max_gpus_per_node=99", "config.max_gpus_per_node"),
        ("max_sub_batch=0", "config.max_sub_batch"), ("max_sub_batch=-8", "config.max_sub_batch"),
        ("dataset_size=0", "config.dataset_size"), ("dataset_size=-5", "config.dataset_size"),
        ("minibatch_scale=0", "config.minibatch_scale"), ("minibatch_scale=nan", "config.minibatch_scale"),
        ("minibatch_scale=inf", "config.minibatch_scale"), ("minibatch_scale=-1", "config.minibatch_scale"),
        # The proxy.
        ("data=nope", "config.data"), ("model=resnet7", "config.model"),
        ("width=0", "config.width"), ("width=-1", "config.width"), (f"width={10**9}", "config.width"),
        # Candidates.
        *[(f"minibatch_range={v}", "config.minibatch_range")
          for v in ("(8.0,)", "(256.0, 8.0)", "(nan, 8.0)", "(0.0, 8.0)", "(8.0, inf)", "a,b")],
        ("ladder=0", "config.ladder"), ("ladder=-1", "config.ladder"), (f"ladder={10**6}", "config.ladder"),
        ("staleness_limits=(1.0,)", "config.staleness_limits"), ("staleness_limits=()", "config.staleness_limits"),
        ("staleness_limits=(nan,)", "config.staleness_limits"), ("staleness_limits=x", "config.staleness_limits"),
        (f"staleness_limits=({','.join(['2.0'] * 1000)})", "config.staleness_limits"),
        ("max_staleness=1", "config.max_staleness"), ("max_staleness=nan", "config.max_staleness"),
        ("max_staleness=inf", "config.max_staleness"), ("max_staleness=-1", "config.max_staleness"),
        ("tolerance=0", "config.tolerance"), ("tolerance=1", "config.tolerance"), ("tolerance=nan", "config.tolerance"),
        ("search_starts=0", "config.search_starts"), (f"search_starts={10**9}", "config.search_starts"),
        # Training of the proxy.
        ("lr_rule=sqrt", "config.lr_rule"), ("base_lr=0", "config.base_lr"), ("base_lr=nan", "config.base_lr"),
        ("base_lr=-1", "config.base_lr"), ("reference_batch=0", "config.reference_batch"),
        ("momentum=1.0", "config.momentum"), ("momentum=-0.1", "config.momentum"), ("momentum=nan", "config.momentum"),
        ("t_compute_cv=-1", "config.t_compute_cv"), ("t_compute_cv=3", "config.t_compute_cv"),
        ("t_compute_cv=nan", "config.t_compute_cv"),
        ("seeds=0", "config.seeds"), (f"seeds={10**6}", "config.seeds"), ("seeds=two", "config.seeds"),
        ("max_updates=0", "config.max_updates"), (f"max_updates={10**12}", "config.max_updates"),
        ("eval_every=0", "config.eval_every"), ("eval_every=5000", "config.eval_every"),
        # The budget.
        ("budget_runs=0", "config.budget_runs"), ("budget_runs=-1", "config.budget_runs"),
        (f"budget_runs={10**6}", "config.budget_runs"),
        ("initial_runs=0", "config.initial_runs"), ("initial_runs=20", "config.initial_runs"),
        ("runs_per_round=0", "config.runs_per_round"), (f"runs_per_round={10**6}", "config.runs_per_round"),
        ("cache_dir=afile", "config.cache_dir"), ("cache_dir=afile/sub", "config.cache_dir"),
        ("holdout=-1", "config.holdout"), (f"holdout={10**6}", "config.holdout"),
        ("no_such=1", "config.no_such"),
        # The network itself, and a measured noise scale.
        ("b_noise=-1", "config.b_noise"), ("b_noise=nan", "config.b_noise"), ("b_noise=inf", "config.b_noise"),
        ("b_noise_se=-1", "config.b_noise_se"), ("b_noise_se=nan", "config.b_noise_se"),
    ]
    cases += [(t + [C + arg], field) for arg, field in bad]
    if UNWRITABLE:
        cases.append((t + [C + f"cache_dir={UNWRITABLE}"], "config.cache_dir"))
    cases += [(t + [C + "model=resnet8", C + arg], field) for arg, field in (
        ("image_size=2", "config.image_size"), ("image_size=1000", "config.image_size"),
        ("seeds=0", "config.seeds"), ("eval_every=5000", "config.eval_every"))]
    noise = os.path.join(CONFIGS, "noise_scale.py")
    cases += [(t + [C + a for a in args], field) for args, field in (
        (["train_config=no_such_config.py"], "config.train_config"),
        ([f"train_config={noise}", "model=resnet20"], "config.model"),
        ([f"train_config={noise}", "data=mnist5k"], "config.data"),
        ([f"train_config={noise}", "image_size=28"], "config.image_size"))]
    rt = t + ["--workdir=fresh"]
    cases += [
        (t + [C + "runtime_configs=2:16:0,4:16:0.01"], "--workdir"),
        (rt + [C + "runtime_configs=2:16"], "config.runtime_configs"),
        (rt + [C + "runtime_configs=2:16:0"], "config.runtime_configs"),
        (rt + [C + "runtime_configs=0:16:0,2:16:0"], "config.runtime_configs"),
        (rt + [C + "runtime_configs=2:16:nan,4:16:0"], "config.runtime_configs"),
        (rt + [C + f"runtime_configs={HUGE}:16:0,2:16:0"], "config.runtime_configs"),
        (rt + [C + "runtime_configs=2:16:0,4:16:0", C + "runtime_updates=0"], "config.runtime_updates"),
        (rt + [C + "runtime_configs=2:16:0,4:16:0", C + "runtime_reuse=2"], "config.runtime_reuse"),
        (rt + [C + "runtime_configs=2:16:0,4:16:0", C + "runtime_seeds=0"], "config.runtime_seeds"),
        (rt + [C + "runtime_configs=2:16:0,4:16:0", C + "runtime_seeds=1.5"], "config.runtime_seeds"),
        (rt + [C + "runtime_configs=2:16:0,4:16:0", C + "max_updates=0"], "config.max_updates"),
        (rt + [C + "runtime_configs=2:16:0,4:16:0", C + "cache_dir=afile"], "config.cache_dir"),
        (t + [C + "runtime_configs=2:16:0,4:16:0", "--workdir=afile"], "--workdir"),
        (t + ["--workdir=afile"], "--workdir"), (t + ["--workdir=afile/sub"], "--workdir"),
        (t + ["--plot=p.txt"], "--plot"), (t + ["--plot=afile/p.png"], "--plot"), (t + ["--plot=w"], "--plot"),
        (t + ["--config=no_such_config.py"], "--config"),
        (t + ["--budget_runs=4"], "--budget_runs"),  # a setting of the config, not a flag
        (t + ["extra"], "arguments"),
    ]
    return cases


def validate_runtime_cases():
    o = ["--out=vr", "--dry_run"]
    v = C + "validation."
    f = "config.validation."
    bad = [
        ("grid=all", "grid"), ("specs=both", "specs"), ("updater_device=both", "updater_device"),
        ("only=nope", "only"), ("only=(1,)", "only"),
        ("min_gradients=0", "min_gradients"), ("min_gradients=-5", "min_gradients"),
        ("min_gradients=abc", "min_gradients"), ("min_updates=0", "min_updates"),
        ("warmup_s=-1", "warmup_s"), ("warmup_s=nan", "warmup_s"), ("warmup_s=inf", "warmup_s"),
        ("warmup_s=500", "warmup_s"),  # longer than every run (max_duration_s=180)
        ("max_duration_s=0", "max_duration_s"), ("max_duration_s=nan", "max_duration_s"),
        ("max_duration_s=inf", "max_duration_s"), ("max_duration_s=1e12", "max_duration_s"),
        ("run_timeout_s=0", "run_timeout_s"), ("run_timeout_s=nan", "run_timeout_s"),
        ("run_timeout_s=60", "run_timeout_s"),  # every run stopped before its planned length
        ("machine=nope", "machine"), ("machine_file=no_such.json", "machine_file"),
        ("machine_file=bad_figure.json", "machine_file"), ("no_such=1", "no_such"),
        ("num_random=0", "num_random"), ("num_random=1.5", "num_random"), ("random_seed=-1", "random_seed"),
    ]
    cases = [(o + [v + arg], f + field) for arg, field in bad]
    rnd = o + [v + "grid=random"]  # the held-out draw: loo would refit the preset to the drawn runs
    cases += [(rnd + [v + "specs=loo"], f + "specs"), (rnd + [v + "num_random=100000"], f + "num_random"),
              (rnd + [S + "updater_device=own"], "config.sprint.updater_device")]
    # The SPRINT config of every run (its overrides reach every run): refused here, not in each run.
    cases += [(o + argv, field) for argv, field in [
        ([S + "sub_batch=8"], "config.sprint.sub_batch"),  # set by the grid, not an override
        ([S + "duration_s=5"], "config.sprint.duration_s"), ([C + "model=resnet7"], "config.model"),
        ([C + "eval_batch_size=0"], "config.eval_batch_size"),
        ([S + "join_timeout_s=0"], "config.sprint.join_timeout_s"), ([S + "seed=-1"], "config.sprint.seed"),
        ([C + "optimizer.name=adamw"], "config.optimizer.name"), ([C + "lr.base=nan"], "config.lr.base"),
        ([S + "polish_mode=1"], "config.sprint.polish_mode"),
        ([C + "model=resnet50", C + "image_size=128", C + "eval_batch_size=1000000"], "config.eval_batch_size"),
    ]]
    cases += [
        ([], "--out"), (["--out=", "--dry_run"], "--out"), (["--out=afile", "--dry_run"], "--out"),
        (["--out=afile/sub"], "--out"), (["--out=afile/sub", "--quick"], "--out"),
        *_unwritable(lambda p: [f"--out={p}"], "--out"),
        (["--out=w", "--reanalyse"], "--out"), (["--out=fresh", "--reanalyse"], "--out"),
        (["--out=fresh", S + "join_timeout_s=0"], "config.sprint.join_timeout_s"),
        (["--out=fresh", "--quick", v + "min_updates=0"], f + "min_updates"),
        (o + ["--config=no_such_config.py"], "--config"), (o + ["--min_gradients=0"], "--min_gradients"),
        (o + ["--quick=maybe"], "--quick"), (o + ["extra"], "arguments"),
    ]
    return cases


def calibrate_runtime_cases():
    k = C + "calibration."
    f = "config.calibration."
    o = ["--out=cal/preset.json", k + "measurements=cal/meas.json"]
    fit = ["--out=cal/preset.json", k + "fit_only=True"]
    bad = [
        ("sub_batches=(0,)", "sub_batches"), ("sub_batches=()", "sub_batches"), ("sub_batches=x", "sub_batches"),
        ("sub_batches=(1.5,)", "sub_batches"), (f"sub_batches=({10**9},)", "sub_batches"),
        ("learners=(0,)", "learners"), (f"learners=({HUGE},)", "learners"), ("learners=(1.5,)", "learners"),
        ("learners=()", "learners"),
        ("network_times=(-1.0,)", "network_times"), ("network_times=(nan,)", "network_times"),
        ("network_times=(inf,)", "network_times"), ("network_times=(20.0,)", "network_times"),
        ("network_times=x", "network_times"),
        ("run_sub_batch=0", "run_sub_batch"), ("run_sub_batch=-1", "run_sub_batch"),
        (f"run_sub_batch={10**9}", "run_sub_batch"),
        ("duration_s=0", "duration_s"), ("duration_s=nan", "duration_s"), ("duration_s=inf", "duration_s"),
        ("duration_s=1e12", "duration_s"), ("duration_s=1", "duration_s"),  # not longer than warmup_s=2
        ("warmup_s=-1", "warmup_s"), ("warmup_s=nan", "warmup_s"),
        ("step_time_s=0", "step_time_s"), ("step_time_s=nan", "step_time_s"), ("step_time_s=inf", "step_time_s"),
        ("step_time_s=1e12", "step_time_s"),
        ("rounds=0", "rounds"), ("rounds=-1", "rounds"), (f"rounds={10**9}", "rounds"),
        ("allreduce=2", "allreduce"), ("fit_only=2", "fit_only"),
        ("runs=both", "runs"), ("budget_s=0", "budget_s"), ("budget_s=nan", "budget_s"), ("total_s=0", "total_s"),
        ("fit_s=-1", "fit_s"),
        ("run_max_duration_s=1", "run_max_duration_s"), ("run_startup_s=-1", "run_startup_s"),
        ("run_segment_s=-1", "run_segment_s"), ("run_compile_s=nan", "run_compile_s"),
        ("run_timeout_s=5", "run_timeout_s"), ("run_min_gradients=0", "run_min_gradients"),
        ("run_scale_min=0", "run_scale_min"), ("run_scale_min=1.5", "run_scale_min"),
        ("run_scale_floor=0.05", "run_scale_floor"), ("run_scale_floor=0.9", "run_scale_floor"),
        ("run_min_updates=1.5", "run_min_updates"), ("fix_undetermined=2", "fix_undetermined"),
        ("prior_factor=1", "prior_factor"), ("prior_factor=-3", "prior_factor"), ("prior_factor=nan", "prior_factor"),
        ("probe_sub_batch=7", "probe_sub_batch"), ("probe_sub_batch=-32", "probe_sub_batch"),
        ("measurements=afile/m.json", "measurements"), ("measurements=w", "measurements"),
        ("measurements=", "measurements"),
        ("runs_from=no_such.json", "runs_from"), ("runs_from=not_json.json", "runs_from"),
        ("runs_from=list.json", "runs_from"), ("runs_from=results_no_runs.json", "runs_from"),
        ("runs_from=results_bad_run.json", "runs_from"), ("runs_from=w", "runs_from"),
        ("no_such=1", "no_such"),
    ]
    cases = [(o + [k + arg], f + field) for arg, field in bad]
    cases += [(o + argv, field) for argv, field in [
        ([C + "model=resnet7"], "config.model"), ([C + "optimizer.name=adamw"], "config.optimizer.name"),
        ([S + "join_timeout_s=0"], "config.sprint.join_timeout_s"), ([C + "cpu_kernels=turbo"], "config.cpu_kernels"),
        ([S + "seed=-1"], "config.sprint.seed"),
    ]]
    cases += [
        (fit + [k + "measurements=no_such.json"], f + "measurements"),
        (fit + [k + "measurements=not_json.json"], f + "measurements"),
        (fit + [k + "measurements=wrong_format.json"], f + "measurements"),
        (fit + [k + "measurements=list.json"], f + "measurements"),
        (fit + [k + "measurements=w"], f + "measurements"),
        (fit + [k + "measurements=cal_meas.json", k + "runs_from=no_such.json"], f + "runs_from"),
        (fit + [k + "measurements=cal_meas.json", k + "prior_factor=0.5"], f + "prior_factor"),
        ([k + "measurements=cal/meas.json", "--out=afile/x.json"], "--out"),
        ([k + "measurements=cal/meas.json", "--out=w"], "--out"),
        ([k + "measurements=cal/meas.json", "--out="], "--out"),
        (o + ["--config=no_such_config.py"], "--config"), (o + ["--rounds=2"], "--rounds"),
        (o + ["extra"], "arguments"),
    ]
    return cases


def study_emulator_cases():
    s = [f"--config={EMULATOR_STUDY}", "--out=study/e"]
    st = C + "study."
    f = "config.study."
    bad = [
        ("names=()", "names"), ("names=('a', 'a', 'b')", "names"),
        ("learners=(8, 8)", "learners"), ("learners=(0, 8, 8)", "learners"), ("learners=(1.5, 8, 8)", "learners"),
        (f"learners=({HUGE}, 8, 8)", "learners"), ("learners=()", "learners"),
        ("network_times=(-1.0, 0.02, 0.004)", "network_times"),
        ("network_times=(nan, 0.02, 0.004)", "network_times"),
        ("network_times=(inf, 0.02, 0.004)", "network_times"),
        ("network_times=('x', 0.02, 0.004)", "network_times"),
        ("network_times=(0.08, 0.02)", "network_times"),
        ("sub_batches=(0, 16, 16)", "sub_batches"), ("sub_batches=(16, 16)", "sub_batches"),
        ("sub_batches=(16.5, 16, 16)", "sub_batches"), (f"sub_batches=({10**9}, 16, 16)", "sub_batches"),
        ("num_updates=0", "num_updates"), ("num_updates=-1", "num_updates"),
        ("seeds=()", "seeds"), ("seeds=(-1,)", "seeds"), ("seeds=(0.5,)", "seeds"), (f"seeds=({2**31},)", "seeds"),
        ("no_such=1", "no_such"),
    ]
    cases = [(s + [st + arg], f + field) for arg, field in bad]
    cases += [(s + argv, field) for argv, field in [
        ([C + "model=resnet7"], "config.model"), ([C + "lr.reference_batch=0"], "config.lr.reference_batch"),
        ([S + "warmup_s=-1"], "config.sprint.warmup_s"), ([S + "join_timeout_s=nan"], "config.sprint.join_timeout_s"),
        ([C + "optimizer.name=adamw"], "config.optimizer.name"), ([C + "bn.epsilon=0"], "config.bn.epsilon"),
        ([C + "lr.schedule=step"], "config.lr.schedule"),
        ([S + "polish_mode=1"], "config.sprint.polish_mode"),
    ]]
    cases += [
        (["--out=study/e"], "--config"), (["--config=no_such_config.py", "--out=study/e"], "--config"),
        ([f"--config={TESTING}", "--out=study/e"], "config.study"),
        ([f"--config={SPRINT}", "--out=study/e"], "config.study"),
        (s[:1] + ["--out=afile/e"], "--out"), (s[:1] + ["--out="], "--out"),
        (s[:1] + ["--out=afile/e", "--quick"], "--out"),
        (s + ["--quick", S + "join_timeout_s=0"], "config.sprint.join_timeout_s"),
        (s + ["--quick", C + "model=resnet7"], "config.model"),
        (s + ["--num_updates=3"], "--num_updates"), (s + ["extra"], "arguments"),
    ]
    return cases


CASES = {
    "run_sprint.py": run_sprint_cases(),
    "plan.py": plan_cases(),
    "validate_runtime.py": validate_runtime_cases(),
    "calibrate_runtime.py": calibrate_runtime_cases(),
    "study_emulator.py": study_emulator_cases(),
}


def train_cases():
    """experiments/train.py's cases of the resume and profiling fields (the rest: tests/test_bad_inputs.py)."""
    t = [f"--config={TESTING}", "--workdir=w"]
    unwritable = [*_unwritable(lambda p: [f"--config={TESTING}", f"--workdir={p}"], "--workdir"),
                  *_unwritable(lambda p: [f"--config={TESTING}", f"--workdir={p}/sub"], "--workdir")]
    return unwritable + [(t + [C + arg], field) for arg, field in [
        ("resume_allow_changes=nope", "config.resume_allow_changes"),
        ("resume_allow_changes=(1,)", "config.resume_allow_changes"),
        ("resume_allow_changes=lr.nope", "config.resume_allow_changes"),
        ("profile_steps=5", "config.profile_steps"), ("profile_steps=(3, 1)", "config.profile_steps"),
        ("profile_steps=(-1, 2)", "config.profile_steps"), ("profile_steps=(0, 100000000)", "config.profile_steps"),
        ("profile_steps=(0.5, 2)", "config.profile_steps"), ("profile_steps=a,b", "config.profile_steps"),
        ("profile_steps=(1, 2, 3)", "config.profile_steps"),
        # Measuring the noise scale, and stopping at a target.
        ("noise_scale.ema_decay=1.0", "config.noise_scale.ema_decay"),
        ("noise_scale.ema_decay=nan", "config.noise_scale.ema_decay"),
        ("noise_scale.num_windows=0", "config.noise_scale.num_windows"),
        ("noise_scale.enabled=2", "config.noise_scale.enabled"),
        ("stop_at_accuracy=1.5", "config.stop_at_accuracy"), ("stop_at_accuracy=nan", "config.stop_at_accuracy"),
        ("stop_evals=0", "config.stop_evals"),
    ]] + [(t + [C + "noise_scale.enabled=True"] + [C + a for a in args], "config.noise_scale.enabled") for args in (
        ["bn.reduction=global"], ["num_devices=1"],
        ["async_emulation.enabled=True", "async_emulation.num_sub_batches=4",
         "async_emulation.k_pmf=(0.0,0.5,0.5)"])]
