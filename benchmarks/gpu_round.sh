#!/usr/bin/env bash
# One round on a CUDA machine, from the repository root, with tecc and TVM importable
# (PYTHONPATH): `tests` runs the CUDA, GPU-tuning, GPU-reduction and GPU-injective
# tests against torch on the GPU, `bench ARGS` runs benchmarks/e2e_gpu.py with ARGS,
# `gemm` the matmul template's tiles, `winograd` Winograd against the direct conv per
# layer, `reduce` and `injective` the row-reduction and injective templates against
# dlight and torch,
# `attention ARGS` the fused attention against the unfused chain and torch's SDPA,
# `efficiency ARGS` benchmarks/tuner_efficiency.py --target cuda, `tune RECORDS
# MODEL:TRIALS...` tunes each model for cuda into RECORDS (a copy goes to $OUT after
# each). Logs and results go to $OUT when it is set. `bench` merges its rows into the
# checkout's results/e2e_gpu.json, or the --output NAME given for another GPU (and a
# copy left in $OUT by the same call): copy a call's e2e_gpu*.json and records from $OUT
# into the checkout before the next call sends it, or the next bench writes its table
# over the older rows.
# torch.compile's caches (max-autotune's kernel choices among them) live in
# TORCHINDUCTOR_CACHE_DIR: `bench` restores them from .gpu/inductor/ (the files a
# previous bench left in $OUT as inductor_cache.tar.xz.part*, carried back) and packs
# them into $OUT after the run, also one cut by BENCH_TIMEOUT, so that a compile
# longer than one call (max-autotune over MobileNetV2's convs) goes on where it stopped
# on the next call on the same kind of GPU and torch; a detached bench's cache, and a
# detached efficiency round's curves (MetaSchedule's so far), come back with each
# `collect` while it runs. `detach ROUND ARGS` starts a round that outlives the call
# (longer than one call allows), `collect [WAIT_S]` waits for it (540 s by default) and
# copies what it wrote to $OUT.
set -o pipefail
OUT=${OUT:-/tmp/tecc-gpu-round}
DETACHED=${DETACHED:-/tmp/tecc-detached}
# torch.compile's cache: a bench fills it, a collect packs a detached bench's
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/tecc-inductor-cache}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee -a "$OUT/device.txt"
pack_inductor_cache() {  # CACHE_DIR OUT
  # 15 MiB parts: a file coming back from the device may hold 16 MiB
  [ -d "$1" ] || return 0
  rm -f "$2"/inductor_cache.tar.xz.part*
  tar c -C "$1" . | xz -T0 | split -b 15M -d - "$2/inductor_cache.tar.xz.part"
  echo "inductor cache: $(cat "$2"/inductor_cache.tar.xz.part* | wc -c) bytes packed"
}
case "${1:-}" in
  tests)
    shift
    # From outside the checkout, the checkout appended to sys.path: its tecc/ folder
    # must not shadow the installed tecc package (whose stages live in other folders).
    root=$PWD
    (cd /tmp && python3 -m pytest -q -p no:cacheprovider --import-mode=append --timeout=600 \
      "$root/tests/test_cuda.py" "$root/tests/test_gpu_tuning.py" "$root/tests/test_gpu_reduce.py" \
      "$root/tests/test_gpu_injective.py" "$root/tests/test_gpu_attention.py" \
      "$@") 2>&1 | tee "$OUT/tests.log";;
  bench)
    shift
    cp "$OUT"/e2e_gpu*.json benchmarks/results/ 2>/dev/null
    mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
    if ls .gpu/inductor/inductor_cache.tar.xz.part* >/dev/null 2>&1; then
      cat .gpu/inductor/inductor_cache.tar.xz.part* | tar xJ -C "$TORCHINDUCTOR_CACHE_DIR" \
        && echo "restored the inductor cache ($(du -sh "$TORCHINDUCTOR_CACHE_DIR" | cut -f1))"
    fi
    timeout "${BENCH_TIMEOUT:-3000}" python3 benchmarks/e2e_gpu.py "$@" 2>&1 | tee "$OUT/bench.log"
    cp benchmarks/results/e2e_gpu*.md benchmarks/results/e2e_gpu*.json "$OUT/"
    pack_inductor_cache "$TORCHINDUCTOR_CACHE_DIR" "$OUT";;
  gemm)
    shift
    python3 benchmarks/gpu_gemm_configs.py "$@" 2>&1 | tee "$OUT/gemm_configs.log"
    cp benchmarks/results/gpu_gemm_configs.md "$OUT/";;
  winograd)
    shift
    python3 benchmarks/gpu_winograd.py "$@" 2>&1 | tee "$OUT/winograd.log"
    cp benchmarks/results/gpu_winograd.md "$OUT/";;
  injective)
    shift
    python3 benchmarks/gpu_injective.py "$@" 2>&1 | tee "$OUT/gpu_injective.log"
    cp benchmarks/results/gpu_injective.md "$OUT/";;
  attention)
    shift
    python3 benchmarks/gpu_attention.py "$@" 2>&1 | tee "$OUT/gpu_attention.log"
    cp benchmarks/results/gpu_attention.md "$OUT/";;
  reduce)
    shift
    python3 benchmarks/gpu_reduce.py "$@" 2>&1 | tee "$OUT/gpu_reduce.log"
    cp benchmarks/results/gpu_reduce.md "$OUT/";;
  efficiency)
    shift
    timeout "${BENCH_TIMEOUT:-3000}" python3 benchmarks/tuner_efficiency.py --target cuda "$@" \
      2>&1 | tee -a "$OUT/efficiency.log"
    cp benchmarks/results/tuner_efficiency_cuda* "$OUT/";;
  tune)
    shift
    records=$1; shift
    for spec in "$@"; do
      model=${spec%%:*}; trials=${spec##*:}
      echo "== tune $model $trials trials" | tee -a "$OUT/tune.log"
      start=$(date +%s)
      # from /tmp with the checkout after the installed tecc (see tests)
      (root=$PWD; cd /tmp && PYTHONPATH="$PYTHONPATH:$root" timeout "${TUNE_TIMEOUT:-3000}" \
        python3 -m tecc.cli tune \
        "benchmarks.models_factory:$model" --target cuda --records "$root/$records" \
        --trials "$trials") 2>&1 | tr '\r' '\n' | grep -v "trial/s\]$" | tee -a "$OUT/tune.log"
      echo "== $model: $(( $(date +%s) - start )) s" | tee -a "$OUT/tune.log"
      cp "$records" "$OUT/"
    done;;
  detach)
    # A round longer than one call (MetaSchedule's 192 trials on a 4096^3 GEMM take about
    # 20 minutes): the rest of the line runs as a round in its own process session, which
    # outlives the call while the machine is held (keep it held with `collect` calls),
    # from a copy of the checkout (a later call may replace the checkout), with its OUT
    # in $DETACHED; `collect` waits for it and brings its files back.
    shift
    if [ -d "$DETACHED" ] && [ ! -f "$DETACHED/exit_code" ]; then
      echo "a detached round is still running in $DETACHED: collect it first" >&2; exit 2
    fi
    rm -rf "$DETACHED" && mkdir -p "$DETACHED/out" "$DETACHED/repo"
    echo "${1:-}" > "$DETACHED/round_name"
    tar cf - --exclude=./.gpu/p1 --exclude=./.gpu/p2 --exclude=./.git --exclude=./.venv . \
      | tar xf - -C "$DETACHED/repo"
    # every descriptor of this call redirected and no shell left between: a process
    # holding the call's output open would keep the call from returning
    (cd "$DETACHED/repo" && OUT="$DETACHED/out" DETACHED="$DETACHED" exec setsid nohup bash -c \
      'bash benchmarks/gpu_round.sh "$@"; echo $? > "$DETACHED/exit_code"' _ "$@") \
      > "$DETACHED/round.log" 2>&1 < /dev/null &
    echo "detached: gpu_round.sh $*; collect with: gpu_round.sh collect [WAIT_S]";;
  collect)
    shift
    wait_s=${1:-540}
    [ -d "$DETACHED" ] || { echo "nothing detached on this machine" >&2; exit 2; }
    for ((waited = 0; waited < wait_s; waited += 5)); do
      [ -f "$DETACHED/exit_code" ] && break
      sleep 5
    done
    tail -n 20 "$DETACHED/round.log"
    cp "$DETACHED/round.log" "$DETACHED"/out/* "$OUT/" 2>/dev/null
    if [ -f "$DETACHED/exit_code" ]; then
      echo "detached round finished, exit $(cat "$DETACHED/exit_code")"
    else
      echo "detached round still running (collect again within the machine's idle time)"
      # a machine can be taken back mid-round: what the round has done so far comes
      # back with each collect (a bench's torch.compile cache, for the next machine to
      # go on from)
      case "$(cat "$DETACHED/round_name")" in
        bench) pack_inductor_cache "$TORCHINDUCTOR_CACHE_DIR" "$OUT";;
        # MetaSchedule's curve so far (stored every 30 s): `--report --trials N` shows it
        efficiency) cp "$DETACHED"/repo/benchmarks/results/tuner_efficiency_cuda*_curves.json \
          "$OUT/" 2>/dev/null;;
      esac
    fi;;
  *) echo "usage: gpu_round.sh tests [pytest args] | bench [e2e_gpu args] | gemm [args] |" \
          "reduce [args] | injective [args] | attention [args] | winograd [args] |" \
          "efficiency [args] | tune RECORDS MODEL:TRIALS... | detach ROUND ARGS... |" \
          "collect [WAIT_S]" >&2
     exit 2;;
esac
