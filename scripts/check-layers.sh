#!/usr/bin/env bash
# Checks that every folder of src/gradscope/ includes only the folders docs/architecture.md
# allows it (the layers, from the ground up). Prints each include against the order and
# exits 1 if there is one; exits 0 when the layout is one-way.
#   scripts/check-layers.sh [SOURCE_ROOT]   (default: the repository's src/gradscope)
set -euo pipefail

root="${1:-$(cd "$(dirname "$0")/.." && pwd)/src/gradscope}"
[ -d "$root" ] || { echo "check-layers: no folder $root" >&2; exit 2; }

# folder -> the folders it may include (itself always).
declare -A allowed=(
  [core]=""
  [data]="core"
  [models]="core models/common"
  [models/common]="core"
  [measure]="core models/common"
  [optim]="core"
  [comm]="core"
  [strategy]="core models models/common optim comm"
  [train]="core data models models/common measure optim strategy comm"
  [store]="core"
  [report]="core store"
  [sweep]="core data models models/common measure optim strategy comm train store"
  [cli]="core data models models/common measure optim strategy comm train store report sweep"
)

bad=0
while IFS= read -r -d '' file; do
  rel="${file#"$root"/}"
  folder="${rel%/*}"
  [ "$folder" = "$rel" ] && continue  # pch.h and other top-level files
  [ -n "${allowed[$folder]+set}" ] || { echo "check-layers: $rel is in no layer" >&2; bad=1; continue; }
  while IFS= read -r target; do
    [ -z "$target" ] && continue
    [ "$target" = "$folder" ] && continue
    case " ${allowed[$folder]} " in
      *" $target "*) ;;
      *) echo "$rel includes gradscope/$target/, which $folder/ may not include"; bad=1 ;;
    esac
  done < <(grep -oE '^#include "gradscope/[a-z_]+(/common)?/' "$file" |
           sed -E 's|^#include "gradscope/||; s|/$||' | sort -u)
done < <(find "$root" -name '*.h' -print0 -o -name '*.cpp' -print0)

if [ "$bad" -ne 0 ]; then
  echo "check-layers: includes against the layer order (docs/architecture.md)" >&2
  exit 1
fi
echo "check-layers: every include follows the layer order"
