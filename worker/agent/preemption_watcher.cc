#include "worker/agent/preemption_watcher.h"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"

namespace trainyard {
namespace {

// Answers are a word or a small JSON object; anything longer is not one of them.
constexpr size_t kMaxBody = 64 * 1024;

size_t WriteBody(char* data, size_t size, size_t count, void* userdata) {
  std::string& body = *static_cast<std::string*>(userdata);
  const size_t n = size * count;
  body.append(data, std::min(n, kMaxBody - std::min(kMaxBody, body.size())));
  return n;
}

int AbortOnStop(void* userdata, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const absl::Notification*>(userdata)->HasBeenNotified() ? 1 : 0;
}

// {scheme}://{host[:port]} of `url`.
std::string Origin(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t host = scheme == std::string::npos ? 0 : scheme + 3;
  return url.substr(0, url.find('/', host));
}

}  // namespace

PreemptionWatcher::PreemptionWatcher(PreemptionWatcherOptions options, const Clock& clock)
    : options_(std::move(options)),
      clock_(clock),
      token_url_(Origin(options_.url) + "/latest/api/token") {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

PreemptionWatcher::~PreemptionWatcher() {
  poller_.Stop();
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

absl::StatusOr<PreemptionWatcher::Answer> PreemptionWatcher::Request(
    const std::string& method, const std::string& url, const std::vector<std::string>& headers) {
  if (curl_ == nullptr) curl_ = curl_easy_init();
  CURL* h = static_cast<CURL*>(curl_);
  if (h == nullptr) return absl::UnavailableError("curl_easy_init failed");
  curl_easy_reset(h);
  curl_slist* header_list = nullptr;
  for (const std::string& header : headers) {
    header_list = curl_slist_append(header_list, header.c_str());
  }
  char error_buffer[CURL_ERROR_SIZE] = {};
  Answer answer;
  const long timeout_ms = static_cast<long>(absl::ToInt64Milliseconds(options_.request_timeout));
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, header_list);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  // The metadata server is link-local: a proxy from the environment could only get in the way.
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &answer.body);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, AbortOnStop);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, &poller_.stopping());
  if (method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
  }
  const CURLcode code = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(header_list);
  if (code != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(
        method, " ", url, ": ", error_buffer[0] != '\0' ? error_buffer : curl_easy_strerror(code)));
  }
  answer.status = static_cast<int>(status);
  return answer;
}

absl::StatusOr<PreemptionWatcher::Answer> PreemptionWatcher::Get() {
  auto get = [this] {
    std::vector<std::string> headers = {"Metadata-Flavor: Google"};
    if (!token_.empty()) headers.push_back("X-aws-ec2-metadata-token: " + token_);
    return Request("GET", options_.url, headers);
  };
  absl::StatusOr<Answer> answer = get();
  if (!answer.ok() || answer->status != 401) return answer;
  // IMDSv2 is required, or our token expired.
  token_.clear();
  absl::StatusOr<Answer> token =
      Request("PUT", token_url_, {"X-aws-ec2-metadata-token-ttl-seconds: 21600"});
  if (!token.ok() || token->status != 200) return answer;
  token_ = std::string(absl::StripAsciiWhitespace(token->body));
  if (token_.empty()) return answer;
  return get();
}

absl::StatusOr<std::optional<PreemptionNotice>> PreemptionWatcher::PollOnce() {
  absl::StatusOr<Answer> answer = Get();
  if (!answer.ok()) return answer.status();
  return ParsePreemptionAnswer(answer->status, answer->body, clock_.Now(), options_.grace_period);
}

void PreemptionWatcher::Start(std::function<void(const PreemptionNotice&)> on_notice) {
  LogInfo("watching ", options_.url, " for preemption notices every ",
          absl::FormatDuration(options_.poll_interval));
  poller_.Start(options_.poll_interval,
                {[this] { return PollOnce(); }, std::move(on_notice),
                 [this](const absl::Status& s) {
                   // An endpoint that is down stays down, and the agent works without it.
                   LogWarning("cannot read preemption notices from ", options_.url, ": ",
                              s.message(), " (ignored; not repeated until it answers)");
                 },
                 [this] { LogInfo("preemption notices: ", options_.url, " answers again"); }});
}

}  // namespace trainyard
