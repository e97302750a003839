// The flat JSON reader of registrations (flat_json.h), checked against nlohmann's full parser:
// whatever it accepts, it reads as nlohmann does (every member's kind and value); whatever is
// not JSON, it declines; and it declines the forms it leaves to the full parser.
#include "redis/flat_json.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "redis/device_record.h"

namespace gpulock {
namespace {

using nlohmann::json;

// Whether `flat` holds what nlohmann read from the same text (`dom`, an object).
void ExpectSameObject(const FlatJsonObject& flat, const json& dom, const std::string& text) {
  ASSERT_TRUE(dom.is_object()) << text;
  // nlohmann keeps the last of repeated keys; find() does too.
  EXPECT_EQ(dom.size(), [&] {
    std::vector<std::string_view> distinct;
    for (auto k : flat.keys)
      if (std::find(distinct.begin(), distinct.end(), k) == distinct.end()) distinct.push_back(k);
    return distinct.size();
  }()) << text;
  for (const auto& [key, expected] : dom.items()) {
    const FlatJsonValue* v = flat.find(key);
    ASSERT_NE(v, nullptr) << key << " in " << text;
    switch (v->kind) {
      case FlatJsonValue::Kind::kNull:
        EXPECT_TRUE(expected.is_null()) << key << " in " << text;
        break;
      case FlatJsonValue::Kind::kBool:
        ASSERT_TRUE(expected.is_boolean()) << key << " in " << text;
        EXPECT_EQ(v->boolean, expected.get<bool>()) << key << " in " << text;
        break;
      case FlatJsonValue::Kind::kUnsigned:
        ASSERT_TRUE(expected.is_number_unsigned()) << key << " in " << text;
        EXPECT_EQ(v->unsigned_number, expected.get<std::uint64_t>()) << key << " in " << text;
        EXPECT_EQ(v->real, expected.get<double>()) << key << " in " << text;
        break;
      case FlatJsonValue::Kind::kReal:
        ASSERT_TRUE(expected.is_number_float()) << key << " in " << text;
        EXPECT_EQ(v->real, expected.get<double>()) << key << " in " << text;
        break;
      case FlatJsonValue::Kind::kString:
        ASSERT_TRUE(expected.is_string()) << key << " in " << text;
        EXPECT_EQ(std::string(v->text), expected.get<std::string>()) << key << " in " << text;
        break;
      case FlatJsonValue::Kind::kArray:
        ASSERT_TRUE(expected.is_array()) << key << " in " << text;
        ASSERT_EQ(v->objects.size(), expected.size()) << key << " in " << text;
        for (std::size_t i = 0; i < expected.size(); ++i)
          ExpectSameObject(v->objects[i], expected[i], text);
        break;
    }
  }
}

// Accepted texts read as nlohmann reads them; declined ones may be anything.
void ExpectAgreesWhereAccepted(const std::string& text) {
  const auto flat = parse_flat_json(text);
  const json dom = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!flat) return;
  ASSERT_FALSE(dom.is_discarded()) << "accepted what is not JSON: " << text;
  ExpectSameObject(*flat, dom, text);
}

TEST(RedisFlatJsonTest, ReadsWhatARegistrationWritesAsNlohmannDoes) {
  Device d;
  d.index = 7;
  d.uuid = "GPU-0b1c2d3e-0000-4000-8000-000000000007";
  d.name = "NVIDIA H100 80GB HBM3";
  d.pci_bus_id = "00000000:3B:00.0";
  d.memory_total_bytes = UINT64_MAX;
  d.memory_used_bytes = 0;
  d.memory_free_bytes = 78ULL << 30;
  d.utilization_percent = 37;
  d.power_draw_watts = 71.25;
  d.power_limit_watts = 700;
  d.mig_enabled = false;
  d.mig_index = 3;
  d.processes = {GpuProcess{4711, 1ULL << 30}, GpuProcess{UINT32_MAX, std::nullopt}};
  d.processes_known = true;
  for (const std::string& text : {device_static_json(d), device_readings_json(d)}) {
    ASSERT_TRUE(parse_flat_json(text)) << text;
    ExpectAgreesWhereAccepted(text);
  }
}

TEST(RedisFlatJsonTest, AgreesWithNlohmannOnEveryValueItAccepts) {
  for (const std::string& text : std::vector<std::string>{
           "{}",
           " { } ",
           "{\"a\":1}",
           "{\"a\" : 0 , \"b\":\t18446744073709551615\n}",
           "{\"a\":1.5,\"b\":1e3,\"c\":2.5E-3,\"d\":0.0,\"e\":7e+2}",
           "{\"a\":true,\"b\":false,\"c\":null}",
           "{\"a\":\"x\",\"a\":\"y\"}",
           "{\"a\":\"\",\"b\":\" spaces and :,{}[] \"}",
           "{\"p\":[],\"q\":[{}],\"r\":[{\"pid\":1,\"used_memory\":2},{\"pid\":3}]}",
           "{\"a\":1}\n",
       }) {
    ASSERT_TRUE(parse_flat_json(text)) << text;
    ExpectAgreesWhereAccepted(text);
  }
}

TEST(RedisFlatJsonTest, DeclinesWhatIsNotJson) {
  for (const std::string& text : std::vector<std::string>{"",
                                                          "{",
                                                          "}",
                                                          "[]",
                                                          "null",
                                                          "42",
                                                          "\"x\"",
                                                          "{\"a\"}",
                                                          "{\"a\":}",
                                                          "{\"a\":1,}",
                                                          "{,}",
                                                          "{\"a\":1}x",
                                                          "{\"a\":1}{}",
                                                          "{\"a\":01}",
                                                          "{\"a\":1.}",
                                                          "{\"a\":.5}",
                                                          "{\"a\":1e}",
                                                          "{\"a\":tru}",
                                                          "{\"a\":nul}",
                                                          "{\"a\":[{},]}",
                                                          "{\"a\":[}",
                                                          "{\"a\":\"x}",
                                                          "{a:1}",
                                                          "{'a':1}",
                                                          "{\"a\":1 \"b\":2}",
                                                          std::string("{\"a\":1}\0", 8),
                                                          "{\"a\":+1}",
                                                          "{\"a\":Infinity}",
                                                          "{\"a\":NaN}"})
    EXPECT_FALSE(parse_flat_json(text)) << text;
}

TEST(RedisFlatJsonTest, DeclinesWhatItLeavesToTheFullParser) {
  for (const std::string& text : std::vector<std::string>{
           "{\"a\":-1}",                          // negative: a signed integer
           "{\"a\":-0.5}",                        // negative real
           "{\"a\":18446744073709551616}",        // beyond 64 bits: a real
           "{\"a\":1e999}",                       // not finite
           "{\"a\":\"\\n\"}",                     // an escape
           "{\"a\\u0041\":1}",                    // an escape in a key
           "{\"a\":\"\xc3\xa9\"}",                // UTF-8 (checked by the full parser)
           "{\"a\":\"\xc3\x28\"}",                // invalid UTF-8
           "{\"a\":{\"b\":1}}",                   // a nested object
           "{\"a\":[1,2]}",                       // an array of scalars
           "{\"a\":[[]]}",                        // an array of arrays
           "{\"a\":[{\"b\":[]}]}",                // an array inside an array's object
           "{\"a\":[{\"b\":{}}]}",                // an object inside an array's object
           std::string("{\"a\":\"x\0y\"}", 11)})  // a control character in a string
    EXPECT_FALSE(parse_flat_json(text)) << text;
}

TEST(RedisFlatJsonTest, DeepOrHugeInputIsHandledWithoutRecursion) {
  EXPECT_FALSE(parse_flat_json(std::string(100000, '[') + std::string(100000, ']')));
  std::string deep;
  for (int i = 0; i < 50000; ++i) deep += "{\"a\":";
  deep += "1" + std::string(50000, '}');
  EXPECT_FALSE(parse_flat_json(deep));
  const std::string huge = "{\"a\":\"" + std::string(1 << 20, 'x') + "\"}";
  const auto flat = parse_flat_json(huge);
  ASSERT_TRUE(flat);
  EXPECT_EQ(flat->find("a")->text.size(), std::size_t{1} << 20);
}

}  // namespace
}  // namespace gpulock
