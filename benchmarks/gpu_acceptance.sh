#!/usr/bin/env bash
# The GPU acceptance run (benchmarks/gpu_acceptance.py): within 8 minutes on one GPU. On the
# device machine, from the project's root, after `pip install --no-deps --no-build-isolation -e .`:
#   bash benchmarks/gpu_acceptance.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 480 python3 benchmarks/gpu_acceptance.py --device cuda --parallel 4 --timeout 100 "$@"
