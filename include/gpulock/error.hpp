// gpulock::Error: the one exception type the library throws.
//
// Every failure carries an ErrorCode that says what kind of failure it is (and so which exit
// status the CLI reports) and a message for humans that says what happened and, where there is
// one, what to do about it.
#pragma once

#include <stdexcept>
#include <string>

namespace gpulock {

enum class ErrorCode {
  kInvalidArgument,   // the request or its input is malformed (CLI exit 64)
  kUnsatisfiable,     // can never be served as asked: too many GPUs, unknown GPU (exit 69)
  kEnvironment,       // the machine cannot serve it: no driver, unusable lock dir (exit 69)
  kPermissionDenied,  // e.g. releasing another user's lease (exit 69)
  kNotFound,          // e.g. no such lease (exit 69)
  kTimedOut,          // not served within the timeout, or at once with no-wait (exit 75)
  kInterrupted,       // the caller's interrupt check asked to stop waiting (exit 75)
  kInternal,          // a bug or an unexpected system failure (exit 70)
  kConfig,            // the administrator's config file is invalid or unreadable (exit 78)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// The name of a code, for logs and bindings ("invalid_argument", "timed_out", ...).
const char* error_code_name(ErrorCode code) noexcept;

// The CLI's exit status for a code (64, 69, 70, 75 or 78; see docs/cli.md).
int exit_status_for(ErrorCode code) noexcept;

}  // namespace gpulock
