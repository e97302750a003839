// TicketId: the id of a waiting request (16 lowercase hex digits, see make_lease_id), kept inline.
//
// A plan lists every waiter of the machine, thousands in a sweep. std::string holds at most 15
// characters without a heap allocation, so 16-digit ids as std::string cost an allocation and a
// free per waiter and per copy at every plan, which was most of a plan's cost at 4,000 waiters.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace gpulock {

class TicketId {
 public:
  static constexpr std::size_t kMaxLength = 16;

  TicketId() = default;
  // Text longer than kMaxLength is no ticket id (see is_lease_id): it makes an empty TicketId,
  // which matches no ticket.
  TicketId(std::string_view text) {  // NOLINT(google-explicit-constructor): ids are text
    if (text.size() > kMaxLength) return;
    std::memcpy(bytes_, text.data(), text.size());
    // The terminating NUL and the size in one store, as a copy reads them: a copy that reads
    // bytes written by two stores waits for both (a plan copies thousands of ids).
    const char tail[2] = {'\0', static_cast<char>(text.size())};
    std::memcpy(&bytes_[kMaxLength], tail, sizeof tail);
  }
  TicketId(const std::string& text) : TicketId(std::string_view(text)) {}  // NOLINT
  TicketId(const char* text) : TicketId(std::string_view(text)) {}         // NOLINT

  std::string_view view() const { return {bytes_, size()}; }
  operator std::string_view() const { return view(); }  // NOLINT(google-explicit-constructor)
  std::string str() const { return std::string(view()); }
  // For the few places that want a std::string (file names, Redis arguments): one allocation.
  operator std::string() const { return str(); }  // NOLINT(google-explicit-constructor)
  const char* c_str() const { return bytes_; }    // NUL-terminated
  std::size_t size() const { return static_cast<std::uint8_t>(bytes_[kSizeAt]); }
  bool empty() const { return size() == 0; }
  void clear() { *this = TicketId(); }

  // The characters past the size are always 0: one compare of fixed size, inlined, not a call
  // to memcmp (a plan looks for its own ticket among thousands).
  friend bool operator==(const TicketId& a, const TicketId& b) {
    return std::memcmp(a.bytes_, b.bytes_, sizeof a.bytes_) == 0;
  }
  friend bool operator==(const TicketId& a, std::string_view b) { return a.view() == b; }
  friend bool operator==(const TicketId& a, const std::string& b) { return a.view() == b; }
  friend auto operator<=>(const TicketId& a, const TicketId& b) { return a.view() <=> b.view(); }

 private:
  // The characters, NUL-padded, then a NUL, then the size.
  static constexpr std::size_t kSizeAt = kMaxLength + 1;
  char bytes_[kMaxLength + 2] = {};
};

}  // namespace gpulock

template <>
struct fmt::formatter<gpulock::TicketId> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(const gpulock::TicketId& id, Context& context) const {
    return fmt::formatter<std::string_view>::format(id.view(), context);
  }
};
