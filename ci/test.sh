#!/usr/bin/env bash
# Install zeropilot with its test dependencies (pinned) and run the test suite; arguments go to pytest.
# This is the README's test command; .ci/run calls it too. Outside a virtual environment it makes (or reuses) .venv
# in the repository root, so that it never installs into a system Python (Debian's refuses: externally-managed-
# environment) and so that the README's first command and this one share one environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"  # what `activate` does: tests call `deepspeed`
    PYTHON="$VIRTUAL_ENV/bin/python"
fi
# torch's CPU build, by name: PyPI's torch for Linux x86-64 is the CUDA build (GBs of nvidia-* wheels). The package
# sources pip is configured with come first (a mirror or a wheel folder may hold it); PyTorch's CPU index, where it
# is published, only when they do not have it (without the constraints there: that index holds torch's dependencies
# but may lack a pinned version of one; the next install brings them to the pins).
TORCH_CPU=torch==2.13.0+cpu
if ! "$PYTHON" -m pip install -q -c ci/constraints.txt "$TORCH_CPU" 2>/dev/null; then
    echo "ci/test.sh: $TORCH_CPU is not on the configured package sources; taking it from PyTorch's CPU index" >&2
    "$PYTHON" -m pip install -q --index-url https://download.pytorch.org/whl/cpu "$TORCH_CPU"
fi
"$PYTHON" -m pip install -q -c ci/constraints.txt -e ".[test]"
# The report's browser test opens its pages in Debian's headless Chromium.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null \
        || echo "ci/test.sh: could not install chromium; the report's browser test will fail" >&2
fi
export DS_ACCELERATOR=cpu
# Two workers, whole files to each (a module's jobs run once; jobs several files share run once in the whole run:
# tests/once.py): most of the suite's time is multi-rank jobs that wait (watchdog deadlines, sleeps, rendezvous) on
# a 2-core machine. Files are handed out in the order tests/conftest.py sorts them (those with slow tests first), the
# next to whichever worker is free. `-n 0` after it runs everything in one process. --durations: where the time goes.
"$PYTHON" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
