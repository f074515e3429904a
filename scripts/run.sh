#!/usr/bin/env bash
# run.sh — the main job: installs what is missing, builds, and runs Deepwell's default job.
# Until the trainer lands, the default job is the hardware probe.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh build
scripts/build.sh build
./build/deepwell probe "$@"
