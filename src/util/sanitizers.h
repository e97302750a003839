// Which sanitizer a build runs under, where code or tests must act differently (GCC defines
// __SANITIZE_THREAD__; clang answers __has_feature).
#pragma once

#if defined(__SANITIZE_THREAD__)
#define GPULOCK_UNDER_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GPULOCK_UNDER_THREAD_SANITIZER 1
#endif
#endif

namespace gpulock {

#if defined(GPULOCK_UNDER_THREAD_SANITIZER)
inline constexpr bool kUnderThreadSanitizer = true;
#else
inline constexpr bool kUnderThreadSanitizer = false;
#endif

}  // namespace gpulock
