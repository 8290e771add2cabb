#!/usr/bin/env bash
# One entry point for a fresh machine: creates the pinned environment in .venv, then
#   bash dev.sh demo   -> packs the embedded default model, reloads it, checks every bit, generates
#   bash dev.sh test   -> the default test suite (what CI runs)
#   bash dev.sh setup  -> only the environment
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

setup() {
    local stamp=.venv/.glyd-stamp want
    want=$(cat requirements/dev.txt requirements/data.txt pyproject.toml | sha256sum | cut -d' ' -f1)
    if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    echo "dev.sh: creating the pinned environment in .venv (first run only)" >&2
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements/dev.txt
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements/data.txt
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
    echo "$want" > "$stamp"
}

cmd=${1:-demo}
shift || true
case "$cmd" in
    setup) setup ;;
    demo) setup; exec .venv/bin/glyd demo "$@" ;;
    test)
        setup
        # pytest exits 5 when it collects nothing: that is a failure here too. One pytest-xdist worker a core
        # (2 on CI: 8 min 53 s against 16 min 45 s in one process, 2026-12-06); -n 0 after it runs one process.
        exec .venv/bin/python -m pytest -q -n auto --dist worksteal "$@" ;;
    *) echo "usage: bash dev.sh [setup|demo|test] [args...]" >&2; exit 2 ;;
esac
