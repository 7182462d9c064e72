// Replaces the global allocation functions of one test executable with ones
// that count every allocation and can be armed to make the k-th one throw
// std::bad_alloc. Include it from exactly one translation unit per executable.
//
//   test_alloc::count      allocations so far (only successful ones count)
//   test_alloc::countdown  -1: disarmed; k >= 0: the allocation after the next
//                          k succeeds throws (then it disarms itself)
//   test_alloc::replacement_active()  whether these functions (plain and aligned) are in use
#pragma once

#include <cstddef>
#include <cstdlib>
#include <limits>
#include <new>

// GCC sees the malloc/free pair through the replaced operators and warns about
// a mismatch that is exactly the point of the replacement.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace test_alloc {

inline long countdown = -1;
inline long count = 0;

inline void* allocate(std::size_t n) {
  if (countdown == 0) {
    countdown = -1;
    throw std::bad_alloc();
  }
  if (countdown > 0) --countdown;
  ++count;
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

inline void* allocate_nothrow(std::size_t n) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}

// Over-aligned types (alignas above the default new alignment) come through the
// align_val_t forms: they count and fail like the others. aligned_alloc wants a size that
// is a multiple of the alignment; the memory is released with free() like malloc's.
inline void* allocate_aligned(std::size_t n, std::align_val_t al) {
  if (countdown == 0) {
    countdown = -1;
    throw std::bad_alloc();
  }
  if (countdown > 0) --countdown;
  ++count;
  const auto a = static_cast<std::size_t>(al);
  // Rounding up would wrap past SIZE_MAX to a tiny block: no such size can be allocated.
  if (n > std::numeric_limits<std::size_t>::max() - (a - 1)) throw std::bad_alloc();
  const std::size_t size = n == 0 ? a : (n + a - 1) / a * a;
  void* p = std::aligned_alloc(a, size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

inline void* allocate_aligned_nothrow(std::size_t n, std::align_val_t al) noexcept {
  try {
    return allocate_aligned(n, al);
  } catch (...) {
    return nullptr;
  }
}

}  // namespace test_alloc

// Every form, aligned ones included, so the sanitizers' own operators never pair with ours.
void* operator new(std::size_t n) {
  return test_alloc::allocate(n);
}
void* operator new[](std::size_t n) {
  return test_alloc::allocate(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return test_alloc::allocate_nothrow(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return test_alloc::allocate_nothrow(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void* operator new(std::size_t n, std::align_val_t al) {
  return test_alloc::allocate_aligned(n, al);
}
void* operator new[](std::size_t n, std::align_val_t al) {
  return test_alloc::allocate_aligned(n, al);
}
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return test_alloc::allocate_aligned_nothrow(n, al);
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return test_alloc::allocate_aligned_nothrow(n, al);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace test_alloc {

// One direct call of the allocation function must count once, plain and aligned. (A
// new-expression would not do: clang at -O2 removes a new/delete pair whose result is unused.)
inline bool replacement_active() {
  const long before = count;
  void* p = ::operator new(sizeof(int));
  ::operator delete(p);
  constexpr auto al = std::align_val_t{2 * __STDCPP_DEFAULT_NEW_ALIGNMENT__};
  void* q = ::operator new(sizeof(int), al);
  ::operator delete(q, al);
  return count == before + 2;
}

}  // namespace test_alloc
