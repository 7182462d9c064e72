// What the comparison programs read from the C library and the kernel beside their
// timings (glibc's heap statistics and trimming, getrusage's page faults), behind
// functions that do nothing or return 0 where the platform lacks them. The programs
// themselves then have no conditional compilation, and build in the bench group.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <sys/resource.h>
#endif

namespace promptcache_bench {

/// Bytes the heap has handed out, mmapped chunks not included (glibc: mallinfo2().uordblks).
inline std::size_t heap_in_use() noexcept {
#if defined(__GLIBC__)
  return mallinfo2().uordblks;
#else
  return 0;
#endif
}

/// Bytes the heap has handed out, mmapped chunks included (a long context's block may be one).
inline std::size_t heap_with_mmap() noexcept {
#if defined(__GLIBC__)
  const auto m = mallinfo2();
  return m.uordblks + m.hblkhd;
#else
  return 0;
#endif
}

/// Hands freed heap memory back to the system (glibc: malloc_trim(0)).
inline void trim_heap() noexcept {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

/// Keeps freed memory in the process and blocks up to 32 MiB on the heap (glibc: mallopt),
/// so that a timed call does not fault in pages the allocator gave back after an earlier one.
inline void keep_freed_memory() noexcept {
#if defined(__GLIBC__)
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
#endif
}

/// Minor page faults of this process so far (getrusage).
inline std::uint64_t minor_faults() noexcept {
#if defined(__unix__) || defined(__APPLE__)
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0) return static_cast<std::uint64_t>(u.ru_minflt);
#endif
  return 0;
}

}  // namespace promptcache_bench
