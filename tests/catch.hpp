// Includes Catch2 3 (vcpkg, Conan) or Catch2 2.13 (Debian) behind one name, so
// every test and benchmark builds with both. Only the macros both versions
// share are used; CATCH_CONFIG_ENABLE_BENCHMARKING (set for bench/ targets)
// also pulls in BENCHMARK.
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#if defined(CATCH_CONFIG_ENABLE_BENCHMARKING)
#include <catch2/benchmark/catch_benchmark.hpp>
#endif
#else
#include <catch2/catch.hpp>
#endif
