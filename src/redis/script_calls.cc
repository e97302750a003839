// The acquire scripts' ARGV and replies: positions written once, beside the .lua they match.
#include "redis/script_calls.h"

namespace gpulock {
namespace {

// The expected version a resent acquire carries: no pool has it.
constexpr const char* kNoVersion = "resent";

std::string text_of(const RedisValue& reply, std::size_t i) {
  return i < reply.elements.size() ? reply.elements[i].text : std::string();
}

// {outcome, token, ...}: the outcome and the token; "" for a reply that is no array.
AcquireReply outcome_of(const RedisValue& reply) {
  AcquireReply parsed;
  if (reply.type != RedisValue::Type::kArray || reply.elements.empty()) return parsed;
  parsed.outcome = reply.elements[0].text;
  parsed.token_text = text_of(reply, 1);
  return parsed;
}

}  // namespace

AcquireArgs AcquireArgs::resent() const {
  AcquireArgs again = *this;
  again.expected_version = kNoVersion;
  again.to_wake.clear();
  return again;
}

std::vector<std::string> AcquireArgs::argv() const {
  std::string wake;
  for (const std::string& id : to_wake) wake += id + "\n";
  std::vector<std::string> argv{lease_id,
                                std::to_string(ttl.count()),
                                expected_version,
                                std::to_string(gpus.size()),
                                "all",
                                record_json,
                                user,
                                gpu_host,
                                ticket_id,
                                limited ? "1" : "0",
                                std::move(wake)};
  argv.insert(argv.end(), gpus.begin(), gpus.end());  // from ARGV[12]
  return argv;
}

AcquireSharedArgs AcquireSharedArgs::resent() const {
  AcquireSharedArgs again = *this;
  for (SharedOffer& offer : again.offers) offer.capacity_units = 0;
  return again;
}

std::vector<std::string> AcquireSharedArgs::argv() const {
  std::vector<std::string> argv{lease_id,
                                std::to_string(ttl.count()),
                                record_json,
                                user,
                                std::to_string(needed),
                                cap ? std::to_string(*cap) : std::string(),
                                spread ? "1" : "0",
                                limited ? "1" : "0"};
  for (const SharedOffer& offer : offers) {  // from ARGV[9], four each
    argv.push_back(offer.uuid);
    argv.push_back(offer.host);
    argv.push_back(std::to_string(offer.capacity_units));
    argv.push_back(std::to_string(offer.wanted_units));
  }
  return argv;
}

AcquireReply parse_acquire_reply(const RedisValue& reply) {
  AcquireReply parsed = outcome_of(reply);
  if (parsed.outcome == "ok")  // {'ok', token, uuid...}
    for (std::size_t i = 2; i < reply.elements.size(); ++i)
      parsed.uuids.push_back(reply.elements[i].text);
  return parsed;
}

AcquireReply parse_acquire_shared_reply(const RedisValue& reply) {
  AcquireReply parsed = outcome_of(reply);
  if (parsed.outcome != "ok") return parsed;
  if (reply.elements.size() % 2 != 0) {  // {'ok', token, uuid, units, ...}
    parsed.outcome.clear();
    return parsed;
  }
  for (std::size_t i = 2; i + 1 < reply.elements.size(); i += 2) {
    parsed.uuids.push_back(reply.elements[i].text);
    parsed.units.push_back(reply.elements[i + 1].text);
  }
  return parsed;
}

std::vector<std::string> EnterArgs::argv() const {
  return {ticket_id,        std::to_string(ttl.count()), body,          user, hosts,
          snapshot_version, behind_everyone ? "1" : "",  snapshot_frees};
}

EnterReply parse_enter_reply(const RedisValue& reply) {
  EnterReply parsed;  // {seq, unchanged, version, now_us, queued}
  if (reply.type != RedisValue::Type::kArray || reply.elements.size() < 5) return parsed;
  parsed.complete = true;
  parsed.unchanged = reply.elements[1].integer == 1;
  parsed.version = reply.elements[2].text;
  parsed.server_us = reply.elements[3].text;
  parsed.queued = reply.elements[4].integer;
  return parsed;
}

}  // namespace gpulock
