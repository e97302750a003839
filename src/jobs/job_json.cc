// jobs_to_json(): the document of `gpulock jobs --json` (docs/jobs.md), also gpulock.jobs()'s.
#include <nlohmann/json.hpp>

#include "gpulock/jobs.hpp"

namespace gpulock {
namespace {

using json = nlohmann::json;

json job_json(const JobInfo& job) {
  json j{{"id", job.id},
         {"user", job.owner_name},
         {"uid", job.owner},
         {"directory", job.directory.string()}};
  if (!job.problem.empty()) {
    j["problem"] = job.problem;
    return j;
  }
  const auto& p = job.progress;
  j["name"] = job.spec.name;
  j["state"] = job_state_name(p.state);
  j["command"] = job.spec.command;
  j["lease_options"] = job.spec.lease_options;
  j["working_directory"] = job.spec.working_directory;
  j["submitted"] = job.spec.submitted_unix;
  j["after"] = job.spec.after;
  j["after_any"] = job.spec.after_any;
  j["resubmitted_from"] =
      job.spec.resubmitted_from ? json(job.spec.resubmitted_from) : json(nullptr);
  j["begin"] = job.spec.begin_unix ? json(job.spec.begin_unix) : json(nullptr);
  j["started"] = p.started_unix ? json(p.started_unix) : json(nullptr);
  j["ended"] = p.ended_unix ? json(p.ended_unix) : json(nullptr);
  j["lease_id"] = p.lease_id.empty() ? json(nullptr) : json(p.lease_id);
  j["gpus"] = p.gpus;
  j["exit_status"] = p.exit_status ? json(*p.exit_status) : json(nullptr);
  j["reason"] = p.reason;
  j["stdout"] = (job.directory / "stdout").string();
  j["stderr"] = (job.directory / "stderr").string();
  return j;
}

}  // namespace

std::string jobs_to_json(const std::vector<JobInfo>& jobs) {
  json list = json::array();
  for (const auto& job : jobs) list.push_back(job_json(job));
  return json{{"jobs", list}}.dump(2);
}

}  // namespace gpulock
