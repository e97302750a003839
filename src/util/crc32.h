// CRC-32 (the IEEE 802.3 polynomial, as zlib computes it), for checksummed journal lines.
#pragma once

#include <cstdint>
#include <string_view>

namespace gpulock {

std::uint32_t crc32(std::string_view bytes) noexcept;

}  // namespace gpulock
