// Names and exit statuses of gpulock::ErrorCode.
#include "gpulock/error.hpp"

namespace gpulock {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kUnsatisfiable:
      return "unsatisfiable";
    case ErrorCode::kEnvironment:
      return "environment";
    case ErrorCode::kPermissionDenied:
      return "permission_denied";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kTimedOut:
      return "timed_out";
    case ErrorCode::kInterrupted:
      return "interrupted";
    case ErrorCode::kInternal:
      return "internal";
    case ErrorCode::kConfig:
      return "config";
  }
  return "internal";
}

int exit_status_for(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return 64;
    case ErrorCode::kUnsatisfiable:
    case ErrorCode::kEnvironment:
    case ErrorCode::kPermissionDenied:
    case ErrorCode::kNotFound:
      return 69;
    case ErrorCode::kTimedOut:
    case ErrorCode::kInterrupted:
      return 75;
    case ErrorCode::kInternal:
      return 70;
    case ErrorCode::kConfig:
      return 78;
  }
  return 70;
}

}  // namespace gpulock
