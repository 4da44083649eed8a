#!/usr/bin/env bash
# Make the working tree small enough to send to a remote GPU machine, and put it back.
#
#   benches/device_tree.sh out    # move the ptx_cache files only sm_80 variants use to
#                                 # $DEVICE_TREE_STASH (default /tmp/tritonrt_sm80)
#   benches/device_tree.sh back   # move them back
#   benches/device_tree.sh pack   # when even the sm_90 files are too many: the whole
#                                 # ptx_cache as .carry/ptx_cache.tar.xz (name .carry/ in
#                                 # `carry`; unpack there with `tar xJf .carry/ptx_cache.tar.xz`)
#                                 # and every file but the manifest moved to the stash
#   benches/device_tree.sh unpack # move them back
#
# An sm_90 GPU (H100, H200) never reads the sm_80 PTX: the runtime loads the variants of
# the newest arch it runs (ARCHITECTURE.md, "Caches and the launch ABI"), and the artifact
# store checks only the files it reads. `tritonrt verify` and `warmup --all` do read them:
# run those with the files in place. Never commit while the files are out (git would
# record them as deleted); `back` says so if any is still missing.
set -euo pipefail
cd "$(dirname "$0")/.."
STASH="${DEVICE_TREE_STASH:-/tmp/tritonrt_sm80}"
case "${1:-}" in
out)
  mkdir -p "$STASH"
  python3 - "$STASH" <<'PY'
import json, os, shutil, sys
stash = sys.argv[1]
variants = json.load(open("ptx_cache/manifest.json"))["variants"]
used = {80: set(), "other": set()}
for v in variants:
    for kind in ("ptx", "cubin"):
        if kind in v:
            used[80 if v.get("arch") == 80 else "other"].add(v[kind]["file"])
moved = 0
for f in sorted(used[80] - used["other"]):
    if os.path.exists(f"ptx_cache/{f}"):
        shutil.move(f"ptx_cache/{f}", f"{stash}/{f}")
        moved += 1
print(f"moved {moved} sm_80-only files to {stash}")
PY
  ;;
back)
  n=0
  for f in "$STASH"/*; do
    [ -e "$f" ] || continue
    mv "$f" ptx_cache/
    n=$((n + 1))
  done
  echo "restored $n files"
  missing=$(git status --porcelain ptx_cache | grep -c '^ D' || true)
  [ "$missing" = 0 ] || echo "note: $missing tracked ptx_cache files are not in the working tree (stale after a rebuild, or still moved out: see git status ptx_cache)" >&2
  ;;
pack)
  mkdir -p .carry "$STASH/all"
  tar cf - ptx_cache | xz -6 -T2 > .carry/ptx_cache.tar.xz.part
  mv .carry/ptx_cache.tar.xz.part .carry/ptx_cache.tar.xz
  find ptx_cache -maxdepth 1 -type f ! -name manifest.json -exec mv -t "$STASH/all" {} +
  echo "packed ptx_cache into .carry/ptx_cache.tar.xz ($(du -h .carry/ptx_cache.tar.xz | cut -f1)); files moved to $STASH/all"
  ;;
unpack)
  n=$(find "$STASH/all" -maxdepth 1 -type f | wc -l)
  find "$STASH/all" -maxdepth 1 -type f -exec mv -t ptx_cache {} +
  echo "restored $n files"
  missing=$(git status --porcelain ptx_cache | grep -c '^ D' || true)
  [ "$missing" = 0 ] || echo "note: $missing tracked ptx_cache files are not in the working tree" >&2
  ;;
*)
  echo "usage: $0 out|back|pack|unpack" >&2
  exit 2
  ;;
esac
