#!/usr/bin/env bash
# Re-resolve configs/constraints.txt, the lock that both README commands install from:
#
#   bash configs/lock.sh
#
# It installs the project with its test extra into a throw-away virtual environment, with only
# torch pinned (TORCH_VERSION, default 2.13.0), and writes every version pip resolved. Then run
# `dvc repro` and commit the new lock together with the dvc.lock it produces: the data stages'
# bytes follow these versions.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q "torch==${TORCH_VERSION:-2.13.0}" -e ".[test]"
{
  echo "# The whole environment, pinned: pip install -c configs/constraints.txt -e \".[test]\""
  echo "# Written by 'bash configs/lock.sh' with $("$venv/bin/python" --version); do not edit by hand."
  echo "# torch is pinned without its local build tag, so the CPU wheel and CUDA builds both match."
  "$venv/bin/pip" freeze --all --exclude-editable | grep -v '^pip==' | sed -E 's/^(torch==[^+]*)\+.*/\1/'
} > configs/constraints.txt.tmp
mv configs/constraints.txt.tmp configs/constraints.txt
echo "configs/constraints.txt: $(grep -vc '^#' configs/constraints.txt) packages pinned"
