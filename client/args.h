#ifndef TRAINYARD_CLIENT_ARGS_H_
#define TRAINYARD_CLIENT_ARGS_H_

// A small command-line parser for `trainyard COMMAND [flags] [args]`: subcommands with their own
// flags, global flags accepted anywhere, `--flag value`, `--flag=value`, `-f`, `-o json`, `--`
// to end flags, and generated help text.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard::cli {

struct FlagSpec {
  std::string name;        // long name without dashes: "coordinator"
  char short_name = '\0';  // 'o' for -o; '\0' for none
  bool takes_value = false;
  std::string value_name;  // shown in help: "ADDR"
  std::string help;
};

// One action of a command that has several (`data pack`, `search submit`): its first argument
// names it.
struct ActionSpec {
  std::string name;                // "pack"
  std::string args;                // its arguments in help: "PREFIX INPUT..."
  std::string summary;             // what `CMD ACTION --help` says
  std::vector<std::string> flags;  // the names of the command's flags that apply to it
};

struct CommandSpec {
  std::string name;
  std::string args;     // positional arguments in help: "FILE", "JOB"
  std::string summary;  // what `CMD --help` says (wrapped to the terminal's 100 columns)
  std::vector<FlagSpec> flags;
  int min_args = 0;
  int max_args = 0;
  std::vector<ActionSpec> actions;  // empty: a command without actions
};

struct ParsedArgs {
  std::string command;  // empty: none given
  bool help = false;    // --help / -h / `help [CMD]` (command then names what to explain)
  std::map<std::string, std::string> flags;  // long name -> value ("true" for switches)
  std::vector<std::string> args;

  bool Has(const std::string& flag) const { return flags.count(flag) > 0; }
  std::string Get(const std::string& flag, const std::string& fallback = "") const;
};

// Parses argv (without the program name). INVALID_ARGUMENT with a message for people for an
// unknown command or flag, a missing flag value, or a wrong number of arguments (not checked
// when help is asked for).
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<FlagSpec>& global_flags,
                                     const std::vector<CommandSpec>& commands,
                                     const std::vector<std::string>& argv);

// `trainyard help`: every command, by the first sentence of its summary, and the global flags.
std::string MainHelp(const std::string& program, const std::vector<FlagSpec>& global_flags,
                     const std::vector<CommandSpec>& commands);
// `trainyard CMD --help`: the summary wrapped to 100 columns, its actions (each by the first
// sentence of its summary), the command's flags, and the global flags unless `local` (a command
// that runs on this machine alone: they do not apply).
std::string CommandHelp(const std::string& program, const std::vector<FlagSpec>& global_flags,
                        const CommandSpec& command, bool local = false);
// `trainyard CMD ACTION --help`: the action's usage, summary and the flags that apply to it.
std::string ActionHelp(const std::string& program, const std::vector<FlagSpec>& global_flags,
                       const CommandSpec& command, const ActionSpec& action, bool local = false);
// The action of `command` named `name`; nullptr when it has none of that name.
const ActionSpec* FindAction(const CommandSpec& command, const std::string& name);

}  // namespace trainyard::cli

#endif  // TRAINYARD_CLIENT_ARGS_H_
