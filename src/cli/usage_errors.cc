// Better messages for command lines CLI11 rejects: names the unknown command or option and
// suggests the closest valid one (`gpulock rn` → "unknown command 'rn'; did you mean 'run'?").
#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

// Edit distance counting an insertion, a deletion, a substitution or a swap of two neighbouring
// characters as one edit (optimal string alignment), so "stauts" is one edit from "status".
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

bool looks_like_number(const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  return std::all_of(word.begin() + 1, word.end(),
                     [](unsigned char c) { return std::isdigit(c) || c == '.'; });
}

// The option names a command accepts: "--count", "-n", … (and --help, -h).
std::vector<std::string> option_names(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* option : command.get_options()) {
    for (const auto& name : option->get_lnames()) names.push_back("--" + name);
    for (const auto& name : option->get_snames()) names.push_back("-" + name);
  }
  return names;
}

std::string with_suggestion(std::string message, const std::string& word,
                            const std::vector<std::string>& candidates) {
  const std::string suggestion = closest_name(word, candidates);
  if (!suggestion.empty()) message += fmt::format("; did you mean '{}'?", suggestion);
  return message;
}

}  // namespace

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  // A unique candidate that starts with the word ("stat" → "status") wins outright.
  std::vector<std::string> prefixed;
  for (const auto& c : candidates)
    if (word.size() >= 2 && c.starts_with(word)) prefixed.push_back(c);
  if (prefixed.size() == 1) return prefixed.front();
  std::string best;
  std::size_t best_distance = 0;
  for (const auto& c : candidates) {
    const std::size_t distance = edit_distance(word, c);
    if (best.empty() || distance < best_distance) {
      best = c;
      best_distance = distance;
    }
  }
  // Close enough to be a typo: at most a third of the word's letters, and at least one kept.
  const std::size_t allowed = std::max<std::size_t>(1, word.size() / 3);
  if (best.empty() || best_distance > allowed || best_distance >= best.size()) return "";
  return best;
}

std::vector<CLI::App*> visible_commands(CLI::App& app) {
  return app.get_subcommands([](CLI::App* c) { return !c->get_group().empty(); });
}

std::string explain_usage_error(CLI::App& app, const std::vector<std::string>& args) {
  CLI::App* command = nullptr;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") return "";
    if (arg.starts_with("-")) {
      const std::string name = arg.substr(0, arg.find('='));
      const auto top = option_names(app);
      if (std::find(top.begin(), top.end(), name) == top.end()) {
        return with_suggestion(fmt::format("unknown option '{}'", name), name, top);
      }
      continue;
    }
    for (CLI::App* c : app.get_subcommands([](CLI::App*) { return true; }))
      if (c->get_name() == arg) command = c;
    if (command == nullptr) {
      std::vector<std::string> names;
      for (const auto* c : visible_commands(app)) names.push_back(c->get_name());
      return with_suggestion(fmt::format("unknown command '{}'", arg), arg, names);
    }
    break;
  }
  if (command == nullptr) return "";
  const auto names = option_names(*command);
  for (++i; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || looks_like_number(arg)) continue;
    // "--name=value" and "-n2" (a short option with its value attached).
    const std::string name =
        arg.starts_with("--") ? arg.substr(0, arg.find('=')) : arg.substr(0, 2);
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    return with_suggestion(
        fmt::format("unknown option '{}' for 'gpulock {}'", name, command->get_name()), name,
        names);
  }
  return "";
}

}  // namespace gpulock::cli
