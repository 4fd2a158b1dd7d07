#!/usr/bin/env bash
# What CI runs on a clean clone: the project's own tests (./tdc installs, builds, then runs CTest,
# including the numeric suites again under ATEN_CPU_CAPABILITY=default).
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./tdc test "$@"
