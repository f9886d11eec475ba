// The token commands: token create, list, revoke.

#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/format.h"
#include "client/views.h"
#include "common/clock.h"

namespace trainyard::cli {

int Client::Token() {
  const std::string& action = args_.args[0];
  const std::string arg = args_.args.size() > 1 ? args_.args[1] : "";
  if (action == "create") {
    if (arg.empty()) {
      std::cerr << "error: token create needs NAME\n";
      return kExitUsage;
    }
    v1::CreateTokenRequest request;
    request.set_name(arg);
    const std::string role = args_.Get("role", "user");
    if (role == "admin") {
      request.set_role(v1::TOKEN_ADMIN);
    } else if (role == "user") {
      request.set_role(v1::TOKEN_USER);
    } else if (role == "agent") {
      request.set_role(v1::TOKEN_AGENT);
    } else {
      std::cerr << "error: --role takes admin, user or agent, got '" << role << "'\n";
      return kExitUsage;
    }
    if (args_.Has("ttl")) {
      absl::Duration ttl;
      std::string text = args_.Get("ttl");
      // absl durations know h, m, s; days are what people give for tokens.
      if (int64_t days = 0;
          absl::EndsWith(text, "d") &&
          absl::SimpleAtoi(absl::string_view(text).substr(0, text.size() - 1), &days)) {
        text = absl::StrCat(days * 24, "h");
      }
      if (!absl::ParseDuration(text, &ttl) || ttl <= absl::ZeroDuration()) {
        std::cerr << "error: --ttl takes a positive duration (30d, 12h), got '" << args_.Get("ttl")
                  << "'\n";
        return kExitUsage;
      }
      request.set_ttl_seconds(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
    }
    v1::CreateTokenResponse response;
    if (std::optional<int> failed =
            Call(*admin_, &v1::AdminService::Stub::CreateToken, request, &response)) {
      return *failed;
    }
    if (Json()) {
      std::cout << ToJson(response);
    } else {
      std::cout << response.secret() << "\n";
      std::cerr << "token " << response.token().id() << " for " << role << " '" << arg
                << "': shown once; keep it in a file only its user can read\n";
    }
    return kExitSucceeded;
  }
  if (action == "list") {
    v1::ListTokensResponse response;
    if (std::optional<int> failed = Call(*admin_, &v1::AdminService::Stub::ListTokens,
                                         v1::ListTokensRequest(), &response)) {
      return *failed;
    }
    if (Json()) {
      std::cout << ToJson(response);
      return kExitSucceeded;
    }
    std::vector<std::vector<std::string>> rows;
    for (const v1::Token& t : response.tokens()) {
      std::string state = "valid";
      if (t.revoked_unix_ms() != 0) {
        state = "revoked by " + t.revoked_by();
      } else if (t.expires_unix_ms() != 0 &&
                 t.expires_unix_ms() <= absl::ToUnixMillis(RealClock::Get().Now())) {
        state = "expired";
      }
      const std::string& role_name = v1::TokenRole_Name(t.role());
      absl::string_view role = role_name;
      absl::ConsumePrefix(&role, "TOKEN_");
      rows.push_back({t.id(), t.name(), absl::AsciiStrToLower(role), LocalTime(t.created_unix_ms()),
                      t.expires_unix_ms() == 0 ? "never" : LocalTime(t.expires_unix_ms()),
                      t.created_by(), state});
    }
    std::cout << Table({"ID", "NAME", "ROLE", "CREATED", "EXPIRES", "BY", "STATE"}, rows);
    return kExitSucceeded;
  }
  if (action == "revoke") {
    if (arg.empty()) {
      std::cerr << "error: token revoke needs ID (from `trainyard token list`)\n";
      return kExitUsage;
    }
    v1::RevokeTokenRequest request;
    request.set_id(arg);
    v1::Token response;
    if (std::optional<int> failed =
            Call(*admin_, &v1::AdminService::Stub::RevokeToken, request, &response)) {
      return *failed;
    }
    std::cout << "token " << arg << " of '" << response.name() << "' revoked\n";
    return kExitSucceeded;
  }
  std::cerr << "error: token takes create, list or revoke, got '" << action << "'\n";
  return kExitUsage;
}

}  // namespace trainyard::cli
