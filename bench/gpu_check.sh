#!/usr/bin/env bash
# The prepared check for a GPU machine with no network: install what its image lacks from .whl/ (make gpu-wheels),
# print the device's facts, run the GPU tier (tests/gpu, marker gpu) and a short benchmark (bench/bench_gpu.py),
# and write one report, gpu_check.md and gpu_check.json (with gpu_tests.xml and gpu_check.log beside them), into
# $OUT (default bench/results/gpu-check-<UTC time>/, a report to commit).
#
#   OUT=/some/folder bash bench/gpu_check.sh
#
# Every step runs under a time limit drawn from one budget (GPU_CHECK_SECONDS, 480 s: eight minutes, leaving a
# 15-minute device lease room to start the machine twice and rerun what failed), and a failing or missing step is reported, never fatal. Exit status 0 when the report
# was written, whatever it says; non-zero only when it could not be. Without CUDA it takes seconds and says so.
# Settings: PYTHON (the image's, default python3), GPU_WHEELS (.whl), GPU_WHEELS_LIST (bench/gpu_wheels.txt),
# GPU_TIER (tests/gpu's files: training and serving first, DeepSpeed last; or some files and test ids, space-separated; none), GPU_COMPARISONS (hf, zero: see 3b),
# GPU_CHECK_SECONDS (480),
# GPU_BENCH_SECONDS (30: the benchmark's timed training; 0 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

OUT="${OUT:-bench/results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"  # a dated report, committed
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY="${PYTHON:-$(command -v python3 || command -v python)}"
WHEELS="${GPU_WHEELS:-$REPO/.whl}"
LIST="${GPU_WHEELS_LIST:-$REPO/bench/gpu_wheels.txt}"
# One or more paths or test ids, run in the order given. The default (every tests/gpu/test_gpu_*.py) puts training
# and serving (the targets) before DeepSpeed, whose op builds (FusedAdam, CPU Adam: ~40 s each) make it the slowest
# file: on an H200 the whole tier needs ~9 minutes, so the budget's cut-off falls on DeepSpeed's last tests, which a
# second command reruns.
FIRST=(tests/gpu/test_gpu_training.py tests/gpu/test_gpu_serving.py)
LAST=tests/gpu/test_gpu_deepspeed.py
DEFAULT_TIER=$(shopt -s nullglob; for f in "${FIRST[@]}"; do [[ -e "$f" ]] && echo "$f"; done
  for f in tests/gpu/test_gpu_*.py; do [[ " ${FIRST[*]} $LAST " == *" $f "* ]] || echo "$f"; done
  if [[ -e "$LAST" ]]; then echo "$LAST"; fi)
read -r -a TIER <<< "${GPU_TIER:-$(echo ${DEFAULT_TIER:-tests/gpu})}"
BUDGET="${GPU_CHECK_SECONDS:-480}"
BENCH_SECONDS="${GPU_BENCH_SECONDS:-30}"
JUNIT="$OUT/gpu_tests.xml"
WORK=$(mktemp -d)  # the steps' records, merged into the report: only the report and its evidence go to $OUT

rm -f "$JUNIT" "$OUT/gpu_check.md" "$OUT/gpu_check.json"  # a report describes this run only
exec > >(tee "$OUT/gpu_check.log") 2>&1
tee_pid=$!

note() { echo "note: $*"; echo "$*" >> "$WORK/notes.txt"; }
left() { echo $(( BUDGET - SECONDS )); }
min() { (( $1 < $2 )) && echo "$1" || echo "$2"; }

# step NAME LIMIT COMMAND...: run it under a time limit (SIGINT first, so pytest still writes its JUnit XML), record
# its exit status and seconds for the report, and go on whatever happened.
step() {
  local limit=$2 rc=0
  step_name=$1 step_t0=$EPOCHREALTIME
  shift 2
  echo "=== $step_name (at most $limit s)"
  # in the background, so that a SIGTERM to this script is handled now (on_term), not after the step
  timeout -s INT --kill-after=10 "$limit" "$@" &
  child=$!
  wait "$child" || rc=$?
  child=
  record "$rc"
}
record() {
  printf '%s\t%s\t%s\n' "$step_name" "$1" \
    "$(awk -v a="$step_t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')" >> "$WORK/steps.tsv"
  (( $1 == 0 )) || echo "=== $step_name: exit status $1"
}
skip() { printf '%s\t\t\t%s\n' "$1" "$2" >> "$WORK/steps.tsv"; note "$1 skipped: $2"; }

# The report is written on the way out, however the script ends (a step's surprise, SIGTERM from an outer limit).
finish() {
  local rc=$? written=0
  trap - EXIT
  (( rc == 0 )) || note "the check stopped early (exit status $rc)"
  "$PY" "$REPO/bench/gpu_report.py" --work "$WORK" --out "$OUT" --junit "$JUNIT" && written=1
  rm -rf "$WORK"
  (( written )) || echo "gpu_check: could not write the report into $OUT" >&2
  exec >&- 2>&-  # the log is complete when this script ends: let tee see the end of it and finish
  wait "$tee_pid" 2>/dev/null || true
  (( written )) && exit 0 || exit 1
}
# Stopped from outside: stop the running step as its own limit would (pytest then still writes its XML), then report.
on_term() {
  local rc=0
  if [[ -n "${child:-}" ]]; then
    kill -INT "$child" 2>/dev/null || true
    wait "$child" || rc=$?
    record "$rc"
  fi
  exit 143
}
child=
trap finish EXIT
trap on_term TERM INT

echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ), $PY, report into $OUT, budget $BUDGET s"

# 1. What the image lacks, from the wheels, into an overlay environment (the image itself is left as it is).
step install "$(min 200 "$(left)")" "$PY" bench/gpu_install.py --venv "$WORK/venv" --wheels "$WHEELS" \
  --list "$LIST" --json "$WORK/install.json"
RUN_PY="$PY"
if [[ -x "$WORK/venv/bin/python" ]]; then
  RUN_PY="$WORK/venv/bin/python"
  export PATH="$WORK/venv/bin:$PATH"  # ninja (DeepSpeed's op builds), the deepspeed launcher, trainbook
else
  note "no overlay environment: running on $PY as it is"
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # the tree that travelled is what runs, installed or not

# 2. The facts every figure below depends on.
step facts "$(min 60 "$(left)")" "$RUN_PY" bench/gpu_facts.py --json "$WORK/facts.json"

# 3. The GPU tier, with what is left after keeping the benchmark's share (its compile and start) and the report's
# few seconds; without a benchmark (GPU_BENCH_SECONDS=0) only the report's.
reserve=$(( BENCH_SECONDS > 0 ? BENCH_SECONDS + 170 : 30 ))
tier_limit=$(( $(left) - reserve ))
missing=()
for t in "${TIER[@]}"; do [[ "$t" == none || -e "${t%%::*}" ]] || missing+=("${t%%::*}"); done
if [[ "${TIER[*]}" == none ]]; then
  skip "gpu tier" "GPU_TIER=none"
elif (( ${#missing[@]} )); then
  skip "gpu tier" "${missing[*]} does not exist: there is no GPU tier to run"
elif ! "$RUN_PY" -c "import pytest" 2>/dev/null; then
  skip "gpu tier" "pytest is not installed for $RUN_PY"
elif (( tier_limit < 30 )); then
  skip "gpu tier" "only $tier_limit s left of the budget"
else
  per_test=()
  # pytest-timeout stops one hung test and lets the others run; without it only the step's limit stops pytest
  if "$RUN_PY" -c "import pytest_timeout" 2>/dev/null; then per_test=(--timeout "$(min 240 $(( tier_limit - 10 )))"); fi
  # One process (no -n): the tests share the one GPU, and their timings mean something only alone. xdist stays
  # loaded: tests/conftest.py implements one of its hooks. Figures come back as JUnit properties (xunit1 keeps them
  # per test) and in $TRAINBOOK_FIGURES.
  TRAINBOOK_FIGURES="$WORK/figures.json" step "gpu tier" "$tier_limit" "$RUN_PY" -m pytest "${TIER[@]}" -m gpu -q \
    -p no:cacheprovider --junitxml="$JUNIT" -o junit_family=xunit1 "${per_test[@]}"
  rc=$(tail -n 1 "$WORK/steps.tsv" | cut -f2)
  if [[ "$rc" == 5 ]]; then note "the GPU tier collected no test (pytest exit status 5)"; fi
fi

# 3b. The comparisons issue 30 asks for, when GPU_COMPARISONS names them ("hf zero"): minutes each, so a lease's
# second command runs them (GPU_TIER=none GPU_BENCH_SECONDS=0 GPU_COMPARISONS="hf zero"). Their tables are in the log.
# hf: a ~1B Llama from config (16 x 2048, context 1024, bytes) through Trainbook, HF Trainer and a bare loop, bf16.
LLAMA_1B=(--set model.hf.config.hidden_size=2048 --set model.hf.config.intermediate_size=5632
  --set model.hf.config.num_hidden_layers=16 --set model.hf.config.num_attention_heads=16
  --set model.hf.config.num_key_value_heads=16 --set model.hf.config.max_position_embeddings=1024
  --set model.block_size=1024 --set train.batch_size=8 --set optim.lr=3e-4 --set optim.warmup_steps=10)
# zero: GPT-2 small's shape (the built-in GPT) under DeepSpeed, ZeRO-3 against ZeRO-0 on the one rank, bf16.
GPT2_SMALL=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set model.block_size=1024
  --set train.batch_size=8)
read -r -a COMPARISONS <<< "${GPU_COMPARISONS:-}"
if (( ${#COMPARISONS[@]} )) && ! "$RUN_PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  for c in "${COMPARISONS[@]}"; do skip "comparison $c" "no CUDA device"; done
  COMPARISONS=()
fi
for c in "${COMPARISONS[@]}"; do
  limit=$(( $(left) - reserve ))
  if (( limit < 60 )); then skip "comparison $c" "only $limit s left of the budget"; continue; fi
  case "$c" in
    hf) step "comparison hf" "$limit" "$RUN_PY" bench/bench_hf.py --device cuda --rounds 3 --steps 40 "${LLAMA_1B[@]}" ;;
    zero) step "comparison zero" "$limit" "$RUN_PY" bench/bench_zero.py --config tiny --rounds 3 --steps 30 \
      "${GPT2_SMALL[@]}" ;;
    *) skip "comparison $c" "not a comparison: allowed hf, zero" ;;
  esac
done

# 4. The benchmark: what is left, less the report's few seconds, bounds its timed part.
bench_seconds=$(min "$BENCH_SECONDS" $(( $(left) - 160 )))
if (( BENCH_SECONDS == 0 )); then
  skip benchmark "GPU_BENCH_SECONDS=0"
elif (( bench_seconds < 5 )); then
  skip benchmark "only $(left) s left of the budget"
else
  step benchmark "$(( bench_seconds + 150 ))" "$RUN_PY" bench/bench_gpu.py --seconds "$bench_seconds" \
    --json "$WORK/bench.json"
fi
# 5. The report: finish, on the way out.
