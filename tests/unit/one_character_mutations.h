// One-character mutations of a text, for tests that compare two readers of the same format
// (a fast reader of the form gpulock writes against the full JSON parser): every position
// replaced by, and preceded by, each of a set of pieces chosen to break or bend JSON.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace test_support {

// Calls `check(mutated)` for each mutation of `base`.
template <typename Check>
void ForEachOneCharacterMutation(std::string_view base, Check&& check) {
  static const std::vector<std::string> kPieces = {
      "",  "\"", "\\", "0",    "1",    "9",  "-",   ".",    "e",     "+",    " ", ",", "}", "]",
      "{", ":",  "x",  "\x80", "\x1f", "00", "1.5", "null", "\"a\"", "true", "f", "[", "\n"};
  for (std::size_t i = 0; i <= base.size(); ++i) {
    for (const std::string& piece : kPieces) {
      for (const bool replace : {true, false}) {
        if (replace && i == base.size()) continue;
        std::string mutated(base);
        mutated.replace(i, replace ? 1 : 0, piece);
        check(mutated);
      }
    }
  }
}

}  // namespace test_support
