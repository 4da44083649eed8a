#!/usr/bin/env bash
# compute-sanitizer over every kernel path of the decode step and the prefill, on a GPU
# machine: memcheck, racecheck, synccheck and initcheck x each select path (pq_select,
# pq_hist, split, pq_index with pq_wfill, pq_index with companion fill) x shapes (a small
# one with GQA and the reference shape), plus bulk quantization (many new keys), the
# practical GQA bf16 shape (one and 4096 new keys), the short path, and the prefill's
# k-means kernels (member sums fused into the assignment, the separate sums kernel with
# ip, packed keys, prefill then decode).
# Each `tritonrt run` steps twice (plain launches, then graph capture and replay), each
# `tritonrt prefill` runs twice, and both check their answer against the CPU reference.
#
#   [SANITIZE_TOOLS="memcheck racecheck"] [SANITIZE_ONLY=REGEX] benches/sanitize.sh \
#       [TRITONRT_BINARY] [OUT_DIR]
#
# SANITIZE_ONLY keeps the cases whose name matches the extended regex.
#
# Prints one row per (tool, case): the run's check verdict and the sanitizer's summary;
# exits 1 when any run failed its check or any tool reported an error. Logs in OUT_DIR.
set -u
BIN="${1:-target/release/tritonrt}"
OUT="${2:-sanitize_out}"
mkdir -p "$OUT"
CS="${COMPUTE_SANITIZER:-compute-sanitizer}"
command -v "$CS" >/dev/null || { echo "error: $CS not found (CUDA toolkit)" >&2; exit 2; }

small="--seq-len 6000 --heads 8 --kv-heads 2 --steps 2"
ref="--seq-len 32000 --heads 32 --kv-heads 32 --steps 2"
cases=()
for p in chunked hist split index-wfill index-companion; do
  cases+=("$p small|run $small --select-path $p")
  cases+=("$p reference|run $ref --select-path $p")
done
cases+=("bulk quantize (1000 new keys)|run --seq-len 6000 --heads 8 --kv-heads 2 --steps 2 --n-cached 4700")
cases+=("short path|run --seq-len 300 --heads 8 --kv-heads 2 --steps 2")
cases+=("bf16 GQA small|run $small --dtype bf16 --weight-dtype bf16")
# the practical shape (B=1 H=32 H_kv=8 S=32768 bf16; heavy as the indexer takes it today)
cases+=("practical GQA bf16 (S=32768)|run --workload 1,32,8,32768,128 --dtype bf16 --weight-dtype bf16 --steps 2")
cases+=("4096 new keys, practical|run --workload 1,32,8,32768,128 --dtype bf16 --weight-dtype bf16 --n-cached 28544 --steps 2")
# ragged batches on the indexed path (the reference config's) and on the split path: one
# round of threshold CTAs (24 rows), and past one round on up to 160 SMs (160 rows:
# pq_rgthresh.r128)
cases+=("ragged, 24 rows|run --seq-lens 300,2500,6000 --heads 8 --kv-heads 2 --steps 2")
cases+=("ragged, 160 rows|run --seq-lens 600,1800,3000,900,2400 --heads 32 --kv-heads 8 --steps 2")
cases+=("ragged split, 24 rows|run --seq-lens 300,2500,6000 --heads 8 --kv-heads 2 --steps 2 --ragged-path split")
cases+=("ragged split, 160 rows|run --seq-lens 600,1800,3000,900,2400 --heads 32 --kv-heads 8 --steps 2 --ragged-path split")
pf="prefill --seq-len 2000 --kv-heads 2 --repeat 1"
cases+=("prefill fused sums (M2 b6 bf16)|$pf")
cases+=("prefill sums kernel (M4 b8 ip)|$pf --pq-group-factor 4 --pq-bits 8 --metric ip")
cases+=("prefill packed keys (D=80, fp32)|$pf --head-dim 80 --dtype fp32")
cases+=("prefill then decode|run --prefill $small")

fail=0
printf '%-10s %-34s %-8s %s\n' tool case check summary
for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
  extra=""
  [ "$tool" = racecheck ] && extra="--racecheck-report all"
  for c in "${cases[@]}"; do
    name="${c%%|*}"
    if [ -n "${SANITIZE_ONLY:-}" ] && ! echo "$name" | grep -Eq "$SANITIZE_ONLY"; then continue; fi
    args="${c#*|}"
    log="$OUT/${tool}_$(echo "$name" | tr -c 'a-zA-Z0-9' '_').log"
    # shellcheck disable=SC2086
    timeout 900 "$CS" --tool "$tool" $extra --error-exitcode 99 "$BIN" $args >"$log" 2>&1
    rc=$?
    # every `check:` line must pass (run --prefill prints one for each half)
    if grep -E '^check: ' "$log" | grep -q FAILED; then verdict=FAILED
    elif grep -E '^check: ' "$log" | grep -q PASSED; then verdict=PASSED
    else verdict=""; fi
    summary=$(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$log" | sed 's/^========= //')
    [ -z "$verdict" ] && verdict="none"
    if [ "$rc" != 0 ] || [ "$verdict" != PASSED ]; then fail=1; fi
    printf '%-10s %-34s %-8s %s (rc %s)\n' "$tool" "$name" "$verdict" "$summary" "$rc"
  done
done
exit $fail
