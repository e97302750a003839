// The label a job's lease carries ("job 56 NAME"), and the job id read back from one.
#include <cctype>
#include <string>
#include <string_view>

#include "gpulock/jobs.hpp"

namespace gpulock {

std::string job_lease_label(const std::string& job_id, const std::string& label) {
  return label.empty() ? "job " + job_id : "job " + job_id + " " + label;
}

std::string job_of_lease_label(std::string_view label) {
  constexpr std::string_view kPrefix = "job ";
  if (!label.starts_with(kPrefix)) return "";
  const std::string_view rest = label.substr(kPrefix.size());
  std::size_t digits = 0;
  while (digits < rest.size() && std::isdigit(static_cast<unsigned char>(rest[digits]))) ++digits;
  if (digits == 0 || digits > 19 || (digits < rest.size() && rest[digits] != ' ')) return "";
  return std::string(rest.substr(0, digits));
}

}  // namespace gpulock
