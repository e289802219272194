#!/usr/bin/env bash
# Reproduces the tables the READMEs quote, into one results folder, each table stamped with its
# command, start and end time (UTC), CPU, cores, load and commit (INDEX.md there).
#
#   scripts/bench-all.sh [--out DIR] [--only NAME[,NAME...]] [--list]
#
# Tables (name: command; time on the 2-core CI-like VM, unloaded):
#   reuse-MODEL     kamera bench reuse, 4 x 1024-token chunks, 7 pairs          (~5-15 min each)
#   model-MODEL     kamera bench model --against llama.cpp                        (~10 min each)
#   store           kamera bench store (sled, Redis on loopback)                  (~2 min)
#   session-*       kamera bench session, 100 steps, with llama.cpp:
#                   SmolLM2-135M and Qwen2.5-0.5B at windows 512 and 1024         (~15-40 min each)
#   run             scripts/bench-run.sh scenarios/order-status.toml 5            (~2 min)
#   agent           kamera bench agent (3 models, 25 tasks x 5 seeds, baselines)  (hours)
#   eval            kamera eval on the held-out tasks (SmolLM2-135M)             (~30 min)
# Screenshots at real shapes (Qwen2.5-VL-3B's geometry, random weights: cost, not behaviour; the
# checkpoint written by `kamera models random-vl` into $KAMERA_HOME/random-vl/ when missing):
#   vl3b-calibrate  kamera calibrate on it (the session's cost model reads this machine's rates) (~2 min)
#   vl3b-vision-f32, vl3b-vision-bf16
#                   kamera bench vision --against transformers, torch in f32 / bf16 (HF's best
#                   is bf16 on AMX or AVX512_BF16 CPUs, f32 elsewhere), one engine loaded at a
#                   time, 3 pairs                                                (~8-15 min each)
#   vl3b-reuse      kamera bench reuse: the screenshot chunk relocated + patched against its
#                   encode, 2 x 256-token text chunks, 5 pairs                   (~10 min)
#   vl3b-session    kamera bench session --observe screenshot, 20 steps, window 768, the default
#                   policy and the blind one (--front 1)                         (~60 min)
# MODEL: smollm2-135m, qwen2.5-0.5b, gemma3-270m. The whole set takes most of a day on 2 cores;
# --only picks tables. It builds the release binary first (CARGO_TARGET_DIR is honoured) and
# installs llama.cpp's venv (scripts/llamacpp-venv.sh) when a table needs it.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo -dirty)
out=bench/all/$(date -u +%Y-%m-%d)-$commit
only=""
models="smollm2-135m qwen2.5-0.5b gemma3-270m"
tables=()
for m in $models; do tables+=("reuse-$m"); done
for m in $models; do tables+=("model-$m"); done
tables+=(store session-smollm2-135m-w512 session-smollm2-135m-w1024 session-qwen2.5-0.5b-w512 session-qwen2.5-0.5b-w1024 run agent eval)
tables+=(vl3b-calibrate vl3b-vision-f32 vl3b-vision-bf16 vl3b-reuse vl3b-session)
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --list) printf '%s\n' "${tables[@]}"; exit 0 ;;
    *) echo "bench-all: unknown argument $1 (expected --out DIR, --only NAMES or --list)" >&2; exit 2 ;;
  esac
done
selected=()
if [ -n "$only" ]; then
  IFS=, read -r -a want <<<"$only"
  for w in "${want[@]}"; do
    printf '%s\n' "${tables[@]}" | grep -qx -- "$w" || { echo "bench-all: no table $w (see --list)" >&2; exit 2; }
    selected+=("$w")
  done
else
  selected=("${tables[@]}")
fi
cargo build --release -p kamera-cli >&2
kamera=$(realpath "${CARGO_TARGET_DIR:-target}/release/kamera")
export KAMERA=$kamera  # scripts/bench-run.sh runs this binary
mkdir -p "$out"
out=$(realpath "$out")
index=$out/INDEX.md
[ -f "$index" ] || printf '# bench-all results\n\n| table | command | start (UTC) | end (UTC) | CPU | load at start / end | commit | files |\n|---|---|---|---|---|---|---|---|\n' >"$index"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($(nproc) cores)"
load() { cut -d' ' -f1 /proc/loadavg; }

run_table() { # name, then the command (run in $out; stdout to NAME.md, stderr to NAME.log)
  local name=$1; shift
  local start l0 rc=0
  start=$(date -u +%Y-%m-%dT%H:%M:%S)
  l0=$(load)
  echo "bench-all: $name: $*" >&2
  (cd "$out" && "$@" >"$name.md" 2>"$name.log") || rc=$?
  local files
  files=$(cd "$out" && ls -d "$name"* 2>/dev/null | tr '\n' ' ')
  local status=""
  [ $rc -eq 0 ] || status=" **failed (exit $rc), see $name.log**"
  printf '| %s | `%s` | %s | %s | %s | %s / %s | %s | %s%s |\n' "$name" "${*//$kamera/kamera}" "$start" \
    "$(date -u +%Y-%m-%dT%H:%M:%S)" "$cpu" "$l0" "$(load)" "$commit" "$files" "$status" >>"$index"
  [ $rc -eq 0 ] || echo "bench-all: $name failed (exit $rc); going on" >&2
}

vl3b=${KAMERA_HOME:-$HOME/.cache/kamera}/random-vl/qwen2.5-vl-3b-seed0
if printf '%s\n' "${selected[@]}" | grep -q '^vl3b-' && [ ! -f "$vl3b/config.json" ]; then
  echo "bench-all: writing the random-weight Qwen2.5-VL-3B checkpoint into $vl3b" >&2
  "$kamera" models random-vl --geometry qwen2.5-vl-3b "$vl3b" --seed 0 >&2
fi

for t in "${selected[@]}"; do
  case $t in
    reuse-*) m=${t#reuse-}
      run_table "$t" "$kamera" bench reuse --model "$m" --chunk-tokens 1024 --chunks 4 --question-tokens 32 \
        --rank 32 --pairs 7 --json "$t.json" ;;
    model-*) m=${t#model-}
      run_table "$t" "$kamera" bench model --model "$m" --against llama.cpp --json ;;
    store) run_table "$t" "$kamera" bench store --json store.json ;;
    session-*)
      rest=${t#session-}; m=${rest%-w*}; w=${rest##*-w}
      run_table "$t" "$kamera" bench session --model "$m" --steps 100 --window "$w" --front 1 \
        --against-llamacpp --out "$t" ;;
    run) run_table "$t" "$PWD/scripts/bench-run.sh" "$PWD/scenarios/order-status.toml" 5 ;;
    agent) run_table "$t" "$kamera" bench agent --json agent.json ;;
    vl3b-calibrate) run_table "$t" "$kamera" calibrate --model "$vl3b" --tokens 256 --context 256 --reps 1 ;;
    vl3b-vision-*) dtype=${t#vl3b-vision-}
      run_table "$t" "$kamera" bench vision --model "$vl3b" --against transformers --torch-dtype "$dtype" \
        --one-at-a-time --rounds 3 --json "$t.json" ;;
    vl3b-reuse)
      run_table "$t" "$kamera" bench reuse --model "$vl3b" --chunk-tokens 256 --chunks 2 --question-tokens 32 \
        --rank 32 --pairs 5 --json "$t.json" ;;
    vl3b-session)
      run_table "$t" "$kamera" bench session --model "$vl3b" --observe screenshot --viewport 1280x720 --steps 20 \
        --window 768 --orders 2 --seed 7 --front 1 --out "$t" ;;
    eval)
      run_table "$t" "$kamera" eval --model smollm2-135m --tasks "$PWD/crates/kamera-eval/tasks/default.jsonl" \
        --split heldout --no-diagnostics \
        --methods full,prefix,blind,runtime,recall:runtime,recall-foreign:runtime,kvq:0.096,kvq-deficit:0.096 \
        --json eval.json --report eval-report.md ;;
  esac
done
echo "bench-all: results in $out (INDEX.md)" >&2
