#!/usr/bin/env bash
# `make gpu-wheels`: fetch, on this machine (which reaches PyPI), the wheels the GPU machine's image lacks
# (bench/gpu_wheels.txt) for Python 3.12 on x86-64 Linux, at constraints.txt's versions, into .whl/ (ignored by git).
# The device has no network: this folder travels with the working tree (64 MiB in all), so it stays small and
# carries no torch or nvidia wheel (the image has torch).
set -euo pipefail
cd "$(dirname "$0")/.."

DEST="${GPU_WHEELS:-.whl}"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
# pip's find-links and extra indexes on this machine print a warning per package; hide that noise only.
quiet() { grep -v "is ignored: it is neither" || true; }

# "name==version" from constraints.txt; pip spells names with - or _ and any case, so compare them normalised.
pin() {
  local want line norm
  want=$(tr 'A-Z_.' 'a-z--' <<<"$1")
  while IFS= read -r line; do
    norm=$(tr 'A-Z_.' 'a-z--' <<<"${line%%==*}")
    if [[ "$norm" == "$want" ]]; then echo "$line"; return 0; fi
  done < <(grep -E '^[A-Za-z0-9._-]+==' constraints.txt)
  echo "gpu-wheels: $1 is not pinned in constraints.txt" >&2
  return 1
}

names=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' bench/gpu_wheels.txt | awk '{print $1}')
pins=()
for name in $names; do pins+=("$(pin "$name")"); done

# Into a fresh folder, swapped in at the end: a failed download never leaves a half-old, half-new set.
tmp="$DEST.partial"
rm -rf "$tmp" && mkdir -p "$tmp"

binary=()
for p in "${pins[@]}"; do [[ "$p" == deepspeed==* ]] || binary+=("$p"); done
# --no-deps: the list is the closure the image lacks; what the image has must not come along (torch above all).
# manylinux_2_28 as well: some current wheels (pandas, xxhash) are tagged for it only; torch's cu130 build needs it.
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d "$tmp" "${binary[@]}" 2>&1 | quiet
# DeepSpeed publishes an sdist only; without CUDA it builds a pure-Python wheel (py3-none-any) in seconds.
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$tmp" "$(pin deepspeed)" 2>&1 | quiet

count=$(ls "$tmp"/*.whl | wc -l)
expected=${#pins[@]}
if (( count != expected )); then
  echo "gpu-wheels: $count wheels in $tmp, expected $expected" >&2
  exit 1
fi
rm -rf "$DEST" && mv "$tmp" "$DEST"
ls -l "$DEST" | awk 'NR > 1 {printf "%10d  %s\n", $5, $9}'
echo "gpu-wheels: $count wheels, $(du -sh "$DEST" | cut -f1) in $DEST/ (Python 3.12, x86-64 Linux)"
