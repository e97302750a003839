// Ticket: a waiting request as it is registered in the machine's queue directory.
//
// A waiter writes its ticket once, at registration, and keeps the file locked while it waits;
// everyone else reads it to plan the queue. Anyone could plant a file in the shared queue
// directory, so a ticket read back is untrusted: parse_ticket() validates every field and bounds
// every string and list, and returns nullopt for anything malformed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpulock/queue.hpp"
#include "process/process_identity.h"
#include "queue/ticket_id.h"

namespace gpulock {

struct Ticket {
  TicketId id;            // make_lease_id(): also names the files
  std::uint64_t seq = 0;  // arrival order on this machine
  uid_t uid = 0;
  std::string user;
  ProcessId process;       // the waiting process
  double enqueued_at = 0;  // seconds since the Unix epoch
  Priority priority = Priority::kNormal;
  unsigned needed = 1;
  bool named_gpus = false;  // the request named its GPUs (needs all candidates)
  // Registered while its user had max_waiting requests in the queue: it waits outside the
  // queue's order until there is room, then registers again at the back (a fresh seq).
  bool entered_over_limit = false;
  std::vector<std::string> candidates;  // UUIDs it may ever use, in preference order
  // Health filters, for other processes to judge which free GPUs this request can use now.
  std::optional<std::uint64_t> min_free_memory_bytes;
  std::optional<unsigned> max_utilization_percent;
  std::optional<double> max_power_watts;
  bool allow_foreign_processes = false;
  std::string label;
  std::string command;
  // A shared request (several jobs per GPU by memory): the memory units it wants on each GPU,
  // or else 1/shared_slots of each GPU; both 0 for a request of whole GPUs.
  std::uint32_t shared_units = 0;
  std::uint32_t shared_slots = 0;
  bool spread = false;  // shared: the emptiest GPUs first
  bool shared() const { return shared_units > 0 || shared_slots > 0; }
};

// At most this many memory units (or slots) per GPU in a shared request (2 TiB of 256 MiB).
inline constexpr std::uint32_t kMaxSharedUnits = 8192;

// At most this many bytes are read from a ticket file.
inline constexpr std::size_t kMaxTicketSize = 64 * 1024;

std::string serialize_ticket(const Ticket& ticket);
// Reads what serialize_ticket() writes without building a JSON document, and anything else
// through nlohmann's full parser, with the same checks.
std::optional<Ticket> parse_ticket(std::string_view bytes);

// For tests: the same reading through the full JSON parser alone, and whether the fast reader of
// tickets in the form serialize_ticket() writes accepts `bytes` (parse_ticket() then uses it).
std::optional<Ticket> parse_ticket_with_full_parser(std::string_view bytes);
bool ticket_is_canonical(std::string_view bytes);

}  // namespace gpulock
