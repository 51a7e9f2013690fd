#!/bin/sh
# CMake compiler launcher used while building Horovod (see tools/horovod_wheel.py).
#
# Horovod 0.28.1 pins its PyTorch extension to C++14 (`set(CMAKE_CXX_STANDARD 14)` in
# horovod/torch/CMakeLists.txt), but PyTorch >= 2.1 headers refuse anything older than
# C++17 and torch 2.14 wants C++20. CMake hands every compile command to this script
# (CMAKE_CXX_COMPILER_LAUNCHER), which swaps the C++14 flag for the standard named in
# HVDCLS_CXX_STD and runs the real compiler. Targets that already ask for 17 (TensorFlow,
# Gloo) are left alone. This lifts the standard without patching Horovod's sources.
set -eu
std="${HVDCLS_CXX_STD:?HVDCLS_CXX_STD must name a C++ standard, e.g. 20}"
compiler="$1"
shift
for arg in "$@"; do
    shift
    case "$arg" in
        -std=gnu++14 | -std=gnu++1y) arg="-std=gnu++$std" ;;
        -std=c++14 | -std=c++1y) arg="-std=c++$std" ;;
    esac
    set -- "$@" "$arg"
done
exec "$compiler" "$@"
