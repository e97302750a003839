// request_hosts() and request_gpus(): which hosts and GPUs of a Redis pool may serve a request.
#include "redis/redis_request_scope.h"

#include <algorithm>

#include <fmt/format.h>

#include "backend/request_checks.h"
#include "gpulock/error.hpp"
#include "util/strings.h"

namespace gpulock {
namespace {

bool is_uuid_like(const std::string& name) {
  return starts_with_ignoring_case(name, "GPU-") || starts_with_ignoring_case(name, "MIG-");
}

}  // namespace

RequestHosts request_hosts(const LeaseRequest& request, const std::string& this_host) {
  RequestHosts scope;
  for (const auto& host : request.hosts) {
    if (host == "any") {
      scope.any_host = true;
    } else if (std::find(scope.hosts.begin(), scope.hosts.end(), host) == scope.hosts.end()) {
      scope.hosts.push_back(host);
    }
  }
  if (!scope.any_host && scope.hosts.empty()) scope.hosts.push_back(this_host);
  scope.one_host = !scope.any_host && scope.hosts.size() == 1;
  if (!scope.one_host)
    for (const auto& name : request.gpus)
      if (!is_uuid_like(name))
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("GPU '{}': name GPUs by UUID when several hosts may serve the "
                                "request (an index means a different GPU on each host)",
                                sanitize_for_display(name, 64)));
  scope.where = !scope.one_host               ? "the pool's hosts"
                : scope.hosts[0] == this_host ? "this machine"
                                              : "host " + scope.hosts[0];
  return scope;
}

std::vector<const RedisBackend::Gpu*> request_gpus(const std::vector<RedisBackend::Gpu>& gpus,
                                                   const RequestHosts& scope,
                                                   const LeaseRequest& request) {
  std::vector<const RedisBackend::Gpu*> in_scope;
  for (const RedisBackend::Gpu& g : gpus)
    if (scope.any_host ||
        std::find(scope.hosts.begin(), scope.hosts.end(), g.host) != scope.hosts.end())
      in_scope.push_back(&g);
  if (request.gpus.empty()) return in_scope;
  std::vector<Device> devices;
  for (const RedisBackend::Gpu* g : in_scope) devices.push_back(g->device);
  std::vector<const RedisBackend::Gpu*> named;
  for (const Device* d : resolve_explicit(devices, request.gpus, scope.where))
    named.push_back(in_scope[static_cast<std::size_t>(d - devices.data())]);
  for (const RedisBackend::Gpu* g : named)
    if (g->host != named.front()->host)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("the GPUs named are on hosts {} and {}: a lease covers GPUs "
                              "of one host",
                              named.front()->host, g->host));
  return named;
}

}  // namespace gpulock
