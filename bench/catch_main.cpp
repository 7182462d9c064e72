// Catch2 2 main with benchmarking enabled (see bench/CMakeLists.txt, which also
// defines CATCH_CONFIG_ENABLE_BENCHMARKING for every benchmark).
#define CATCH_CONFIG_MAIN
#ifndef CATCH_CONFIG_ENABLE_BENCHMARKING
#define CATCH_CONFIG_ENABLE_BENCHMARKING
#endif
#include <catch2/catch.hpp>
