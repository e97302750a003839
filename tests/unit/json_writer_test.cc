// JsonWriter: the layout of nlohmann's dump(2), numbers as nlohmann writes them, strings escaped
// and ill-formed UTF-8 replaced, so that every document reads back as what was written.
#include "util/json_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

namespace gpulock {
namespace {

using nlohmann::json;

std::string Dump(const json& j) {
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string Written(double d) {
  std::string out;
  JsonWriter(out).value(d);
  return out;
}

std::string Written(const std::string& s) {
  std::string out;
  JsonWriter(out).value(s);
  return out;
}

TEST(JsonWriterTest, NestingAndEmptyContainersAreLaidOutAsNlohmannDumpsThem) {
  std::string out;
  JsonWriter w(out);
  w.begin_object();
  w.key("a");
  w.begin_array();
  w.value(1);
  w.begin_object();
  w.end_object();
  w.begin_array();
  w.end_array();
  w.begin_object();
  w.member("x", -5);
  w.null_member("y");
  w.end_object();
  w.end_array();
  w.member("b", true);
  w.member("c", std::optional<unsigned>{});
  w.member("d", std::vector<std::string>{"p", "q"});
  w.member("e", std::uint64_t{18446744073709551615ULL});
  w.end_object();
  const json expected = {
      {"a", json::array({1, json::object(), json::array(), {{"x", -5}, {"y", nullptr}}})},
      {"b", true},
      {"c", nullptr},
      {"d", {"p", "q"}},
      {"e", 18446744073709551615ULL}};
  EXPECT_EQ(out, Dump(expected));
}

TEST(JsonWriterTest, NumbersAreWrittenAsNlohmannWritesThem) {
  for (const double d : {0.0,
                         -0.0,
                         1.0,
                         -1.0,
                         0.5,
                         5.0,
                         1764240000.25,
                         1764240000.0,
                         1.1639366149902344,
                         123.456,
                         0.001,
                         0.0001,
                         1e-5,
                         1.5e-7,
                         1e14,
                         1e15,
                         123456789012345.0,
                         1234567890123456.0,
                         1e16,
                         3e20,
                         -2.5e-300,
                         1e308,
                         std::numeric_limits<double>::min(),
                         std::numeric_limits<double>::max(),
                         std::numeric_limits<double>::denorm_min()})
    EXPECT_EQ(Written(d), json(d).dump()) << d;
  // What JSON cannot hold is null, as nlohmann writes it.
  EXPECT_EQ(Written(std::numeric_limits<double>::quiet_NaN()), "null");
  EXPECT_EQ(Written(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(Written(-std::numeric_limits<double>::infinity()), "null");
  // Any double, and times to the nanosecond (where the shortest digits and nlohmann's Grisu2
  // digits often differ in the last place): nlohmann's very text, which reads back as itself.
  std::mt19937_64 rng(16);
  for (int i = 0; i < 200000; ++i) {
    double d;
    if (i % 2 == 0) {
      const std::uint64_t bits = rng();
      static_assert(sizeof d == sizeof bits);
      std::memcpy(&d, &bits, sizeof d);
      if (!std::isfinite(d)) continue;
    } else {
      d = 1.7e9 + static_cast<double>(rng() % 100000000000000000ULL) / 1e9;
    }
    const std::string text = Written(d);
    ASSERT_EQ(text, json(d).dump());
    ASSERT_EQ(json::parse(text).get<double>(), d) << text;
  }
}

TEST(JsonWriterTest, StringsAreEscapedAndIllFormedUtf8BecomesReplacementCharacters) {
  const std::string plain = "GPU-1234 \"quoted\" back\\slash \x7f é 日本 🙂";
  EXPECT_EQ(Written(plain), json(plain).dump());
  std::string controls;
  for (int c = 0; c < 0x20; ++c) controls += static_cast<char>(c);
  EXPECT_EQ(Written(controls), json(controls).dump());
  // Ill-formed: a stray continuation byte, a truncated sequence, an overlong form, a surrogate,
  // a code point past U+10FFFF, a lead byte at the end.
  for (const std::string bad :
       {"a\x80z", "a\xe6\x97z", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "end\xe6"}) {
    const std::string text = Written(bad);
    EXPECT_EQ(text, json(bad).dump(-1, ' ', false, json::error_handler_t::replace));
    const json back = json::parse(text);  // throws if the output is not valid JSON
    EXPECT_NE(back.get<std::string>().find("\xEF\xBF\xBD"), std::string::npos) << text;
  }
  EXPECT_EQ(json::parse(Written("a\x80z")).get<std::string>(), "a\xEF\xBF\xBDz");
  EXPECT_EQ(json::parse(Written("end\xe6")).get<std::string>(), "end\xEF\xBF\xBD");
}

}  // namespace
}  // namespace gpulock
