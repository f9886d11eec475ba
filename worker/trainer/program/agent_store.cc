#include "worker/trainer/program/agent_store.h"

#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/run_command.h"

namespace trainyard::trainer::program {
namespace {

// Prints the version in the version.py of the torch that this Python would import (the
// program's folder first on its path, as for `python3 train.py`), without importing torch;
// nothing when it has none.
constexpr char kTorchVersionProbe[] = R"(
import importlib.util, re, sys
sys.path.insert(0, sys.argv[1])
spec = importlib.util.find_spec("torch")
for folder in (spec.submodule_search_locations or []) if spec else []:
    try:
        with open(folder + "/version.py") as f:
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    except OSError:
        continue
    if found:
        print(found.group(1))
        break
)";

// major.minor.patch of a version, each part's digits ("1.13.0a0" -> 1, 13, 0); false when the
// version does not start so.
bool Release(absl::string_view version, int parts[3]) {
  static const std::regex pattern(R"(^(\d{1,6})\.(\d{1,6})\.(\d{1,6}))");
  std::cmatch m;
  const std::string text(version);
  if (!std::regex_search(text.c_str(), m, pattern)) return false;
  for (int i = 0; i < 3; ++i) parts[i] = std::stoi(m[i + 1].str());
  return true;
}

}  // namespace

bool IsPython(absl::string_view file) {
  const size_t slash = file.rfind('/');
  const std::string name(slash == absl::string_view::npos ? file : file.substr(slash + 1));
  static const std::regex pattern(R"(^python(\d+(\.\d+)?)?$)");
  return std::regex_match(name, pattern);
}

absl::StatusOr<std::string> ProgramTorchVersion(
    const std::string& python, const std::vector<std::pair<std::string, std::string>>& env,
    const std::string& workdir) {
  std::vector<std::string> environment;
  for (const auto& [name, value] : env) environment.push_back(absl::StrCat(name, "=", value));
  absl::StatusOr<CommandResult> probe =
      RunCommand({python, "-c", kTorchVersionProbe, workdir}, environment, absl::Seconds(20));
  if (!probe.ok()) return probe.status();
  if (!probe->ok()) {
    return absl::UnavailableError(
        absl::StrCat("asking ", python, " for its torch: ", DescribeCommandEnd(*probe)));
  }
  return std::string(absl::StripAsciiWhitespace(probe->out));
}

bool SameTorchRelease(absl::string_view a, absl::string_view b) {
  int x[3];
  int y[3];
  return Release(a, x) && Release(b, y) && x[0] == y[0] && x[1] == y[1] && x[2] == y[2];
}

}  // namespace trainyard::trainer::program
