#!/usr/bin/env bash
# Download (or, for the few published only as source, build) the wheels listed in
# benchmarks/gpu_wheels.txt for CPython 3.12 on x86-64 Linux, into DIR, for a GPU machine with
# no network:  benchmarks/gpu_wheels.sh DIR  (about 21 MB)
set -eu
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
DIR=$1
mkdir -p "$DIR"
PLATFORMS=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_31 manylinux_2_34; do
    PLATFORMS+=(--platform "${p}_x86_64")
done
grep -v '^#' "$(dirname "$0")/gpu_wheels.txt" | while read -r req; do
    [ -n "$req" ] || continue
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d "$DIR" "$req" 2>/dev/null \
    || python3 -m pip wheel -q --no-deps -w "$DIR" "$req"  # source only, pure Python: built here
done
ls "$DIR" | wc -l
