#!/bin/sh
# CMake compiler launcher used while building Horovod (see tools/horovod_wheel.py).
#
# 1. The C++ standard. Horovod 0.28.1 pins its PyTorch extension to C++14
#    (`set(CMAKE_CXX_STANDARD 14)` in horovod/torch/CMakeLists.txt), but PyTorch >= 2.1 headers
#    refuse anything older than C++17 and torch 2.14 wants C++20. This script swaps the C++14
#    flag for the standard named in HVDCLS_CXX_STD. Targets that already ask for 17
#    (TensorFlow, Gloo) are left alone.
# 2. Gloo's float16 sums. Horovod's bundled Gloo sums float16 (fp16 compression) with its
#    generic template, one scalar half-to-float conversion and back per element: an fp16
#    all-reduce takes 2.6-3.1x the time of a float32 one of twice the bytes
#    (docs/benchmarks.md, "Why Horovod's fp16 does not pay on CPU"). Gloo's F16C versions are
#    in gloo/math.cc, which that Gloo's CMake never compiles. Every compile gets
#    -DGLOO_USE_AVX=1 (so gloo/math.h declares the specialisations, in Gloo and in Horovod's
#    gloo_operations.cc alike), and the compile of gloo/types.cc, which every Gloo library
#    Horovod builds contains, takes math.cc in with it (-include), defining them. Horovod
#    already compiles everything with -mavx -mf16c -mfma (ARCH_FLAGS in its CMakeLists.txt).
# Both without patching Horovod's sources.
set -eu
std="${HVDCLS_CXX_STD:?HVDCLS_CXX_STD must name a C++ standard, e.g. 20}"
compiler="$1"
shift
gloo_math=""
for arg in "$@"; do
    shift
    case "$arg" in
        -std=gnu++14 | -std=gnu++1y) arg="-std=gnu++$std" ;;
        -std=c++14 | -std=c++1y) arg="-std=c++$std" ;;
        */gloo/types.cc) gloo_math="${arg%types.cc}math.cc" ;;
    esac
    set -- "$@" "$arg"
done
if [ -n "$gloo_math" ]; then
    set -- -include "$gloo_math" "$@"
fi
exec "$compiler" -DGLOO_USE_AVX=1 "$@"
