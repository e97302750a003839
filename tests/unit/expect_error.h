// ExpectError: a test helper that runs a call expected to throw gpulock::Error of one code.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "gpulock/error.hpp"

namespace gpulock {

// Expects f to throw Error(code) whose message contains `words`; returns the message ("" when
// nothing was thrown).
template <typename F>
std::string ExpectError(F&& f, ErrorCode code, const std::string& words = "") {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << error_code_name(code);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error_code_name(error.code()) << ": " << error.what();
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
    return error.what();
  }
  return "";
}

}  // namespace gpulock
