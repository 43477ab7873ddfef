#!/usr/bin/env bash
# One device call (~480 s on an H100): GPU tests, the attention suite, GPT-2 in the models suite, the compiler
# suite, each step under its own `timeout`, all written under OUTDIR.
#
#   tools/device_run.sh [--smoke] OUTDIR [PYTEST ARGS ...]
#
# PYTEST ARGS: the tests to run (files, node ids, -m gpu, -k ...); none: the tests step is skipped.
# --smoke: a dry run on a machine with no GPU (the suites' --smoke forms, tiny shapes on the interpreter), to
# check this script's logic; set PYTHON to the interpreter to use (default python3).
#
# Budgets (seconds, environment-overridable; a step of budget 0 is skipped):
#   TOTAL_BUDGET_S        everything, tar included                                         (default 470)
#   TESTS_BUDGET_S        the pytest run                                                   (60)
#   ATTENTION_BUDGET_S    `bench attention --quick` (its variants included)                (120)
#   MODELS_INFER_BUDGET_S `bench models --only gpt2 --mode infer`                          (80)
#   MODELS_TRAIN_BUDGET_S `bench models --only gpt2 --mode train`                          (140)
#   MODELS_DECODE_BUDGET_S `bench models --only gpt2 --mode decode` (batch 1, KV cache)     (0)
#   COMPILER_BUDGET_S     `bench compiler --quick`                                         (60)
#   MODELS_BACKENDS       eager,inductor,tilefuse,tilefuse-reduce-overhead
#   MODELS_ROW_LIMIT_S    --time-limit of a model x backend (default: half the step's timeout: the two compiles
#                         that take time, Inductor's and tilefuse's, share it; a -reduce-overhead mode tilefuse
#                         lacks costs a trace, ~2 s)
#   MODELS_ARGS           extra arguments for the models steps (default --no-warm: one compile a backend)
#   ATTENTION_ARGS        extra arguments for the attention step (default --rep-ms 50)
# A step's timeout is its budget plus what the steps before it left unused, less nothing the steps after it are
# owed; the suites' own limits (--budget, --time-limit) are set inside it, so a slow row becomes a "not run" row
# and the CSV is whole. A step cut off by its timeout still leaves its partial CSV (<suite>.partial.csv).
#
# OUTDIR gets at most 8 files (what the device tool brings back): device_run.log, gpu-tests.log, attention.csv,
# models-infer.csv, models-train.csv, models-decode.csv (when run), compiler.csv, device_run.tar.gz (everything
# else: per-step logs, JUnit XML, the cache's tuning decisions and ceilings). A step's CSV is the partial one
# where the step was cut off: <name>.partial.csv instead of <name>.csv.
set -uo pipefail
smoke=0
if [ "${1:-}" = "--smoke" ]; then smoke=1; shift; fi
out=${1:?usage: tools/device_run.sh [--smoke] OUTDIR [PYTEST ARGS ...]}; shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
work="$out/work"; mkdir -p "$work"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TILEFUSE_CACHE_DIR="${TILEFUSE_CACHE_DIR:-$work/cache}"
PY=${PYTHON:-python3}

TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-470}
TESTS_BUDGET_S=${TESTS_BUDGET_S:-60}
ATTENTION_BUDGET_S=${ATTENTION_BUDGET_S:-120}
MODELS_INFER_BUDGET_S=${MODELS_INFER_BUDGET_S:-80}
MODELS_TRAIN_BUDGET_S=${MODELS_TRAIN_BUDGET_S:-140}
MODELS_DECODE_BUDGET_S=${MODELS_DECODE_BUDGET_S:-0}
COMPILER_BUDGET_S=${COMPILER_BUDGET_S:-60}
MODELS_BACKENDS=${MODELS_BACKENDS:-eager,inductor,tilefuse,tilefuse-reduce-overhead}
MODELS_ARGS=${MODELS_ARGS---no-warm}
ATTENTION_ARGS=${ATTENTION_ARGS---rep-ms 50}
TAR_RESERVE_S=5
[ $# -gt 0 ] || TESTS_BUDGET_S=0

log="$out/device_run.log"
exec > >(tee "$log") 2>&1
status=0
start=$SECONDS
steps=(tests attention models-infer models-train models-decode compiler)
declare -A budget=([tests]=$TESTS_BUDGET_S [attention]=$ATTENTION_BUDGET_S [models-infer]=$MODELS_INFER_BUDGET_S
                   [models-train]=$MODELS_TRAIN_BUDGET_S [models-decode]=$MODELS_DECODE_BUDGET_S
                   [compiler]=$COMPILER_BUDGET_S)

# seconds step $1 may run: what is left of the total, less the budgets of the steps after it and the tar
step_timeout() {
  local later=0 seen=0 s
  for s in "${steps[@]}"; do
    if [ $seen = 1 ]; then later=$((later + ${budget[$s]})); fi
    [ "$s" = "$1" ] && seen=1
  done
  local left=$((TOTAL_BUDGET_S - (SECONDS - start) - later - TAR_RESERVE_S))
  [ $left -gt 0 ] || left=0
  echo $left
}

# run STEP NAME SUITE CMD...: the command under timeout, its log in work/, its CSV copied to OUTDIR as NAME.csv
run_step() {
  local name=$1 suite=$2 limit=$3; shift 3
  local dir="$work/$name"; mkdir -p "$dir"
  echo "== $(date -u +%T) $name: timeout ${limit} s: $*"
  local t0=$SECONDS rc=0
  timeout --kill-after=5 "$limit" "$@" > >(tee "$dir/step.log") 2>&1 || rc=$?
  sleep 0.2  # let tee finish
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    echo "== $name CUT OFF after ${limit} s (timeout): rows after the last one logged were not run"; status=1
  elif [ $rc != 0 ]; then
    echo "== $name exit status $rc"; status=1
  fi
  if [ -n "$suite" ]; then
    local full partial
    full=$(ls "$dir/$suite".csv "$dir/$suite"-smoke.csv 2>/dev/null | head -1)
    partial=$(ls "$dir/$suite".partial.csv "$dir/$suite"-smoke.partial.csv 2>/dev/null | head -1)
    if [ -n "$full" ]; then cp "$full" "$out/$name.csv"
    elif [ -n "$partial" ]; then cp "$partial" "$out/$name.partial.csv"; echo "== $name: only a partial CSV"
    else echo "== $name: no CSV"; fi
  fi
  local left=$((TOTAL_BUDGET_S - (SECONDS - start)))
  echo "== $(date -u +%T) $name done in $((SECONDS - t0)) s (rc $rc, $left s of the total left)"
}

bench() {  # bench NAME SUITE ARGS...: `tilefuse bench SUITE` into work/NAME
  local name=$1 suite=$2; shift 2
  local limit; limit=$(step_timeout "$name")
  if [ "${budget[$name]}" = 0 ]; then echo "== $name skipped (budget 0)"; return; fi
  if [ "$limit" -lt 15 ]; then echo "== $name NOT RUN: ${limit} s left of the total budget"; status=1; return; fi
  local extra=()
  [ $smoke = 1 ] && extra=(--smoke)
  run_step "$name" "$suite" "$limit" $PY -m tilefuse bench "$suite" --out "$work/$name" "${extra[@]}" "$@"
}

echo "== $(date -u +%FT%TZ) device_run in $here -> $out (smoke=$smoke, total budget ${TOTAL_BUDGET_S} s)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>/dev/null | head -3
$PY -c "import torch, triton, transformers as t; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', t.__version__)"

# 1. the GPU tests named on the command line
if [ "$TESTS_BUDGET_S" != 0 ]; then
  limit=$(step_timeout tests)
  echo "== $(date -u +%T) tests: timeout ${limit} s: pytest $*"
  rc=0
  timeout --kill-after=5 "$limit" $PY -m pytest -v -rfE --tb=short -p no:cacheprovider \
    --junitxml="$work/gpu-tests.xml" "$@" > "$out/gpu-tests.log" 2>&1 || rc=$?
  tail -n 25 "$out/gpu-tests.log"
  if [ $rc = 124 ] || [ $rc = 137 ]; then echo "== tests CUT OFF after ${limit} s"; status=1
  elif [ $rc != 0 ] && [ $rc != 5 ]; then echo "== tests exit status $rc"; status=1; fi
fi

# 2-4. the suites; each sets its own inner limits from what its timeout allows
if [ $smoke = 1 ]; then
  att_only=(--only window); models_only=(--only gpt2); compiler_only=(--only softmax)
else
  att_only=(); models_only=(--only gpt2); compiler_only=()
fi
if [ "$ATTENTION_BUDGET_S" != 0 ]; then
  limit=$(step_timeout attention)
  # the suite's own budget: the step's time less ~20 s of start-up (imports, ceilings, the first reference)
  att_budget=$((limit > 40 ? limit - 20 : 20))
  budget_arg=(--budget "$att_budget"); [ $smoke = 1 ] && budget_arg=()
  # shellcheck disable=SC2086
  bench attention attention --quick "${att_only[@]}" "${budget_arg[@]}" $ATTENTION_ARGS
fi
for mode in infer train decode; do
  name="models-$mode"
  limit=$(step_timeout "$name")
  row_limit=${MODELS_ROW_LIMIT_S:-$((limit / 2 > 10 ? limit / 2 : 10))}
  # shellcheck disable=SC2086
  bench "$name" models "${models_only[@]}" --mode "$mode" --backends "$MODELS_BACKENDS" --time-limit "$row_limit" \
    $MODELS_ARGS
done
bench compiler compiler --quick "${compiler_only[@]}"

echo "== $(date -u +%T) done in $((SECONDS - start)) s, status $status"
cp -r "$TILEFUSE_CACHE_DIR"/ceilings "$TILEFUSE_CACHE_DIR"/tuning "$work"/ 2>/dev/null
tar czf "$out/device_run.tar.gz" -C "$work" --exclude=./cache . 2>/dev/null
rm -rf "$work"
ls "$out"
sleep 1  # let tee write the log's last lines before the device tool collects OUTDIR
exit $status
