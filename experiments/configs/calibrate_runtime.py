r"""The runtime calibration of this machine (experiments/calibrate_runtime.py): the ``cpu_runtime`` preset's figures.

The SPRINT config (``sprint.py``: network, data, optimizer) plus ``config.calibration``, what is measured and
fitted. At most 10 minutes on a quiet 2-core machine; refitting stored measurements (``fit_only``) a minute:

  python experiments/calibrate_runtime.py --config=experiments/configs/calibrate_runtime.py --out=PRESET.json
  python experiments/calibrate_runtime.py --config.calibration.fit_only=True --out=PRESET.json \
      --config.calibration.runs_from=docs/runtime-calibration-runs/results.json

The tuples also take comma-separated text on the command line (``--config.calibration.learners=1,2,4``).
"""
import ml_collections
from ml_collections import config_dict

from experiments.configs import sprint


def get_config() -> ml_collections.ConfigDict:
    c = sprint.get_config()
    c.calibration = ml_collections.ConfigDict()
    k = c.calibration
    k.measurements = "docs/runtime-calibration.json"  # measurements (JSON): written when measuring, read by fit_only
    k.fit_only = False              # refit the measurements stored in `measurements`; measure nothing
    k.runs_from = config_dict.placeholder(str)  # validate_runtime.py results.json whose runs are the fit's runs
    k.check_speed = False           # time the lone steps of `measurements` again, print the change; nothing else
    # 1. One learner's gradient step.
    k.sub_batches = (8, 16, 32, 64, 128)  # single-learner sub-batches
    k.rounds = 3                    # interleaved rounds of the single-learner timing
    k.rounds_after = 2              # its rounds again after the design's runs (0: none); the fit takes both
    k.step_time_s = 1.0             # seconds of each sub-batch's steps per round (and of its cores measurement)
    # 2. Runtime runs, unless runs_from gives them. design: runs chosen from the figures' sensitivities
    # (jaxsprint.calibration.design: 1-2 hosts, 1-8 learners, sub-batch 8-128, network 0-100 ms, both updater
    # placements; one run of every (hosts, placement, network or not) first), the runs of one process layout
    # (hosts, learners, placement) in a row in the same processes;
    # grid: the one-host runs of learners x network_times at run_sub_batch below, in this process.
    k.runs = "design"
    k.budget_s = 430.0              # design: seconds of runs (each run's start-up and length) it may spend
    #                                 (held at the pace measured: runs that no longer fit are dropped)
    k.total_s = 590.0               # design: the whole calibration's wall clock, from the launcher's start (s):
    #                                 the runs get at most what is left of it after the lone steps and
    #                                 all-reduces, less the lone steps' rounds after them and fit_s
    k.fit_s = 60.0                  # design: seconds kept for the fit after the runs (35-45 s on 2 cores)
    k.run_min_gradients = 500       # design: gradients after the warm-up each run is planned for
    k.run_min_updates = 100         # design: updates after the warm-up each run is planned for
    k.run_min_measure_s = 4.0       # design: seconds each run measures after its warm-up at least
    k.run_max_duration_s = 20.0     # design: longest run (s)
    k.run_scale_min = 0.6           # design: the least share of that measuring a run may get where a run of
    #                                 every regime would not fit otherwise (design.run_scale)
    k.run_scale_floor = 0.3         # design: the least share a run may be shortened to where the runs take
    #                                 longer than planned (every regime's run is shortened before one is dropped)
    k.run_startup_s = 8.0           # design: starting a series' process, each (interpreter, imports, JAX, data)
    k.run_segment_s = 2.0           # design: each run's own start and end (build, barrier, final evaluation)
    k.run_compile_s = 1.5           # design: compiling the step for a sub-batch new to a series, per learner
    k.run_timeout_s = 300.0         # design: stop a series' processes after this long per run in it (s)
    k.probe_sub_batch = 32          # design: the lone step at this sub-batch (one of sub_batches; 0: none),
    #                                 step_time_s long, before the first series and after each: the machine's
    #                                 speed through the runs (each run's probe_s in the measurement file)
    k.fix_undetermined = True       # hold the figures the runs do not determine at their neutral values (with
    #                                 prior_factor: those the fit ends on a bound)
    k.prior_factor = 0.0            # > 1: each runtime figure's prior, within this factor of
    #                                 host_fit.RUNTIME_START (one standard deviation in log); 0: none. Off: held
    #                                 out it did not help yet (docs/calibration.md, "A prior on the runtime figures")
    k.learners = (1, 2, 4, 8)       # learner counts of the runtime runs
    k.network_times = (0.0, 0.02)   # emulated network times of the runs (s)
    k.run_sub_batch = 32            # sub-batch of the runtime runs
    k.duration_s = 8.0              # length of each runtime run (s)
    k.warmup_s = 2.0                # start-up transient left out of each run (s)
    # 3. All-reduces.
    k.allreduce = True              # time all-reduces over 2 processes (gloo)
    return c
