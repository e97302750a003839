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
    std::memcpy(chars_, text.data(), text.size());
    size_ = static_cast<std::uint8_t>(text.size());
  }
  TicketId(const std::string& text) : TicketId(std::string_view(text)) {}  // NOLINT
  TicketId(const char* text) : TicketId(std::string_view(text)) {}         // NOLINT

  std::string_view view() const { return {chars_, size_}; }
  operator std::string_view() const { return view(); }  // NOLINT(google-explicit-constructor)
  std::string str() const { return std::string(view()); }
  // For the few places that want a std::string (file names, Redis arguments): one allocation.
  operator std::string() const { return str(); }  // NOLINT(google-explicit-constructor)
  const char* c_str() const { return chars_; }    // NUL-terminated
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() { *this = TicketId(); }

  // The bytes past size_ are always 0: one compare of fixed size, inlined, not a call to memcmp
  // (a plan looks for its own ticket among thousands).
  friend bool operator==(const TicketId& a, const TicketId& b) {
    return a.size_ == b.size_ && std::memcmp(a.chars_, b.chars_, kMaxLength) == 0;
  }
  friend bool operator==(const TicketId& a, std::string_view b) { return a.view() == b; }
  friend bool operator==(const TicketId& a, const std::string& b) { return a.view() == b; }
  friend auto operator<=>(const TicketId& a, const TicketId& b) { return a.view() <=> b.view(); }

 private:
  char chars_[kMaxLength + 1] = {};
  std::uint8_t size_ = 0;
};

}  // namespace gpulock

template <>
struct fmt::formatter<gpulock::TicketId> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(const gpulock::TicketId& id, Context& context) const {
    return fmt::formatter<std::string_view>::format(id.view(), context);
  }
};
