#!/usr/bin/env bash
# Install zeropilot with its test dependencies (pinned) and run the test suite.
# This is the README's test command; .ci/run calls it too.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -c ci/constraints.txt torch==2.13.0
python -m pip install -q -c ci/constraints.txt -e ".[test]"
export DS_ACCELERATOR=cpu
python -m pytest -q -p no:cacheprovider "$@"
