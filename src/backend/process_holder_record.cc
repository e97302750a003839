// process_holder_record(): see process_holder_record.h.
#include "backend/process_holder_record.h"

#include "process/process_identity.h"
#include "util/unix_time.h"

namespace gpulock {

HolderRecord process_holder_record(const std::string& lease_id, uid_t uid, const std::string& user,
                                   const std::string& host, const LeaseRequest& request,
                                   std::chrono::system_clock::time_point started_at) {
  HolderRecord record;
  record.lease_id = lease_id;
  record.uid = uid;
  record.user = user;
  record.host = host;
  record.boot_id = boot_id();
  record.kind = HolderKind::kProcess;
  record.holder = self_process_id();
  record.command = request.command;
  record.label = request.label;
  record.started_at = unix_seconds(started_at);
  return record;
}

}  // namespace gpulock
