// Holder records (src/local/holder_record.h): the serialize/parse round trip, the fixed on-disk
// size, and parse_holder_record() treating every byte read back as hostile input.
#include "backend/holder_record.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "one_character_mutations.h"

namespace gpulock {
namespace {

using nlohmann::json;

HolderRecord SampleRecord() {
  HolderRecord record;
  record.lease_id = "0123456789abcdef";
  record.uid = 1000;
  record.user = "alice";
  record.host = "node17";
  record.boot_id = "8f3c2b9e-1d4a-4c6b-9e0f-123456789abc";
  record.kind = HolderKind::kRun;
  record.holder = ProcessId{4711, 123456789};
  record.members = {ProcessId{4712, 123456790}, ProcessId{4713, 123456791}};
  record.command = "python train.py --lr 3e-4";
  record.label = "sweep";
  record.started_at = 1700000000.25;
  record.gpus = {"GPU-5e1f0a7e-0000-4000-8000-000000000000",
                 "GPU-5e1f0a7e-0000-4000-8000-000000000001"};
  return record;
}

// The record's JSON, for tests that change one field.
json SampleJson() {
  const std::string text = serialize_holder_record(SampleRecord());
  return json::parse(text);
}

std::optional<HolderRecord> ParseJson(const json& j) {
  return parse_holder_record(j.dump());
}

// True if text is well-formed UTF-8.
bool IsValidUtf8(const std::string& text) {
  try {
    (void)json(text).dump();  // dump() throws type_error 316 on invalid UTF-8
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// True if text holds no C0/C1 control characters and no DEL, as raw bytes or encoded in UTF-8.
bool HasNoControlCharacters(const std::string& text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) return false;
    // U+0080..U+009F (C1 controls, e.g. U+009B CSI) are encoded as C2 80..C2 9F.
    if (c == 0xC2 && i + 1 < text.size()) {
      const auto next = static_cast<unsigned char>(text[i + 1]);
      if (next >= 0x80 && next <= 0x9F) return false;
    }
  }
  return true;
}

// --- round trip ---------------------------------------------------------------------------

TEST(HolderRecordTest, RoundTripKeepsEveryField) {
  const HolderRecord in = SampleRecord();
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->lease_id, in.lease_id);
  EXPECT_EQ(out->uid, in.uid);
  EXPECT_EQ(out->user, in.user);
  EXPECT_EQ(out->host, in.host);
  EXPECT_EQ(out->boot_id, in.boot_id);
  EXPECT_EQ(out->kind, in.kind);
  EXPECT_EQ(out->holder, in.holder);
  EXPECT_EQ(out->members, in.members);
  EXPECT_EQ(out->command, in.command);
  EXPECT_EQ(out->label, in.label);
  EXPECT_DOUBLE_EQ(out->started_at, in.started_at);
  EXPECT_EQ(out->gpus, in.gpus);
}

TEST(HolderRecordTest, SharedLeaseMemoryRoundTripsAndIsOptional) {
  HolderRecord in = SampleRecord();
  EXPECT_FALSE(parse_holder_record(serialize_holder_record(in))->memory_bytes);
  in.memory_bytes = std::uint64_t{10} << 30;
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->memory_bytes, in.memory_bytes);
  // A record any user can write: a negative or non-integer size is refused.
  std::string text = holder_record_json(in);
  const std::string key = "\"memory_bytes\":";
  text.replace(text.find(key) + key.size(), std::to_string(*in.memory_bytes).size(), "-1");
  EXPECT_FALSE(parse_holder_record(text));
}

TEST(HolderRecordTest, SessionOfADetachedLeaseRoundTripsAndIsOptional) {
  HolderRecord in = SampleRecord();
  in.kind = HolderKind::kDetached;
  EXPECT_EQ(parse_holder_record(serialize_holder_record(in))->session, 0);
  EXPECT_EQ(holder_record_json(in).find("session"), std::string::npos);
  in.session = 4242;
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->session, 4242);
  // Written by anyone: a session that no pid could be is refused.
  for (const char* bad : {"0", "-1", "4194305", "1.5", "\"7\""}) {
    std::string text = holder_record_json(in);
    const std::string key = "\"session\":";
    text.replace(text.find(key) + key.size(), 4, bad);
    EXPECT_FALSE(parse_holder_record(text)) << text;
  }
}

TEST(HolderRecordTest, RoundTripEveryKind) {
  for (HolderKind kind : {HolderKind::kProcess, HolderKind::kRun, HolderKind::kDetached}) {
    HolderRecord in = SampleRecord();
    in.kind = kind;
    const auto out = parse_holder_record(serialize_holder_record(in));
    ASSERT_TRUE(out.has_value()) << holder_kind_name(kind);
    EXPECT_EQ(out->kind, kind);
  }
  EXPECT_STREQ(holder_kind_name(HolderKind::kProcess), "process");
  EXPECT_STREQ(holder_kind_name(HolderKind::kRun), "run");
  EXPECT_STREQ(holder_kind_name(HolderKind::kDetached), "detached");
}

TEST(HolderRecordTest, RoundTripEmptyOptionalParts) {
  HolderRecord in = SampleRecord();
  in.members.clear();
  in.command.clear();
  in.label.clear();
  in.host.clear();
  in.boot_id.clear();
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->members.empty());
  EXPECT_EQ(out->command, "");
  EXPECT_EQ(out->label, "");
}

TEST(HolderRecordTest, RoundTripExtremeNumbers) {
  HolderRecord in = SampleRecord();
  in.uid = std::numeric_limits<std::uint32_t>::max();
  in.holder = ProcessId{4194304, std::numeric_limits<std::uint64_t>::max()};
  in.started_at = 0;
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->uid, in.uid);
  EXPECT_EQ(out->holder, in.holder);
  EXPECT_EQ(out->started_at, 0.0);
}

TEST(HolderRecordTest, RoundTripUtf8Text) {
  HolderRecord in = SampleRecord();
  in.label = "Läuft – 訓練 🚀";
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->label, in.label);
}

// --- fixed size ---------------------------------------------------------------------------

TEST(HolderRecordTest, SerializedSizeIsExactlyTheRecordSize) {
  EXPECT_EQ(serialize_holder_record(SampleRecord()).size(), kHolderRecordSize);
  EXPECT_EQ(serialize_holder_record(HolderRecord{}).size(), kHolderRecordSize);
  HolderRecord big = SampleRecord();
  big.command = std::string(100000, 'c');
  big.label = std::string(100000, 'l');
  EXPECT_EQ(serialize_holder_record(big).size(), kHolderRecordSize);
}

TEST(HolderRecordTest, SerializedRecordIsOneLinePaddedWithSpaces) {
  const std::string text = serialize_holder_record(SampleRecord());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1);
  const std::size_t end = text.find_last_not_of(" \n");
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(text[end], '}');
}

// --- cutting to fit -----------------------------------------------------------------------

TEST(HolderRecordTest, HugeCommandAndLabelAreCutToFit) {
  HolderRecord in = SampleRecord();
  in.command = std::string(100000, 'c');
  in.label = std::string(100000, 'l');
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_FALSE(out->command.empty());
  EXPECT_LE(out->command.size(), 1024u);
  // A prefix, marked as cut with a trailing ellipsis.
  const std::string ellipsis = "\u2026";
  ASSERT_TRUE(out->command.ends_with(ellipsis)) << out->command;
  const std::string kept = out->command.substr(0, out->command.size() - ellipsis.size());
  EXPECT_EQ(in.command.compare(0, kept.size(), kept), 0);
  EXPECT_FALSE(out->label.empty());
  EXPECT_LE(out->label.size(), 256u);
  EXPECT_EQ(out->lease_id, in.lease_id);
  EXPECT_EQ(out->gpus, in.gpus);
}

TEST(HolderRecordTest, CommandCutOnlyWhenNeeded) {
  HolderRecord in = SampleRecord();
  in.command = std::string(1000, 'c');
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->command, in.command);
}

TEST(HolderRecordTest, LargestLeaseStillFits) {
  // 64 GPUs (the most a record lists), 8 members, and long text everywhere.
  HolderRecord in = SampleRecord();
  in.gpus.clear();
  for (int i = 0; i < 64; ++i)
    in.gpus.push_back("MIG-5e1f0a7e-0000-4000-8000-0000000000" + std::to_string(10 + i));
  in.members.assign(8, ProcessId{4194304, std::numeric_limits<std::uint64_t>::max()});
  in.user = std::string(64, 'u');
  in.host = std::string(64, 'h');
  in.command = std::string(5000, 'c');
  in.label = std::string(5000, 'l');
  const std::string text = serialize_holder_record(in);
  EXPECT_EQ(text.size(), kHolderRecordSize);
  const auto out = parse_holder_record(text);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->gpus.size(), 64u);
  EXPECT_EQ(out->members.size(), 8u);
}

TEST(HolderRecordTest, MoreThanSixtyFourGpusOrEightMembersAreCut) {
  HolderRecord in = SampleRecord();
  in.gpus.assign(100, "GPU-1");
  in.members.assign(20, ProcessId{5, 6});
  const auto out = parse_holder_record(serialize_holder_record(in));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->gpus.size(), 64u);
  EXPECT_EQ(out->members.size(), 8u);
}

// Regression test for a fixed bug: serialize_holder_record() (src/local/holder_record.cc, the
// fallback after the first dump()) cuts command/label to 128/64 *bytes*, but dump() escapes each
// control byte as \u00XX (6 bytes) and each invalid UTF-8 byte as U+FFFD (3 bytes), so a record
// with many GPUs and a command or label full of such bytes is still over 4095 bytes; text.resize()
// then chops the JSON and the record no longer parses (status shows "lease details unavailable" for
// a lease whose details were written). Expected: the record always fits as valid JSON.
TEST(HolderRecordTest, RecordWithEscapedTextStillFitsAsValidJson) {
  HolderRecord in = SampleRecord();
  in.gpus.clear();
  for (int i = 0; i < 64; ++i)
    in.gpus.push_back("MIG-5e1f0a7e-0000-4000-8000-0000000000" + std::to_string(10 + i));
  in.members.assign(8, ProcessId{4194304, std::numeric_limits<std::uint64_t>::max()});
  in.command = std::string(2000, '\x01');
  in.label = std::string(2000, '\x02');
  const std::string text = serialize_holder_record(in);
  EXPECT_EQ(text.size(), kHolderRecordSize);
  EXPECT_TRUE(parse_holder_record(text).has_value());
}

// Regression test for a fixed bug: serialize_holder_record() (src/local/holder_record.cc) cuts user
// to 64 and host to 255 *bytes*; a cut inside a multi-byte character leaves an invalid byte that
// dump() replaces with U+FFFD (3 bytes), so the stored user can be 66 bytes, which
// parse_holder_record() refuses (its bound is 64): the whole record is rejected and `gpulock
// status` shows "lease details unavailable" for every lease of that user. Expected: whatever
// serialize writes, parse accepts.
TEST(HolderRecordTest, LongNonAsciiUserNameRoundTrips) {
  HolderRecord in = SampleRecord();
  in.user = "a";
  for (int i = 0; i < 40; ++i) in.user += "\xc3\xa9";  // é: the 64-byte cut splits one
  EXPECT_TRUE(parse_holder_record(serialize_holder_record(in)).has_value());
  in = SampleRecord();
  in.host = "hh";
  for (int i = 0; i < 200; ++i) in.host += "\xc3\xa9";
  EXPECT_TRUE(parse_holder_record(serialize_holder_record(in)).has_value());
}

TEST(HolderRecordTest, InvalidUtf8IsReplacedNotFatal) {
  HolderRecord in = SampleRecord();
  in.label = std::string("bad \xff\xfe bytes");
  in.command = std::string("cut \xe2\x82", 6);  // an incomplete multi-byte character
  std::string text;
  ASSERT_NO_THROW(text = serialize_holder_record(in));
  const auto out = parse_holder_record(text);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(IsValidUtf8(out->label));
  EXPECT_TRUE(IsValidUtf8(out->command));
  EXPECT_EQ(out->label.rfind("bad ", 0), 0u);
}

// --- untrusted input: structure -----------------------------------------------------------

TEST(HolderRecordTest, RefusesTruncatedRecords) {
  const std::string text = serialize_holder_record(SampleRecord());
  const std::size_t json_end = text.find_last_not_of(" \n") + 1;
  for (std::size_t length :
       {std::size_t{0}, std::size_t{1}, std::size_t{10}, json_end / 2, json_end - 1})
    EXPECT_FALSE(parse_holder_record(text.substr(0, length)).has_value()) << length;
  // Cut only in the padding: still the whole record.
  EXPECT_TRUE(parse_holder_record(text.substr(0, json_end)).has_value());
}

TEST(HolderRecordTest, RefusesOversizedInput) {
  std::string text = serialize_holder_record(SampleRecord());
  text += ' ';  // one byte more than a record can be
  EXPECT_FALSE(parse_holder_record(text).has_value());
}

TEST(HolderRecordTest, RefusesGarbage) {
  const std::vector<std::string> garbage = {
      "",
      "not json",
      "{",
      "}",
      "[]",
      "null",
      "42",
      "\"a string\"",
      "{\"schema\": 1",
      std::string("\xff\xfe\xfd\xfc", 4),
      std::string(kHolderRecordSize, ' '),
      std::string(kHolderRecordSize, '\xff'),
  };
  for (const auto& bytes : garbage)
    EXPECT_FALSE(parse_holder_record(bytes).has_value())
        << json(bytes).dump(-1, ' ', true, json::error_handler_t::replace);
}

TEST(HolderRecordTest, RefusesNulBytes) {
  // A file extended with zeros (a crash between ftruncate and write, or a sparse file).
  EXPECT_FALSE(parse_holder_record(std::string(kHolderRecordSize, '\0')).has_value());
  EXPECT_FALSE(parse_holder_record(std::string(1, '\0')).has_value());
  // NUL before the record.
  const std::string text = serialize_holder_record(SampleRecord());
  EXPECT_FALSE(
      parse_holder_record(std::string(1, '\0') + text.substr(0, text.size() - 1)).has_value());
  // NUL inside a string value: a control character, invalid in JSON.
  json j = SampleJson();
  std::string dumped = j.dump();
  const std::size_t at = dumped.find("alice");
  ASSERT_NE(at, std::string::npos);
  dumped[at + 2] = '\0';
  EXPECT_FALSE(parse_holder_record(dumped).has_value());
}

TEST(HolderRecordTest, ValidRecordFollowedByNulsDoesNotCrash) {
  // Whether accepted or not, the record must come out validated (no crash, sane fields).
  std::string text = SampleJson().dump();
  text += std::string(100, '\0') + "garbage";
  const auto out = parse_holder_record(text);
  if (out) {
    EXPECT_EQ(out->lease_id, "0123456789abcdef");
  }
}

TEST(HolderRecordTest, RefusesDeeplyNestedJson) {
  EXPECT_FALSE(parse_holder_record(std::string(kHolderRecordSize, '[')).has_value());
  EXPECT_FALSE(parse_holder_record(std::string(2000, '[') + std::string(2000, ']')).has_value());
  std::string nested_object;
  for (int i = 0; i < 600; ++i) nested_object += "{\"a\":";
  nested_object += "1" + std::string(600, '}');
  ASSERT_LE(nested_object.size(), kHolderRecordSize);
  EXPECT_FALSE(parse_holder_record(nested_object).has_value());
  // Nesting where a string belongs.
  json j = SampleJson();
  std::string dumped = j.dump();
  const std::string label = "\"label\":\"sweep\"";
  const std::size_t at = dumped.find(label);
  ASSERT_NE(at, std::string::npos);
  dumped.replace(at, label.size(), "\"label\":" + std::string(1000, '[') + std::string(1000, ']'));
  ASSERT_LE(dumped.size(), kHolderRecordSize);
  EXPECT_FALSE(parse_holder_record(dumped).has_value());
}

// --- untrusted input: fields --------------------------------------------------------------

TEST(HolderRecordTest, RefusesWrongSchema) {
  json j = SampleJson();
  for (const json& schema :
       {json(2), json(0), json(-1), json("1"), json(1.5), json(nullptr), json::array({1})}) {
    j["schema"] = schema;
    EXPECT_FALSE(ParseJson(j).has_value()) << schema.dump();
  }
  j.erase("schema");
  EXPECT_FALSE(ParseJson(j).has_value());
}

TEST(HolderRecordTest, RefusesMissingRequiredFields) {
  for (const char* key : {"lease_id", "uid", "user", "host", "boot_id", "kind", "holder", "members",
                          "command", "label", "started_at", "gpus"}) {
    json j = SampleJson();
    j.erase(key);
    EXPECT_FALSE(ParseJson(j).has_value()) << key;
  }
}

TEST(HolderRecordTest, RefusesWrongTypes) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"lease_id", 123},
      {"uid", "1000"},
      {"uid", -1},
      {"uid", 1.5},
      {"uid", true},
      {"uid", 4294967296ULL},
      {"user", 7},
      {"user", json::array({"alice"})},
      {"host", nullptr},
      {"boot_id", false},
      {"kind", 1},
      {"kind", "daemon"},
      {"kind", "PROCESS"},
      {"holder", 4711},
      {"holder", json::object()},
      {"holder", json{{"pid", "4711"}, {"start", 1}}},
      {"holder", json{{"pid", 4711}, {"start", -1}}},
      {"holder", json{{"pid", 0}, {"start", 1}}},
      {"holder", json{{"pid", -5}, {"start", 1}}},
      {"holder", json{{"pid", 4194305}, {"start", 1}}},
      {"holder", json{{"pid", 4711}}},
      {"members", json::object()},
      {"members", "4712"},
      {"members", json::array({4712})},
      {"members", json::array({json{{"pid", 0}, {"start", 1}}})},
      {"command", json::array()},
      {"label", 3},
      {"started_at", "yesterday"},
      {"started_at", -1},
      {"started_at", nullptr},
      {"started_at", true},
      {"gpus", "GPU-1"},
      {"gpus", json::array({1})},
      {"gpus", json::array({nullptr})},
      {"gpus", json::object()},
  };
  for (const auto& [key, value] : cases) {
    json j = SampleJson();
    j[key] = value;
    EXPECT_FALSE(ParseJson(j).has_value()) << key << " = " << value.dump();
  }
}

TEST(HolderRecordTest, RefusesTooManyListEntries) {
  json j = SampleJson();
  j["members"] = json::array();
  for (int i = 0; i < 9; ++i) j["members"].push_back(json{{"pid", 100 + i}, {"start", 1}});
  EXPECT_FALSE(ParseJson(j).has_value());

  j = SampleJson();
  j["gpus"] = json::array();
  for (int i = 0; i < 65; ++i) j["gpus"].push_back(fmt::format("G{}", i));
  EXPECT_FALSE(ParseJson(j).has_value());
}

TEST(HolderRecordTest, RefusesOverLongStrings) {
  const std::vector<std::pair<std::string, std::size_t>> limits = {
      {"lease_id", 16}, {"user", 64}, {"host", 255},
      {"boot_id", 64},  {"kind", 16}, {"label", 1024}};
  // (command is bounded at 4096 bytes, which only the record size itself can exceed.)
  for (const auto& [key, limit] : limits) {
    json j = SampleJson();
    j[key] = std::string(limit + 1, 'a');
    ASSERT_LE(j.dump().size(), kHolderRecordSize) << key;
    EXPECT_FALSE(ParseJson(j).has_value()) << key;
  }
  json j = SampleJson();
  j["gpus"] = json::array({std::string(97, 'g')});
  EXPECT_FALSE(ParseJson(j).has_value());
}

TEST(HolderRecordTest, LongButBoundedTextIsCutForDisplay) {
  json j = SampleJson();
  j["label"] = std::string(1000, 'l');
  j["command"] = std::string(2000, 'c');
  const auto out = ParseJson(j);
  ASSERT_TRUE(out.has_value());
  EXPECT_LE(out->label.size(), 256u + 3);  // 256 characters and an ellipsis
  EXPECT_LE(out->command.size(), 1024u + 3);
}

TEST(HolderRecordTest, RefusesBadLeaseIds) {
  for (const char* id :
       {"", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF", "0123456789abcdeg",
        "../../etc/passw", "0123456789abcde\n", "0123456789 abcde"}) {
    json j = SampleJson();
    j["lease_id"] = id;
    EXPECT_FALSE(ParseJson(j).has_value()) << json(id).dump();
  }
}

TEST(HolderRecordTest, UnknownExtraFieldsAreIgnored) {
  json j = SampleJson();
  j["future_field"] = json::array({1, 2, 3});
  const auto out = ParseJson(j);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->lease_id, "0123456789abcdef");
}

// --- untrusted input: text that could attack a terminal -----------------------------------

TEST(HolderRecordTest, ControlCharactersAreSanitized) {
  json j = SampleJson();
  j["user"] = "ev\x1bil";
  j["host"] = "ho\x07st";
  j["label"] = "\x1b]0;pwned\x07\x1b[2J label\r\n";
  j["command"] = "rm -rf / \x1b[8m hidden \x7f\x08";
  j["gpus"] = json::array({"GPU-\x1b[31m"});
  const auto out = ParseJson(j);
  ASSERT_TRUE(out.has_value());
  for (const std::string* text :
       {&out->user, &out->host, &out->label, &out->command, &out->gpus.front()}) {
    EXPECT_TRUE(HasNoControlCharacters(*text)) << json(*text).dump();
    EXPECT_EQ(text->find('\x1b'), std::string::npos);
  }
  EXPECT_EQ(out->user, "ev?il");
  EXPECT_EQ(out->label, "?]0;pwned??[2J label??");
}

TEST(HolderRecordTest, JsonEscapedControlCharactersAreSanitizedToo) {
  // The same attack written with JSON escapes instead of raw bytes.
  std::string text = SampleJson().dump();
  const std::string label = "\"label\":\"sweep\"";
  const std::size_t at = text.find(label);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, label.size(), R"("label":"\u001b[31mred\u0000nul\u001b]8;;x\u0007")");
  const auto out = parse_holder_record(text);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(HasNoControlCharacters(out->label)) << json(out->label).dump();
  EXPECT_EQ(out->label, "?[31mred?nul?]8;;x?");
}

// Regression test for a fixed bug: sanitize_for_display() (src/util/strings.cc), which
// parse_holder_record() applies to user, host, label, command and gpus, only replaces bytes < 0x20
// and 0x7f. The C1 control characters U+0080..U+009F survive as UTF-8 (C2 80..C2 9F); U+009B is the
// one-character CSI and U+009D the OSC introducer, which terminals such as xterm honour, so a
// record whose label is "\u009b2J" still clears a screen in `gpulock status`. Expected: C1 controls
// become '?' as the header promises ("Replaces control characters (terminal escapes included)").
TEST(HolderRecordTest, C1ControlCharactersAreSanitized) {
  std::string text = SampleJson().dump();
  const std::string label = "\"label\":\"sweep\"";
  const std::size_t at = text.find(label);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, label.size(), R"("label":"\u009b2J\u009d0;pwned\u009c")");
  const auto out = parse_holder_record(text);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(HasNoControlCharacters(out->label)) << json(out->label).dump();
}

// Regression test for a fixed bug: sanitize_for_display() (src/util/strings.cc) cuts at max_length
// *bytes*, so a long label or command of multi-byte characters is cut inside a character and the
// result, which parse_holder_record() hands to the CLI and the JSON output, is not valid UTF-8 (the
// JSON output then shows U+FFFD; a terminal shows mojibake). Expected: cut on a character boundary.
TEST(HolderRecordTest, TextCutForDisplayStaysValidUtf8) {
  json j = SampleJson();
  std::string euros;
  for (int i = 0; i < 300; ++i) euros += "\xe2\x82\xac";  // U+20AC, 3 bytes each: 900 bytes
  j["label"] = euros;
  const auto out = ParseJson(j);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(IsValidUtf8(out->label));
}

// Regression test for a fixed bug: parse_holder_record() (src/local/holder_record.cc) accepts any
// finite started_at >= 0, e.g. 1e300, which anyone able to open a lock file can write. Readers
// convert it to integers: holder_info() in src/pool_status.cc (duration_cast to
// system_clock::duration; status then shows a start ~292 million years BC) and holder_summary() in
// src/gpu_pool.cc (static_cast<std::time_t>, then `now - started`, which UBSan reports as "signed
// integer overflow" at gpu_pool.cc:128 while another user waits for that GPU). Both conversions are
// undefined behaviour. Expected: a start time the clocks cannot represent is refused like any
// other malformed field.
TEST(HolderRecordTest, RefusesStartTimeBeyondTheClock) {
  for (double when : {1e300, 1e19, 1e10, std::numeric_limits<double>::max()}) {
    json j = SampleJson();
    j["started_at"] = when;
    EXPECT_FALSE(ParseJson(j).has_value()) << when;
  }
}

// --- the fast reader against the full parser -----------------------------------------------
// parse_holder_record() reads records in the exact form gpulock writes without building a JSON
// document, and leaves everything else to nlohmann's parser. Whatever it accepts, it must read
// as that parser does: same record, or refused by both.

// Empty if both readings agree, else what differs.
std::string Difference(const std::optional<HolderRecord>& fast,
                       const std::optional<HolderRecord>& full) {
  if (fast.has_value() != full.has_value())
    return fmt::format("fast {} vs full {}", fast ? "read" : "refused", full ? "read" : "refused");
  if (!fast) return "";
  const HolderRecord& a = *fast;
  const HolderRecord& b = *full;
  if (a.lease_id != b.lease_id || a.uid != b.uid || a.user != b.user || a.host != b.host ||
      a.boot_id != b.boot_id || a.kind != b.kind || !(a.holder == b.holder) ||
      a.members != b.members || a.command != b.command || a.label != b.label ||
      a.started_at != b.started_at || a.gpus != b.gpus || a.memory_bytes != b.memory_bytes ||
      a.session != b.session)
    return "the records differ";
  return "";
}

TEST(HolderRecordReaders, WhatGpulockWritesIsReadFastAndAsTheFullParserReadsIt) {
  std::vector<std::pair<HolderRecord, bool>> records;  // and whether the fast reader takes it
  records.emplace_back(SampleRecord(), true);
  HolderRecord shared = SampleRecord();
  shared.memory_bytes = 10ull << 30;
  shared.members.clear();
  shared.kind = HolderKind::kProcess;
  records.emplace_back(shared, true);
  HolderRecord extremes = SampleRecord();
  extremes.uid = 4294967295u;
  extremes.holder = ProcessId{4194304, std::numeric_limits<std::uint64_t>::max()};
  extremes.members.assign(8, ProcessId{1, 0});
  extremes.gpus.assign(64, "GPU-5e1f0a7e-0000-4000-8000-000000000000");
  extremes.command = extremes.label = extremes.user = "";
  records.emplace_back(extremes, true);
  for (double when : {0.0, 1e-7, 1700000000.0, 1.5e9, 123.456, 8999999999.999}) {
    HolderRecord at = SampleRecord();
    at.started_at = when;
    records.emplace_back(at, true);
  }
  HolderRecord session = SampleRecord();
  session.kind = HolderKind::kDetached;
  session.session = 4194304;
  records.emplace_back(session, true);
  HolderRecord quoted = SampleRecord();
  quoted.command = R"(sh -c "echo \"hi\"")";  // escapes: the full parser's case
  records.emplace_back(quoted, false);
  HolderRecord utf8 = SampleRecord();
  utf8.user = "Zoë";  // bytes beyond ASCII: the full parser's case
  records.emplace_back(utf8, false);
  for (const auto& [record, fast] : records) {
    const std::string bytes = serialize_holder_record(record);
    EXPECT_EQ(holder_record_is_canonical(bytes), fast) << bytes;
    const auto read = parse_holder_record(bytes);
    ASSERT_TRUE(read.has_value()) << bytes;
    EXPECT_EQ(Difference(read, parse_holder_record_with_full_parser(bytes)), "") << bytes;
  }
}

TEST(HolderRecordReaders, EveryMutationOfARecordIsReadAsTheFullParserReadsIt) {
  HolderRecord record = SampleRecord();
  record.memory_bytes = 1ull << 30;
  record.session = 4242;
  std::size_t read_fast = 0;
  test_support::ForEachOneCharacterMutation(
      holder_record_json(record), [&](const std::string& mutated) {
        const auto fast = parse_holder_record(mutated);
        ASSERT_EQ(Difference(fast, parse_holder_record_with_full_parser(mutated)), "")
            << "mutated record: " << mutated;
        read_fast += holder_record_is_canonical(mutated);
      });
  // The comparison means something only if the fast reader took many of the mutants (a digit
  // changed, a field emptied, ...).
  EXPECT_GT(read_fast, 300u);
}

}  // namespace
}  // namespace gpulock
