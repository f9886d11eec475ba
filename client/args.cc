#include "client/args.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace trainyard::cli {
namespace {

const FlagSpec* FindFlag(const std::vector<const std::vector<FlagSpec>*>& sets,
                         const std::string& name, char short_name) {
  for (const auto* set : sets) {
    for (const FlagSpec& flag : *set) {
      if (short_name != '\0' ? flag.short_name == short_name : flag.name == name) return &flag;
    }
  }
  return nullptr;
}

// `text` broken into lines of at most `width` characters at spaces, each ending in '\n'.
std::string Wrap(const std::string& text, size_t width) {
  std::string out;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, line, "\n");
  return out;
}

// Up to and with the first ". " (the whole text when there is none).
std::string FirstSentence(const std::string& text) {
  const size_t end = text.find(". ");
  return end == std::string::npos ? text : text.substr(0, end + 1);
}

// `left` padded to `column` characters, then `text` wrapped so that no line passes 100
// characters, its later lines indented to `column` (a too long `left` gets a line of its own).
std::string Hanging(const std::string& left, const std::string& text, size_t column) {
  const std::string pad(column, ' ');
  const std::string wrapped = Wrap(text, 100 - column);
  std::string out =
      left.size() < column ? left + std::string(column - left.size(), ' ') : left + "\n" + pad;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(wrapped, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, first ? "" : pad, line, "\n");
    first = false;
  }
  return out;
}

std::string FlagLine(const FlagSpec& flag) {
  std::string left = flag.short_name != '\0'
                         ? absl::StrCat("-", std::string(1, flag.short_name), ", --", flag.name)
                         : absl::StrCat("    --", flag.name);
  if (flag.takes_value) absl::StrAppend(&left, " ", flag.value_name);
  return Hanging(absl::StrCat("  ", left), flag.help, 31);
}

}  // namespace

std::string ParsedArgs::Get(const std::string& flag, const std::string& fallback) const {
  auto it = flags.find(flag);
  return it == flags.end() ? fallback : it->second;
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<FlagSpec>& global_flags,
                                     const std::vector<CommandSpec>& commands,
                                     const std::vector<std::string>& argv) {
  ParsedArgs parsed;
  const CommandSpec* command = nullptr;
  bool flags_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    const bool is_flag = !flags_done && arg.size() > 1 && arg[0] == '-';
    if (!is_flag) {
      if (command == nullptr && parsed.command.empty()) {
        if (arg == "help") {
          parsed.help = true;
          continue;
        }
        for (const CommandSpec& c : commands) {
          if (c.name == arg) command = &c;
        }
        if (command == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("unknown command '", arg, "' (see 'trainyard help')"));
        }
        parsed.command = arg;
        continue;
      }
      parsed.args.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      parsed.help = true;
      continue;
    }
    std::string name;
    std::string value;
    bool has_value = false;
    char short_name = '\0';
    if (absl::StartsWith(arg, "--")) {
      name = arg.substr(2);
      const size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
    } else {
      if (arg.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag '", arg, "' (long flags take two dashes: '-", arg, "')"));
      }
      short_name = arg[1];
    }
    std::vector<const std::vector<FlagSpec>*> sets = {&global_flags};
    if (command != nullptr) sets.push_back(&command->flags);
    const FlagSpec* flag = FindFlag(sets, name, short_name);
    if (flag == nullptr) {
      // The daemons' flags are written with '_': the CLI's with '-'.
      std::string dashed = name;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      if (dashed != name && FindFlag(sets, dashed, '\0') != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag '", arg, "': did you mean '--", dashed, "'?"));
      }
      const std::string where = command != nullptr
                                    ? absl::StrCat(" for '", command->name, "' (see 'trainyard ",
                                                   command->name, " --help')")
                                    : " (see 'trainyard help')";
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "'", where));
    }
    if (flag->takes_value) {
      if (!has_value) {
        if (i + 1 >= argv.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("flag --", flag->name, " needs a value (", flag->value_name, ")"));
        }
        value = argv[++i];
      }
    } else {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrCat("flag --", flag->name, " takes no value"));
      }
      if (!has_value) value = "true";
      if (value == "false") {
        parsed.flags.erase(flag->name);
        continue;
      }
    }
    parsed.flags[flag->name] = value;
  }
  if (parsed.help) {
    // `trainyard help CMD` names the command as the first argument.
    if (command == nullptr && !parsed.args.empty()) {
      for (const CommandSpec& c : commands) {
        if (c.name == parsed.args[0]) parsed.command = c.name;
      }
    }
    return parsed;
  }
  if (command == nullptr) return parsed;
  const int n = static_cast<int>(parsed.args.size());
  if (n < command->min_args) {
    return absl::InvalidArgumentError(absl::StrCat("'", command->name, "' needs ", command->args,
                                                   " (see 'trainyard ", command->name,
                                                   " --help')"));
  }
  if (n > command->max_args) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", parsed.args[command->max_args], "' for '", command->name, "'"));
  }
  return parsed;
}

std::string MainHelp(const std::string& program, const std::vector<FlagSpec>& global_flags,
                     const std::vector<CommandSpec>& commands) {
  std::string out = absl::StrCat("Usage: ", program, " COMMAND [flags] [args]\n\nCommands:\n");
  for (const CommandSpec& c : commands) {
    absl::StrAppend(&out,
                    Hanging(absl::StrCat("  ", c.args.empty() ? c.name : c.name + " " + c.args),
                            FirstSentence(c.summary), 37));
  }
  absl::StrAppend(&out, "\nGlobal flags:\n");
  for (const FlagSpec& flag : global_flags) absl::StrAppend(&out, FlagLine(flag));
  absl::StrAppend(&out, "  -h, --help                   show help (also: ", program,
                  " COMMAND --help)\n");
  return out;
}

namespace {

// The help of `name` (a command, or "command action"): usage, summary, `extra` (a command's list
// of actions), its flags, and the global flags unless `local`.
std::string Help(const std::string& program, const std::vector<FlagSpec>& global_flags,
                 const std::string& name, const std::string& args, const std::string& summary,
                 const std::vector<const FlagSpec*>& flags, const std::string& extra, bool local) {
  std::string out = absl::StrCat("Usage: ", program, " ", name);
  if (!flags.empty()) absl::StrAppend(&out, " [flags]");
  if (!args.empty()) absl::StrAppend(&out, " ", args);
  absl::StrAppend(&out, "\n\n", Wrap(summary, 100), extra);
  if (!flags.empty()) {
    absl::StrAppend(&out, "\nFlags:\n");
    for (const FlagSpec* flag : flags) absl::StrAppend(&out, FlagLine(*flag));
  }
  if (!local) {
    absl::StrAppend(&out, "\nGlobal flags:\n");
    for (const FlagSpec& flag : global_flags) absl::StrAppend(&out, FlagLine(flag));
  }
  return out;
}

}  // namespace

std::string CommandHelp(const std::string& program, const std::vector<FlagSpec>& global_flags,
                        const CommandSpec& command, bool local) {
  std::string actions;
  if (!command.actions.empty()) {
    actions = absl::StrCat("\nActions (", program, " ", command.name, " ACTION --help for one):\n");
    for (const ActionSpec& a : command.actions) {
      absl::StrAppend(&actions,
                      Hanging(absl::StrCat("  ", a.args.empty() ? a.name : a.name + " " + a.args),
                              FirstSentence(a.summary), 31));
    }
  }
  std::vector<const FlagSpec*> flags;
  for (const FlagSpec& flag : command.flags) flags.push_back(&flag);
  return Help(program, global_flags, command.name, command.args, command.summary, flags, actions,
              local);
}

const ActionSpec* FindAction(const CommandSpec& command, const std::string& name) {
  for (const ActionSpec& a : command.actions) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::string ActionHelp(const std::string& program, const std::vector<FlagSpec>& global_flags,
                       const CommandSpec& command, const ActionSpec& action, bool local) {
  std::vector<const FlagSpec*> flags;
  for (const FlagSpec& flag : command.flags) {
    if (std::find(action.flags.begin(), action.flags.end(), flag.name) != action.flags.end()) {
      flags.push_back(&flag);
    }
  }
  return Help(program, global_flags, command.name + " " + action.name, action.args, action.summary,
              flags, "", local);
}

}  // namespace trainyard::cli
