#!/usr/bin/env bash
# The Scaper 1.6.5 peer environment (.venv-scaper/) for the Scaper interoperability tests and
# `sedsynth bench mix`. Scaper needs numpy<2 and libsox, so it lives apart from .venv:
#
#   bash configs/scaper-env.sh
#
# Installs sox and libsox-dev with apt-get when they are missing (needs root), then the pins in
# configs/scaper-peer.txt. Without this environment the Scaper tests are skipped, with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! dpkg -s libsox-dev >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq sox libsox-dev >/dev/null
fi
[ -x .venv-scaper/bin/python ] || python3 -m venv .venv-scaper
.venv-scaper/bin/pip install -q -r configs/scaper-peer.txt
.venv-scaper/bin/python -c "import scaper; print('scaper', scaper.__version__, 'in .venv-scaper')"
