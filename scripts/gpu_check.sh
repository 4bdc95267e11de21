#!/usr/bin/env bash
# jaxsprint on one NVIDIA GPU, without network, in under 8 minutes; every figure in one JSON. See docs/gpu.md.
#
#   scripts/gpu_check.sh                        # on the GPU machine, from the repository root or anywhere
#   GPU_CHECK_ALLOW_CPU=1 scripts/gpu_check.sh  # the same parts on the CPU at tiny sizes (checks the plumbing)
#
# Parts, each under its own time limit, each recorded (status, exit code, seconds, log tail) even when it fails:
#   environment  Python, JAX, devices, nvidia-smi
#   install      the wheels carried in .whl/ that the image lacks, into $GPU_CHECK_SITE (default /tmp/site)
#   bench        scripts/bench_gpu.py: ResNet-50 224x224 bfloat16 batch 256, images/s and MFU
#   model        scripts/gpu_parts.py --part=model: the SPRINT specs model's step time for the bench (dgx_h200
#                preset at the bench's bf16 peak) beside the measured one, and its relative error
#   polish       scripts/bench_polish.py: the Final Polishing pass over the demo's model, beside its train step
#   sprint       scripts/gpu_parts.py --part=sprint: experiments/run_sprint.py with 1, 2, 4 learner threads on the
#                one device against the synchronous train step, and the model's prediction from the timings
#   demo         experiments/train.py --config=experiments/configs/default.py, capped at GPU_CHECK_DEMO_STEPS
#   tests        pytest on the GPU (JAX_PLATFORMS=cuda) over GPU_CHECK_TESTS, with what time is left
# Results: $OUT/gpu_check.json when OUT is set, else ./gpu_check.json (rewritten after every part, so a run
# cut short still leaves what it measured), and the logs in gpu_check_logs/ beside it.
#
# Each part's limit is its own cap, cut when the budget runs short so that the later parts keep a minimum
# (see `time_limit`); a part left without time is recorded as skipped.
#
# Settings (environment): PYTHON (python3), GPU_CHECK_ALLOW_CPU (0), GPU_CHECK_BUDGET_S (450 s for all parts;
# on the CPU 900 s, where every cap is doubled: a shared 2-core machine compiles slowly),
# GPU_CHECK_TESTS, GPU_CHECK_TEST_WORKERS, GPU_CHECK_DEMO_STEPS, GPU_CHECK_BENCH_ARGS, GPU_CHECK_MODEL_ARGS,
# GPU_CHECK_POLISH_ARGS, GPU_CHECK_SPRINT_ARGS, GPU_CHECK_SITE.
set -uo pipefail  # no -e: a failed part is recorded and the next one runs
cd "$(dirname "$0")/.."
START=$(date +%s)
PY="${PYTHON:-python3}"
RESULT_DIR="${OUT:-.}"
RESULT="$RESULT_DIR/gpu_check.json"
LOGS="$RESULT_DIR/gpu_check_logs"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"  # the parts' scratch (their figures are copied to RESULT)
trap 'rm -rf "$WORK"' EXIT
SITE="${GPU_CHECK_SITE:-/tmp/site}"
mkdir -p "$LOGS" "$WORK/status"
export PYTHONDONTWRITEBYTECODE=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several test workers share the one GPU

if [ "${GPU_CHECK_ALLOW_CPU:-0}" = 1 ]; then
  MODE="cpu"
  BUDGET="${GPU_CHECK_BUDGET_S:-900}"
  CAP_SCALE=2
  export JAX_PLATFORMS=cpu
  TESTS="${GPU_CHECK_TESTS:-tests/test_models.py}"
  WORKERS="${GPU_CHECK_TEST_WORKERS:-2}"
  DEMO_STEPS="${GPU_CHECK_DEMO_STEPS:-3}"
  # ResNet-20 at its zoo shape (32x32, 10 classes) in float32, so that the model part predicts it on the cpu preset.
  BENCH_ARGS="${GPU_CHECK_BENCH_ARGS:---model=resnet20 --batch=8 --image_size=32 --num_classes=10 --dtype=float32 \
--warmup=1 --steps=2 --rounds=1}"
  MODEL_ARGS="${GPU_CHECK_MODEL_ARGS:---machine=cpu --peak=preset}"
  POLISH_ARGS="${GPU_CHECK_POLISH_ARGS:---steps=2}"
  SPRINT_ARGS="${GPU_CHECK_SPRINT_ARGS:---learners=1,2,4 --duration_s=3 --warmup_s=0.5 --sync_steps=5}"
  DEMO_XLA_FLAGS="--xla_force_host_platform_device_count=8"  # as scripts/demo.sh does on a CPU
else
  MODE="gpu"
  BUDGET="${GPU_CHECK_BUDGET_S:-450}"
  CAP_SCALE=1
  export JAX_PLATFORMS=cuda  # tests/conftest.py defaults to cpu only when JAX_PLATFORMS is unset
  TESTS="${GPU_CHECK_TESTS:-tests/test_models.py tests/test_trainer.py tests/test_polish.py tests/test_staleness.py tests/test_parallel.py}"
  WORKERS="${GPU_CHECK_TEST_WORKERS:-4}"
  DEMO_STEPS="${GPU_CHECK_DEMO_STEPS:-120}"  # at least the whole demo (40 epochs of 2 steps at batch 512)
  BENCH_ARGS="${GPU_CHECK_BENCH_ARGS:---batch=256 --image_size=224 --warmup=3 --steps=20 --rounds=3}"
  # The preset's own peak is the fp32 one; bf16 training runs at the tensor cores' (the bench's, its MFU's peak).
  MODEL_ARGS="${GPU_CHECK_MODEL_ARGS:---machine=dgx_h200 --peak=bench}"
  POLISH_ARGS="${GPU_CHECK_POLISH_ARGS:---steps=5}"
  SPRINT_ARGS="${GPU_CHECK_SPRINT_ARGS:---learners=1,2,4 --duration_s=10 --warmup_s=2}"
  DEMO_XLA_FLAGS="${XLA_FLAGS:-}"
fi

# time_limit CAP RESERVE: a part's time limit in seconds: CAP (times CAP_SCALE), or what is left of the budget less
# RESERVE (the minimum kept for the parts after it) when that is less, but at least 30 s while they are left
# (0: no time left).
time_limit() {
  local cap=$(( $1 * CAP_SCALE )) reserve="$2" left t
  left=$(( BUDGET - ($(date +%s) - START) ))
  t=$(( left - reserve < cap ? left - reserve : cap ))
  if [ "$t" -lt 30 ]; then t=$(( left < 30 ? left : 30 )); fi
  echo $(( t > 0 ? t : 0 ))
}

# part NAME TIMEOUT_S COMMAND...: runs COMMAND under `timeout`, logs it, records its status, rewrites the JSON.
part() {
  local name="$1" limit="$2"
  shift 2
  local t0 rc ms
  t0=$(date +%s%N)
  local cmd="$*"
  if [ "$limit" -lt 1 ]; then  # `timeout 0` would mean no limit at all
    echo "== $name: skipped, no time left of the budget" >&2
    echo "skipped: no time left of the budget (GPU_CHECK_BUDGET_S=$BUDGET)" >"$LOGS/$name.log"
    echo '{"skipped": true, "seconds": 0, "limit_s": 0}' >"$WORK/status/$name.json"
    finish
    return 0
  fi
  echo "== $name (limit ${limit} s): ${cmd:0:160}" >&2
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '{"rc": %d, "seconds": %d.%03d, "limit_s": %d}\n' "$rc" $(( ms / 1000 )) $(( ms % 1000 )) "$limit" \
    >"$WORK/status/$name.json"
  echo "   rc=$rc" >&2
  finish
  return 0
}

# Gathers every part's status and figures into $RESULT (atomically).
finish() {
  "$PY" - "$WORK" "$LOGS" "$RESULT" "$MODE" "$START" <<'PYEOF'
import datetime, json, os, sys
import xml.etree.ElementTree as ET

work, logs, result, mode, start = sys.argv[1:6]
ORDER = ("environment", "install", "bench", "model", "polish", "sprint", "demo", "tests")
FIGURES = {"environment": "environment.json", "install": "install.json", "bench": "bench.json",
           "model": "model.json", "polish": "polish.json", "sprint": "sprint.json"}  # in $WORK


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tail(name, n=2000):
    try:
        with open(os.path.join(logs, name + ".log"), errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def junit(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds or "error" in kinds:
            counts["failed" if "failure" in kinds else "errors"] += 1
            child = case.find("failure") if "failure" in kinds else case.find("error")
            message = (child.get("message") or child.text or "").strip().splitlines()
            failures.append({"test": test, "message": (message[0] if message else "")[:300]})
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures}


parts = {}
for name in ORDER:
    status = load(os.path.join(work, "status", name + ".json"))
    if status is None:
        parts[name] = {"status": "not run"}
        continue
    if status.pop("skipped", False):
        parts[name] = {"status": "skipped", **status, "log_tail": tail(name)}
        continue
    rc = status["rc"]
    state = "ok" if rc == 0 else ("timed_out" if rc in (124, 137) else "failed")
    entry = {"status": state, **status}
    if name in FIGURES:  # what a part measured before it failed is kept too (the sprint part writes per run)
        entry["figures"] = load(os.path.join(work, FIGURES[name]))
    elif name == "demo":
        summary = load(os.path.join(work, "demo", "summary.json"))
        entry["figures"] = {k: v for k, v in (summary or {}).items() if isinstance(v, (int, float, str, bool))
                            } or None
    elif name == "tests":
        entry["figures"] = junit(os.path.join(work, "tests.xml"))
    if state != "ok" or name == "tests":
        entry["log_tail"] = tail(name)
    parts[name] = entry


def finite(x):  # NaN / Inf (e.g. an unmeasured figure) become null: the file stays standard JSON
    if isinstance(x, float) and x != x or x in (float("inf"), float("-inf")):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x


now = datetime.datetime.now(datetime.timezone.utc)
out = {"mode": mode, "started_unix_s": int(start), "written": now.isoformat(timespec="seconds"),
       "elapsed_s": round(now.timestamp() - int(start), 1),
       "ok": all(p["status"] == "ok" for p in parts.values()), "parts": parts}
os.makedirs(os.path.dirname(os.path.abspath(result)), exist_ok=True)
with open(result + ".tmp", "w") as f:
    json.dump(finite(out), f, indent=1, allow_nan=False)
os.replace(result + ".tmp", result)
PYEOF
}

# --- environment: before anything is installed, so that it describes the image itself.
part environment 60 "$PY" -c "
import json, platform, shutil, subprocess, sys
env = {'python': sys.version.split()[0], 'platform': platform.platform()}
try:
    import jax
    env.update(jax_version=jax.__version__, backend=jax.default_backend(),
               devices=[f'{d.platform}:{d.device_kind}' for d in jax.devices()])
except Exception as e:  # recorded, not fatal: the parts below say what still works
    env['jax_error'] = f'{type(e).__name__}: {e}'
if shutil.which('nvidia-smi'):
    q = subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version,memory.total', '--format=csv,noheader'],
                       capture_output=True, text=True)
    env['nvidia_smi'] = q.stdout.strip() or q.stderr.strip()
json.dump(env, open('$WORK/environment.json', 'w'), indent=1)
print(json.dumps(env))
ok = 'jax_error' not in env and ('$MODE' == 'cpu' or env['backend'] == 'gpu')
sys.exit(0 if ok else 1)
"

# --- install: only the wheels whose distribution the image does not have (an image's own versions win).
install() {
  local wheels
  mapfile -t wheels < <("$PY" - "$WORK/install.json" <<'PYEOF'
import glob, importlib.metadata as md, json, os, sys
todo, present = [], {}
for wheel in sorted(glob.glob(".whl/*.whl")):
    name = os.path.basename(wheel).split("-")[0]
    try:
        present[name] = md.version(name)
    except md.PackageNotFoundError:
        todo.append(wheel)
json.dump({"wheels_found": len(todo) + len(present), "installed": [os.path.basename(w) for w in todo],
           "image_has": present}, open(sys.argv[1], "w"), indent=1)
print("\n".join(todo))
PYEOF
  )
  if [ "${#wheels[@]}" -eq 0 ] || [ -z "${wheels[0]}" ]; then
    echo "nothing to install: $(ls .whl/*.whl 2>/dev/null | wc -l) wheels in .whl, all present in the image"
    return 0
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
}
export -f install
export PY WORK SITE
part install 120 bash -c install
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

# Minimum seconds kept for the parts after each one (model 15, polish 40, sprint 90, demo 45, tests 30).
# shellcheck disable=SC2086  # the *_ARGS and TESTS settings are lists of flags and paths
{
# --- bench: ResNet-50 images/s and MFU
part bench "$(time_limit 200 220)" "$PY" scripts/bench_gpu.py $BENCH_ARGS --json="$WORK/bench.json"

# --- model: the specs model against the bench's step (on the CPU backend: the model is a few jnp operations)
part model "$(time_limit 60 205)" env JAX_PLATFORMS=cpu "$PY" scripts/gpu_parts.py --part=model \
  --bench="$WORK/bench.json" $MODEL_ARGS --json="$WORK/model.json"

# --- polish: the Final Polishing pass over the demo's model (one device)
part polish "$(time_limit 90 165)" "$PY" scripts/bench_polish.py $POLISH_ARGS --json="$WORK/polish.json"

# --- sprint: the asynchronous runtime with 1, 2 and 4 learner threads on one device, and the synchronous step
part sprint "$(time_limit 150 75)" "$PY" scripts/gpu_parts.py --part=sprint $SPRINT_ARGS --workdir="$WORK/sprint" \
  --json="$WORK/sprint.json"

# --- demo
part demo "$(time_limit 150 30)" env XLA_FLAGS="$DEMO_XLA_FLAGS" "$PY" experiments/train.py \
  --config=experiments/configs/default.py --workdir="$WORK/demo" --config.num_train_steps="$DEMO_STEPS"

# --- tests: what time is left of the budget
part tests "$(time_limit 100000 15)" "$PY" -m pytest -q -p no:cacheprovider -n "$WORKERS" --junitxml="$WORK/tests.xml" \
  $TESTS
}

echo "results: $RESULT ($(( $(date +%s) - START )) s)" >&2
"$PY" -c "
import json, sys
r = json.load(open('$RESULT'))
for name, p in r['parts'].items():
    print(f'{name:<12} {p[\"status\"]}')
sys.exit(0 if r['ok'] else 1)
"
