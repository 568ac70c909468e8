#!/usr/bin/env bash
# Regenerate constraints.txt from a fresh virtual environment with the CPU extra and tests.
# Review the diff, run the test suite and `parity run`, then commit.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q -e '.[cpu,test]' torch==2.13.0
{
  echo "# One tested set of versions that install together on Python 3.11 (CPU)."
  echo "# Regenerate with scripts/refresh_constraints.sh. GPU-only pins at the end are"
  echo "# used by the 'gpu' extra only: onnxruntime and onnxruntime-gpu are never installed together."
  "$work/venv/bin/pip" freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$/torch==\1/'
  grep -E '^(onnxruntime-gpu|tensorrt|cuda-python|tensorflow)==' constraints.txt
} > constraints.txt.new
mv constraints.txt.new constraints.txt
rm -rf "$work"
echo "constraints.txt updated"
