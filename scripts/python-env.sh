#!/usr/bin/env bash
# Creates the project's own Python environment and installs the pinned packages into it; the
# system's Python is never changed. Idempotent: an environment whose requirements have not
# changed since it was made costs a second.
#   scripts/python-env.sh DIR REQUIREMENTS    e.g. .venv requirements.txt
# The Python is the first 3.11 found ($PYTHON, python3.11, python3): PyTorch's wheels here are
# built for it, and Debian 13's own python3 is 3.13.
set -euo pipefail
dir=${1:?usage: python-env.sh DIR REQUIREMENTS}
req=${2:?usage: python-env.sh DIR REQUIREMENTS}
[ -f "$req" ] || { echo "python-env: no requirements file $req" >&2; exit 2; }

stamp="$dir/.requirements"
if [ -x "$dir/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  exit 0  # (not touched: a build configured after it stays configured)
fi

python=""
candidates=(python3.11 python3)
[ -n "${PYTHON:-}" ] && candidates=("$PYTHON" "${candidates[@]}")
for candidate in "${candidates[@]}"; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = 3.11 ]; then
    python=$(command -v "$candidate")
    break
  fi
done
if [ -z "$python" ]; then
  echo "python-env: no Python 3.11 on PATH (PyTorch's wheels are installed for 3.11); set PYTHON=/path/to/python3.11" >&2
  exit 2
fi

start=$(date +%s)
echo "python-env: $dir with $python, packages from $req"
if [ ! -x "$dir/bin/python" ]; then
  "$python" -m venv "$dir"
fi
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
cp "$req" "$stamp"
echo "python-env: done in $(( $(date +%s) - start )) s"
