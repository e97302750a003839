// The part of a Redis pool a request may be served from: the hosts its --host names (this host
// by default, every host for `any`) and, among their GPUs, those its --gpus names. Shared by the
// exclusive and the shared acquire, so that both read a request's scope the same way.
#pragma once

#include <string>
#include <vector>

#include "gpulock/request.hpp"
#include "redis/redis_backend.h"

namespace gpulock {

struct RequestHosts {
  bool any_host = false;           // `--host any`: every host of the pool
  std::vector<std::string> hosts;  // the hosts named, without repeats (this host if none)
  bool one_host = false;           // exactly one host may serve it
  std::string where;               // how messages name them: "this machine", "host x", ...
};

// The hosts `request` may be served from. Throws kInvalidArgument when several hosts may serve
// it and it names a GPU by index (an index means a different GPU on each host).
RequestHosts request_hosts(const LeaseRequest& request, const std::string& this_host);

// The GPUs of `gpus` that may serve `request`: those on its hosts, or the ones it names there
// (then all of one host, else kInvalidArgument; one it names that is not there is an error of
// resolve_explicit()).
std::vector<const RedisBackend::Gpu*> request_gpus(const std::vector<RedisBackend::Gpu>& gpus,
                                                   const RequestHosts& scope,
                                                   const LeaseRequest& request);

}  // namespace gpulock
