#!/usr/bin/env bash
# System packages mneme needs on Debian 12: clang-22 (the CUDA compiler behind `mneme cc`) and
# PostgreSQL (the tests run a real server on loopback for Optuna's shared-study storage).
set -euo pipefail
need=()
command -v clang++-22 >/dev/null || need+=(clang-22)
command -v objcopy >/dev/null || need+=(binutils)
command -v cmake >/dev/null || need+=(cmake)   # docs/CC.md's CMake example is run by the docs test
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing system packages: ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
