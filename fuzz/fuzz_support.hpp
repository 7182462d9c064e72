// Shared by the fuzz harnesses: a check that reports a divergence and aborts
// (libFuzzer then saves the input as a crash), and an operation counter that
// each harness bumps once per decoded operation and prints when the process
// exits, so a run reports how many operations it executed, not only inputs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace fuzz {

// Operations executed by this process (all inputs, including corpus replays).
inline std::uint64_t& operations() {
  static std::uint64_t n = 0;
  return n;
}

// Prints the operation count at exit; one instance per harness.
struct OperationReport {
  const char* name;
  ~OperationReport() {
    std::fprintf(stderr, "%s: %llu operations\n", name,
                 static_cast<unsigned long long>(operations()));
  }
};

[[noreturn]] inline void fail(const char* what, const char* file, int line) {
  std::fprintf(stderr, "divergence: %s (%s:%d) after %llu operations\n", what, file, line,
               static_cast<unsigned long long>(operations()));
  std::abort();
}

}  // namespace fuzz

// Aborts with the failed condition when `cond` is false (divergence from the model).
#define FUZZ_CHECK(cond) ((cond) ? static_cast<void>(0) : ::fuzz::fail(#cond, __FILE__, __LINE__))
