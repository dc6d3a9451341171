#!/usr/bin/env bash
# Install zeropilot with its test dependencies (pinned) and run the test suite.
# This is the README's test command; .ci/run calls it too.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -c ci/constraints.txt torch==2.13.0
python -m pip install -q -c ci/constraints.txt -e ".[test]"
# The report's browser test opens its pages in Debian's headless Chromium.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null \
        || echo "ci/test.sh: could not install chromium; the report's browser test will fail" >&2
fi
export DS_ACCELERATOR=cpu
python -m pytest -q -p no:cacheprovider --durations=25 "$@"  # the slowest: where the suite's time goes
