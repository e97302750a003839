// `gpulock __complete -- WORD…`: the candidates for the last word of a partial command line, one
// per line as "candidate<TAB>description", for the shell completion scripts in
// contrib/completion/. Commands and options come from the parser itself, so completion cannot
// drift from the CLI; lease ids, GPUs and job ids come from the live state. Hidden from --help.
#include <unistd.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

struct Candidate {
  std::string word;
  std::string description;
};

using Candidates = std::vector<Candidate>;

// One line, no tabs: descriptions are shown by zsh and fish beside the candidate.
std::string one_line(std::string text) {
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
  if (text.size() > 70) text = text.substr(0, 69) + "…";
  return text;
}

const CLI::Option* find_option(const CLI::App& command, const std::string& name) {
  for (const CLI::Option* option : command.get_options()) {
    const auto& longs = option->get_lnames();
    const auto& shorts = option->get_snames();
    if ((name.starts_with("--") &&
         std::find(longs.begin(), longs.end(), name.substr(2)) != longs.end()) ||
        (name.size() == 2 && name[0] == '-' &&
         std::find(shorts.begin(), shorts.end(), name.substr(1)) != shorts.end()))
      return option;
  }
  return nullptr;
}

bool takes_value(const CLI::Option& option) {
  return option.nonpositional() && option.get_type_size_max() > 0;
}

// The --backend the command line names, so that live state comes from the right pool.
std::string backend_in(const std::vector<std::string>& words) {
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--backend" && i + 1 < words.size()) return words[i + 1];
    if (words[i].starts_with("--backend=")) return words[i].substr(10);
  }
  return "";
}

// Fixed values from the option's check, as CLI11 names them in its type: "TEXT:{warn,kill}".
Candidates member_values(const CLI::Option& option) {
  Candidates out;
  const std::string type = option.get_type_name();
  const auto open = type.find('{');
  const auto close = type.find('}', open);
  if (open == std::string::npos || close == std::string::npos) return out;
  std::string list = type.substr(open + 1, close - open - 1);
  std::size_t start = 0;
  while (start <= list.size()) {
    const auto comma = list.find(',', start);
    const std::string value =
        list.substr(start, comma == std::string::npos ? comma : comma - start);
    if (!value.empty()) out.push_back({value, ""});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Candidates gpu_values(const std::string& backend) {
  Candidates out;
  GpuPool pool = open_pool(backend);
  for (const auto& g : pool.status().gpus) {
    const std::string state = g.reserved_for ? "reserved" : gpu_state_name(g.state);
    const std::string description = one_line(fmt::format("{}, {}", g.device.name, state));
    out.push_back({g.device.display_index(), description});
    out.push_back({g.device.uuid, fmt::format("GPU {}, {}", g.device.display_index(), state)});
  }
  return out;
}

Candidates host_values(const std::string& backend) {
  Candidates out{{"any", "any host of the pool"}};
  std::set<std::string> hosts;
  GpuPool pool = open_pool(backend);
  for (const auto& g : pool.pool_status().gpus)
    if (!g.host.empty()) hosts.insert(g.host);
  for (const auto& host : hosts) out.push_back({host, "host"});
  return out;
}

Candidates lease_values(const std::string& backend) {
  Candidates out;
  std::set<std::string> seen;
  GpuPool pool = open_pool(backend);
  for (const auto& g : pool.status().gpus) {
    if (!g.holder || !seen.insert(g.holder->lease_id).second) continue;
    const HolderInfo& h = *g.holder;
    out.push_back({h.lease_id,
                   one_line(fmt::format("{}{} {}", h.user,
                                        h.label.empty() ? "" : " [" + h.label + "]", h.command))});
  }
  return out;
}

// The caller's jobs that `command` takes: those not ended for cancel, ended ones for resubmit,
// any for the rest (logs, wait, submit --after).
Candidates job_values(const std::string& command) {
  Candidates out;
  for (const JobInfo& job : open_job_store().list()) {
    if (job.owner != ::geteuid() || !job.problem.empty()) continue;
    const bool ended = job_state_is_final(job.progress.state);
    if ((command == "cancel" && ended) || (command == "resubmit" && !ended)) continue;
    out.push_back({std::to_string(job.id),
                   one_line(fmt::format("{}{} {}", job_state_name(job.progress.state),
                                        job.spec.name.empty() ? "" : " [" + job.spec.name + "]",
                                        fmt::join(job.spec.command, " ")))});
  }
  return out;
}

// Values of an option; `current` is what is typed so far. Lists (--gpus 0,<TAB>) complete
// their last element, keeping what comes before it.
Candidates option_values(const CLI::Option& option, const std::string& current,
                         const std::string& backend) {
  const std::string name = option.get_lnames().empty() ? "" : option.get_lnames().front();
  Candidates values;
  std::string kept;
  if (name == "gpus" || name == "host" || name == "after" || name == "after-any") {
    const auto comma = current.rfind(',');
    if (comma != std::string::npos) kept = current.substr(0, comma + 1);
    values = name == "gpus"   ? gpu_values(backend)
             : name == "host" ? host_values(backend)
                              : job_values("submit");
  } else if (name == "backend") {
    values = {{"file", "lock files of this machine"}, {"redis://", "a Redis server's pool"}};
  } else if (name == "listen") {
    values = {{"127.0.0.1:9400", "loopback only (the default)"},
              {"0.0.0.0:9400", "every interface: anyone who can connect sees the page"}};
  } else {
    values = member_values(option);
  }
  for (auto& v : values) v.word = kept + v.word;
  return values;
}

Candidates option_candidates(const CLI::App& command) {
  Candidates out;
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_group().empty()) continue;  // hidden (run's --job): not for people
    const std::string description = one_line(option->get_description());
    for (const auto& name : option->get_lnames()) out.push_back({"--" + name, description});
    for (const auto& name : option->get_snames()) out.push_back({"-" + name, description});
  }
  return out;
}

Candidates candidates_for(CLI::App& app, const std::vector<std::string>& words) {
  const std::string current = words.empty() ? "" : words.back();
  const std::vector<std::string> before(words.begin(), words.end() - (words.empty() ? 0 : 1));
  CLI::App* command = nullptr;
  std::size_t i = 0;
  for (; i < before.size() && command == nullptr; ++i) {
    if (before[i].starts_with("-")) continue;  // a top-level option: --help, --version
    for (CLI::App* c : visible_commands(app))
      if (c->get_name() == before[i]) command = c;
    if (command == nullptr) return {};  // an unknown command: nothing to offer
  }
  if (command == nullptr) {
    if (current.starts_with("-")) return option_candidates(app);
    Candidates out;
    for (CLI::App* c : visible_commands(app))
      out.push_back({c->get_name(), one_line(c->get_description())});
    return out;
  }
  std::vector<std::string> after(before.begin() + static_cast<std::ptrdiff_t>(i), before.end());
  // A command of commands (`journal seal`): its words lead to the one named, else are offered.
  while (!after.empty() && !visible_commands(*command).empty()) {
    CLI::App* named = nullptr;
    for (CLI::App* c : visible_commands(*command))
      if (c->get_name() == after.front()) named = c;
    if (named == nullptr) return {};
    command = named;
    after.erase(after.begin());
  }
  if (!visible_commands(*command).empty() && !current.starts_with("-")) {
    Candidates out;
    for (CLI::App* c : visible_commands(*command))
      out.push_back({c->get_name(), one_line(c->get_description())});
    return out;
  }
  // After "--" comes the command `run` starts: the shell's own completion applies.
  if (std::find(after.begin(), after.end(), "--") != after.end()) return {};
  const std::string backend = backend_in(after);
  if (current.starts_with("--") && current.find('=') != std::string::npos) {
    const std::string name = current.substr(0, current.find('='));
    const CLI::Option* option = find_option(*command, name);
    if (option == nullptr || !takes_value(*option)) return {};
    Candidates out = option_values(*option, current.substr(name.size() + 1), backend);
    for (auto& c : out) c.word = name + "=" + c.word;
    return out;
  }
  if (!after.empty()) {
    const CLI::Option* previous = find_option(*command, after.back());
    if (previous != nullptr && takes_value(*previous))
      return option_values(*previous, current, backend);
  }
  if (current.starts_with("-")) return option_candidates(*command);
  for (const CLI::Option* option : command->get_options()) {
    if (!option->get_positional()) continue;
    if (option->get_name() == "lease_id") return lease_values(backend);
    if (option->get_name() == "id" || option->get_name() == "ids")
      return job_values(command->get_name());
  }
  return {};
}

}  // namespace

void add_complete_command(CLI::App& app, int* exit_status) {
  auto* command =
      app.add_subcommand("__complete", "Shell completion: candidates for the last word");
  command->group("");  // hidden: the completion scripts call it, people do not
  auto words = std::make_shared<std::vector<std::string>>();
  command->add_option("words", *words, "The command line after `gpulock`, partial word last");
  command->callback([&app, words, exit_status] {
    *exit_status = 0;
    const std::string current = words->empty() ? "" : words->back();
    Candidates candidates;
    try {
      candidates = candidates_for(app, *words);
    } catch (const std::exception&) {
      return;  // no live state (no GPUs, Redis down): nothing to offer, and no noise
    }
    for (const auto& c : candidates) {
      if (!c.word.starts_with(current)) continue;
      fmt::print("{}{}{}\n", c.word, c.description.empty() ? "" : "\t", c.description);
    }
  });
}

}  // namespace gpulock::cli
