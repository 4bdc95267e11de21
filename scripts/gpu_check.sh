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
#   demo         experiments/train.py --config=experiments/configs/default.py, capped at GPU_CHECK_DEMO_STEPS
#   tests        pytest on the GPU (JAX_PLATFORMS=cuda) over GPU_CHECK_TESTS, with what time is left
# Results: $OUT/gpu_check.json when OUT is set, else ./gpu_check.json (rewritten after every part, so a run
# cut short still leaves what it measured), and the logs in gpu_check_logs/ beside it.
#
# Settings (environment): PYTHON (python3), GPU_CHECK_ALLOW_CPU (0), GPU_CHECK_BUDGET_S (450: all parts),
# GPU_CHECK_TESTS, GPU_CHECK_TEST_WORKERS, GPU_CHECK_DEMO_STEPS, GPU_CHECK_BENCH_ARGS, GPU_CHECK_SITE.
set -uo pipefail  # no -e: a failed part is recorded and the next one runs
cd "$(dirname "$0")/.."
START=$(date +%s)
PY="${PYTHON:-python3}"
RESULT_DIR="${OUT:-.}"
RESULT="$RESULT_DIR/gpu_check.json"
LOGS="$RESULT_DIR/gpu_check_logs"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
SITE="${GPU_CHECK_SITE:-/tmp/site}"
BUDGET="${GPU_CHECK_BUDGET_S:-450}"
mkdir -p "$LOGS" "$WORK/status"
export PYTHONDONTWRITEBYTECODE=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several test workers share the one GPU

if [ "${GPU_CHECK_ALLOW_CPU:-0}" = 1 ]; then
  MODE="cpu"
  export JAX_PLATFORMS=cpu
  TESTS="${GPU_CHECK_TESTS:-tests/test_models.py}"
  WORKERS="${GPU_CHECK_TEST_WORKERS:-2}"
  DEMO_STEPS="${GPU_CHECK_DEMO_STEPS:-3}"
  BENCH_ARGS="${GPU_CHECK_BENCH_ARGS:---batch=2 --image_size=64 --warmup=1 --steps=1 --rounds=1}"
  DEMO_XLA_FLAGS="--xla_force_host_platform_device_count=8"  # as scripts/demo.sh does on a CPU
else
  MODE="gpu"
  export JAX_PLATFORMS=cuda  # tests/conftest.py defaults to cpu only when JAX_PLATFORMS is unset
  TESTS="${GPU_CHECK_TESTS:-tests/test_models.py tests/test_train.py tests/test_polish.py tests/test_staleness.py tests/test_parallel.py}"
  WORKERS="${GPU_CHECK_TEST_WORKERS:-4}"
  DEMO_STEPS="${GPU_CHECK_DEMO_STEPS:-120}"  # at least the whole demo (40 epochs of 2 steps at batch 512)
  BENCH_ARGS="${GPU_CHECK_BENCH_ARGS:---batch=256 --image_size=224 --warmup=3 --steps=20 --rounds=3}"
  DEMO_XLA_FLAGS="${XLA_FLAGS:-}"
fi

# part NAME TIMEOUT_S COMMAND...: runs COMMAND under `timeout`, logs it, records its status, rewrites the JSON.
part() {
  local name="$1" limit="$2"
  shift 2
  local t0 rc ms
  t0=$(date +%s%N)
  local cmd="$*"
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
ORDER = ("environment", "install", "bench", "demo", "tests")


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
    rc = status["rc"]
    state = "ok" if rc == 0 else ("timed_out" if rc in (124, 137) else "failed")
    entry = {"status": state, **status}
    if name == "environment":
        entry["figures"] = load(os.path.join(work, "environment.json"))
    elif name == "install":
        entry["figures"] = load(os.path.join(work, "install.json"))
    elif name == "bench":
        entry["figures"] = load(os.path.join(work, "bench.json"))
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

# --- bench (d)
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
part bench 240 "$PY" scripts/bench_gpu.py $BENCH_ARGS --json="$WORK/bench.json"

# --- demo (c)
part demo 150 env XLA_FLAGS="$DEMO_XLA_FLAGS" "$PY" experiments/train.py --config=experiments/configs/default.py \
  --workdir="$WORK/demo" --config.num_train_steps="$DEMO_STEPS"

# --- tests (b): what time is left of the budget, at least a minute.
LEFT=$(( BUDGET - ($(date +%s) - START) - 15 ))
if [ "$LEFT" -lt 60 ]; then LEFT=60; fi
# shellcheck disable=SC2086  # TESTS is a list of paths
part tests "$LEFT" "$PY" -m pytest -q -p no:cacheprovider -n "$WORKERS" --junitxml="$WORK/tests.xml" $TESTS

echo "results: $RESULT ($(( $(date +%s) - START )) s)" >&2
"$PY" -c "
import json, sys
r = json.load(open('$RESULT'))
for name, p in r['parts'].items():
    print(f'{name:<12} {p[\"status\"]}')
sys.exit(0 if r['ok'] else 1)
"
