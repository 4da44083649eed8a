#!/usr/bin/env bash
# Coverage-guided fuzzing of tritonrt's parsers of outside bytes (fuzz/README.md): builds
# the fuzz/ crate's libFuzzer targets on stable Rust (SanitizerCoverage through -C
# passes/-C llvm-args, debug assertions and overflow checks on, no ASan: that needs
# nightly), then runs each target in turn for SECONDS (one fuzzer process at a time),
# starting from the committed seeds in fuzz/corpus/<target>/.
#
#   [FUZZ_TARGETS="manifest jit_entry"] [FUZZ_OUT=DIR] [FUZZ_NICE=10] \
#     benches/fuzz.sh [SECONDS_PER_TARGET (default 60)]
#
# Prints one row per target: executions, seconds, executions per second, inputs added
# to the working corpus, crashes. A crash is any panic or abort (libFuzzer's crash-*),
# an input running over 10 s (timeout-*) or the process over 2 GiB resident (oom-*);
# libFuzzer stops a target at its first one. Exits 1 when any target crashed (or its
# fuzzer failed), 2 on a build or setup error.
#
# Under FUZZ_OUT (default fuzz/work): corpus/<target>/ the working corpus (seeds are
# read, never written), artifacts/<target>/ the crashing inputs, logs/<target>.log.
# Reproduce one crash: fuzz/target/<host>/release/<target> <artifact file>.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

SECS="${1:-60}"
case "$SECS" in '' | *[!0-9]*)
  echo "usage: $0 [SECONDS_PER_TARGET]" >&2
  exit 2
  ;;
esac
ALL_TARGETS="manifest tuning_table ptx_header jit_entry safetensors_io triton_import"
TARGETS="${FUZZ_TARGETS:-$ALL_TARGETS}"
OUT="${FUZZ_OUT:-$ROOT/fuzz/work}"
NICE="${FUZZ_NICE:-10}"
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"

if ! command -v c++ >/dev/null && ! command -v g++ >/dev/null && ! command -v clang++ >/dev/null; then
  echo "error: no C++ compiler (c++, g++ or clang++): libfuzzer-sys builds libFuzzer from source" >&2
  exit 2
fi
HOST="$(rustc -vV | sed -n 's/^host: //p')"
# The fuzz crate's own target dir (its instrumented build never mixes with the main one).
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$ROOT/fuzz/target}"
# --target keeps these flags off build scripts and proc macros (as cargo-fuzz does).
# -Cpasses=sancov-module + the -sanitizer-coverage-* options: libFuzzer's coverage
# feedback (8-bit edge counters, PC table, comparison operands).
FUZZ_RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
echo "== building the fuzz targets (fuzz/, target $HOST, $CARGO_TARGET_DIR)"
t0=$(date +%s)
# shellcheck disable=SC2086
if ! (cd fuzz && RUSTFLAGS="$FUZZ_RUSTFLAGS" nice -n "$NICE" cargo build --locked --release \
  --target "$HOST" $(for t in $TARGETS; do echo --bin "$t"; done)); then
  echo "error: building the fuzz targets failed" >&2
  exit 2
fi
echo "   built in $(($(date +%s) - t0)) s"
BIN_DIR="$CARGO_TARGET_DIR/$HOST/release"

# The safetensors and Triton-import targets write their inputs to files: keep those in
# memory where possible, in one directory removed at the end.
TMP_BASE=/tmp
[ -d /dev/shm ] && [ -w /dev/shm ] && TMP_BASE=/dev/shm
FUZZ_TMP="$(mktemp -d "$TMP_BASE/tritonrt-fuzz.XXXXXX")" || exit 2
trap 'rm -rf "$FUZZ_TMP"' EXIT

stat_of() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }

rows=()
fail=0
for t in $TARGETS; do
  seeds="$ROOT/fuzz/corpus/$t"
  work="$OUT/corpus/$t"
  art="$OUT/artifacts/$t"
  log="$OUT/logs/$t.log"
  mkdir -p "$work" "$art" "$OUT/logs"
  [ -d "$seeds" ] || { echo "error: no seed corpus $seeds" >&2; exit 2; }
  before=$(find "$art" -type f | wc -l)
  echo "== $t: ${SECS} s (log $log)"
  t0=$(date +%s.%N)
  # The working corpus first (new inputs go there), the seeds read-only after it.
  TMPDIR="$FUZZ_TMP" nice -n "$NICE" "$BIN_DIR/$t" \
    -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$art/" -print_final_stats=1 \
    "$work" "$seeds" >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
  execs=$(stat_of number_of_executed_units "$log")
  [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  [ -n "$execs" ] || execs=0
  added=$(stat_of new_units_added "$log")
  rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? e / s : e) }')
  crashes=$(($(find "$art" -type f | wc -l) - before))
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    fail=1
    [ "$crashes" -eq 0 ] && crashes="? (rc $rc)"
    echo "   FAILED: see $log and $art/"
    grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written' "$log" | head -5 | sed 's/^/   /'
  fi
  rows+=("$(printf '%-16s %13s %8s %10s %7s %s' "$t" "$execs" "$secs" "$rate" "${added:-?}" "$crashes")")
done

echo
printf '%-16s %13s %8s %10s %7s %s\n' target executions seconds exec/s added crashes
for r in "${rows[@]}"; do echo "$r"; done
echo "(crash artifacts: $OUT/artifacts/<target>/; working corpora: $OUT/corpus/<target>/)"
exit "$fail"
