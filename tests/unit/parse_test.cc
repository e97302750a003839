// Parsing and formatting of human-written quantities (include/gpulock/parse.hpp): every accepted
// spelling, and every refusal being Error(kInvalidArgument) with a message that names the input.
#include "gpulock/parse.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gpulock/error.hpp"

namespace gpulock {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::uint64_t kKiB = 1024ULL;
constexpr std::uint64_t kMiB = 1024ULL * kKiB;
constexpr std::uint64_t kGiB = 1024ULL * kMiB;
constexpr std::uint64_t kTiB = 1024ULL * kGiB;

// Runs f, expecting Error(kInvalidArgument) whose message contains `named` (the input as shown).
template <typename F>
void ExpectInvalid(F&& f, const std::string& named) {
  try {
    f();
    ADD_FAILURE() << "no error for '" << named << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find("'" + named + "'"), std::string::npos)
        << "message does not name the input: " << error.what();
  }
}

// --- parse_size ---------------------------------------------------------------------------

TEST(ParseSizeTest, AcceptsBinaryUnits) {
  EXPECT_EQ(parse_size("20G"), 20 * kGiB);
  EXPECT_EQ(parse_size("512M"), 512 * kMiB);
  EXPECT_EQ(parse_size("1.5T"), kTiB + kTiB / 2);
  EXPECT_EQ(parse_size("80GiB"), 80 * kGiB);
  EXPECT_EQ(parse_size("4096K"), 4096 * kKiB);
  EXPECT_EQ(parse_size("7b"), 7u);
  EXPECT_EQ(parse_size("7B"), 7u);
}

TEST(ParseSizeTest, UnitsAreCaseInsensitiveAndSpellingsAgree) {
  for (const char* spelling : {"2g", "2G", "2gb", "2GB", "2gib", "2GiB", "2 G", " 2G ", "2.0G"})
    EXPECT_EQ(parse_size(spelling), 2 * kGiB) << spelling;
  EXPECT_EQ(parse_size("1k"), kKiB);
  EXPECT_EQ(parse_size("1KiB"), kKiB);
  EXPECT_EQ(parse_size("1mib"), kMiB);
  EXPECT_EQ(parse_size("1tb"), kTiB);
}

TEST(ParseSizeTest, ZeroAndFractionsRound) {
  EXPECT_EQ(parse_size("0G"), 0u);
  EXPECT_EQ(parse_size("0.5K"), 512u);
  EXPECT_EQ(parse_size("1.5b"), 2u);  // rounded to the nearest byte
}

TEST(ParseSizeTest, RefusesABareNumber) {
  ExpectInvalid([] { parse_size("20"); }, "20");
  try {
    parse_size("20");
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("unit"), std::string::npos) << error.what();
  }
}

TEST(ParseSizeTest, RefusesNonsense) {
  for (const char* text : {"", "   ", "G", "abc", "20X", "20GG", "G20", "1.2.3G", "1e3G", "0x10G",
                           "20G extra", "nanG", "infG"})
    ExpectInvalid([&] { parse_size(text); }, text);
}

TEST(ParseSizeTest, RefusesNegative) {
  ExpectInvalid([] { parse_size("-5G"); }, "-5G");
  ExpectInvalid([] { parse_size("-0G"); }, "-0G");
}

TEST(ParseSizeTest, RefusesOverflow) {
  ExpectInvalid([] { parse_size("99999999999T"); }, "99999999999T");
  const std::string huge = "1" + std::string(400, '0') + "G";  // strtod gives infinity
  try {
    parse_size(huge);
    ADD_FAILURE() << "no error for a 401-digit size";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("invalid size '1000"), std::string::npos)
        << error.what();
  }
}

TEST(ParseSizeTest, MessageShowsUntrustedInputSafely) {
  try {
    parse_size("\x1b[31m20X");
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << "escape character survived";
    EXPECT_NE(message.find("?[31m20X"), std::string::npos) << message;
  }
}

// --- parse_duration -----------------------------------------------------------------------

TEST(ParseDurationTest, AcceptsUnits) {
  EXPECT_EQ(parse_duration("90s"), seconds(90));
  EXPECT_EQ(parse_duration("5m"), std::chrono::minutes(5));
  EXPECT_EQ(parse_duration("2h"), std::chrono::hours(2));
  EXPECT_EQ(parse_duration("1h30m"), std::chrono::minutes(90));
  EXPECT_EQ(parse_duration("250ms"), milliseconds(250));
  EXPECT_EQ(parse_duration("1d"), std::chrono::hours(24));
  EXPECT_EQ(parse_duration("10sec"), seconds(10));
  EXPECT_EQ(parse_duration("2min"), std::chrono::minutes(2));
  EXPECT_EQ(parse_duration("1.5h"), std::chrono::minutes(90));
  EXPECT_EQ(parse_duration("1d2h3m4s5ms"),
            std::chrono::hours(26) + std::chrono::minutes(3) + seconds(4) + milliseconds(5));
  EXPECT_EQ(parse_duration(" 90S "), seconds(90));
}

TEST(ParseDurationTest, BareNumberMeansSeconds) {
  EXPECT_EQ(parse_duration("90"), seconds(90));
  EXPECT_EQ(parse_duration("0"), milliseconds(0));
  EXPECT_EQ(parse_duration("0.25"), milliseconds(250));
}

TEST(ParseDurationTest, RefusesNonsense) {
  for (const char* text : {"", "  ", "s", "abc", "5x", "5 s", "1h 30m", "1h30", "30m1", "h1", "5s-",
                           "1.2.3s", "1e3s", "five"})
    ExpectInvalid([&] { parse_duration(text); }, text);
}

TEST(ParseDurationTest, RefusesNegative) {
  ExpectInvalid([] { parse_duration("-5s"); }, "-5s");
  ExpectInvalid([] { parse_duration("-1"); }, "-1");
  ExpectInvalid([] { parse_duration("1h-5m"); }, "1h-5m");
}

TEST(ParseDurationTest, RefusesOverflow) {
  ExpectInvalid([] { parse_duration("99999999999d"); }, "99999999999d");
  ExpectInvalid([] { parse_duration("1000000000000000000"); }, "1000000000000000000");
  const std::string huge = "9" + std::string(400, '9') + "s";
  try {
    parse_duration(huge);
    ADD_FAILURE() << "no error for a 401-digit duration";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("invalid duration '999"), std::string::npos)
        << error.what();
  }
}

// --- parse_percent ------------------------------------------------------------------------

TEST(ParsePercentTest, AcceptsWholeNumbersWithOrWithoutSign) {
  EXPECT_EQ(parse_percent("85"), 85u);
  EXPECT_EQ(parse_percent("85%"), 85u);
  EXPECT_EQ(parse_percent("0"), 0u);
  EXPECT_EQ(parse_percent("100%"), 100u);
  EXPECT_EQ(parse_percent(" 7% "), 7u);
}

TEST(ParsePercentTest, RefusesOutOfRangeAndNonsense) {
  for (const char* text : {"", "%", "101", "-1", "-0", "85.5", "abc", "85%%", "%85", "4294967296",
                           "99999999999999999999", "1e2", "8 5"})
    ExpectInvalid([&] { parse_percent(text); }, text);
}

// --- parse_watts --------------------------------------------------------------------------

TEST(ParseWattsTest, AcceptsWattsWithOrWithoutUnit) {
  EXPECT_DOUBLE_EQ(parse_watts("300"), 300.0);
  EXPECT_DOUBLE_EQ(parse_watts("300W"), 300.0);
  EXPECT_DOUBLE_EQ(parse_watts("150w"), 150.0);
  EXPECT_DOUBLE_EQ(parse_watts("299.5"), 299.5);
  EXPECT_DOUBLE_EQ(parse_watts(" 42W "), 42.0);
  EXPECT_DOUBLE_EQ(parse_watts("1000000"), 1e6);
}

TEST(ParseWattsTest, RefusesZeroNegativeOverflowAndNonsense) {
  for (const char* text :
       {"", "W", "0", "0W", "-5", "-5W", "abc", "5kW", "1e3", "2000000", "300WW", "30 0"})
    ExpectInvalid([&] { parse_watts(text); }, text);
}

// --- parse_gpu_list -----------------------------------------------------------------------

TEST(ParseGpuListTest, SplitsAndTrims) {
  EXPECT_EQ(parse_gpu_list("0,2,GPU-8a1c"), (std::vector<std::string>{"0", "2", "GPU-8a1c"}));
  EXPECT_EQ(parse_gpu_list(" 0 , 1:2 ,\tMIG-ab "),
            (std::vector<std::string>{"0", "1:2", "MIG-ab"}));
  EXPECT_EQ(parse_gpu_list("3"), (std::vector<std::string>{"3"}));
}

TEST(ParseGpuListTest, RefusesEmptyItems) {
  for (const char* text : {"", " ", ",", "0,", ",0", "0,,1", "0, ,1"})
    ExpectInvalid([&] { parse_gpu_list(text); }, text);
}

// --- format_size / format_duration --------------------------------------------------------

TEST(FormatSizeTest, GiBWithOneDecimalAboveOneGiB) {
  EXPECT_EQ(format_size(80 * kGiB), "80.0 GiB");
  EXPECT_EQ(format_size(kGiB), "1.0 GiB");
  EXPECT_EQ(format_size(kGiB + kGiB / 2), "1.5 GiB");
  EXPECT_EQ(format_size(2 * kTiB), "2048.0 GiB");
}

TEST(FormatSizeTest, WholeMiBBelowOneGiB) {
  EXPECT_EQ(format_size(512 * kMiB), "512 MiB");
  EXPECT_EQ(format_size(0), "0 MiB");
  EXPECT_EQ(format_size(1023 * kMiB), "1023 MiB");
}

TEST(FormatSizeTest, BelowOneMiBInKiBOrBytes) {
  EXPECT_EQ(format_size(8 * 1024), "8 KiB");
  EXPECT_EQ(format_size(1000), "1000 B");
}

TEST(FormatSizeTest, RoundTripsThroughParseSize) {
  EXPECT_EQ(parse_size(format_size(20 * kGiB)), 20 * kGiB);
  EXPECT_EQ(parse_size(format_size(512 * kMiB)), 512 * kMiB);
}

TEST(FormatDurationTest, PicksTheTwoLargestUnits) {
  EXPECT_EQ(format_duration(seconds(0)), "0s");
  EXPECT_EQ(format_duration(seconds(12)), "12s");
  EXPECT_EQ(format_duration(seconds(185)), "3m 05s");
  EXPECT_EQ(format_duration(seconds(3720)), "1h 02m");
  EXPECT_EQ(format_duration(seconds(3600)), "1h 00m");
  EXPECT_EQ(format_duration(seconds(86400 + 3600)), "1d 01h");
  EXPECT_EQ(format_duration(seconds(400 * 86400)), "400d 00h");
}

TEST(FormatDurationTest, NegativeShowsAsZero) {
  EXPECT_EQ(format_duration(seconds(-5)), "0s");
}

}  // namespace
}  // namespace gpulock
