// Metrics end to end: a real cluster on loopback, the real Prometheus scraping it with the
// configuration and alert rules from deploy/, and checks through Prometheus' query API, plus
// `promtool check metrics` on every /metrics output and a check that every metric a dashboard or
// an alert rule names is exported.

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "curl/curl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster.h"
#include "yaml-cpp/yaml.h"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

size_t Append(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

// GET `url`; the body on HTTP 200, UNAVAILABLE otherwise.
// `user_password` ("USER:PASSWORD"): HTTP basic authentication; `ca_file`: the CA of an
// https:// server's certificate.
absl::StatusOr<std::string> HttpGet(const std::string& url, const std::string& user_password = "",
                                    const std::string& ca_file = "") {
  CURL* curl = curl_easy_init();
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  if (!user_password.empty()) curl_easy_setopt(curl, CURLOPT_USERPWD, user_password.c_str());
  if (!ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, ca_file.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 5000L);
  const CURLcode code = curl_easy_perform(curl);
  long status = 0;  // NOLINT(runtime/int): curl's type
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(curl);
  if (code != CURLE_OK || status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET ", url, ": ", curl_easy_strerror(code), " HTTP ", status, " ", body));
  }
  return body;
}

std::string Escape(const std::string& s) {
  char* escaped = curl_easy_escape(nullptr, s.c_str(), static_cast<int>(s.size()));
  std::string out = escaped;
  curl_free(escaped);
  return out;
}

// Runs `command` with /bin/sh; (exit code, output).
std::pair<int, std::string> Shell(const std::string& command, const std::string& log) {
  Process p({"/bin/sh", "-c", command}, log);
  std::optional<int> status = p.Wait(absl::Seconds(60));
  const int code = status.has_value() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  return {code, p.Log()};
}

// Sample names (with _bucket/_sum/_count) in a text exposition.
std::set<std::string> SampleNames(const std::string& text) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end = line.find_first_of("{ ");
    names.insert(std::string(line.substr(0, end)));
  }
  return names;
}

// Every trainyard_* name mentioned in a file.
std::set<std::string> NamesIn(const std::string& path) {
  const std::string text = ReadFile(path);
  std::set<std::string> names;
  static const std::regex kName(R"(\btrainyard_[a-z0-9_]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kName);
       it != std::sregex_iterator(); ++it) {
    names.insert(it->str());
  }
  return names;
}

constexpr char kScrapeAuth[] = "prometheus:s3cret-scrape";

class Prometheus {
 public:
  // `password_file`: scrapes authenticate as user "prometheus" with the password in it;
  // `coordinator_ca`: the coordinator's metrics are scraped over HTTPS, verified against it.
  Prometheus(const std::string& dir, int coordinator_port, const std::vector<int>& worker_ports,
             const std::string& password_file, const std::string& coordinator_ca)
      : port_(FreeLoopbackPort()) {
    // The deployed configuration with this cluster's targets and a fast pace.
    YAML::Node config = YAML::LoadFile(SourceDir() + "/deploy/prometheus/prometheus.yml");
    config["global"]["scrape_interval"] = "1s";
    config["global"]["evaluation_interval"] = "1s";
    config["rule_files"][0] = SourceDir() + "/deploy/prometheus/alerts.yml";
    for (YAML::Node scrape : config["scrape_configs"]) {
      YAML::Node targets(YAML::NodeType::Sequence);
      if (scrape["job_name"].as<std::string>() == "trainyard-coordinator") {
        targets.push_back(absl::StrCat("127.0.0.1:", coordinator_port));
        scrape["scheme"] = "https";
        scrape["tls_config"]["ca_file"] = coordinator_ca;
      } else {
        for (int p : worker_ports) targets.push_back(absl::StrCat("127.0.0.1:", p));
      }
      scrape["static_configs"][0]["targets"] = targets;
      scrape["basic_auth"]["username"] = "prometheus";
      scrape["basic_auth"]["password_file"] = password_file;
    }
    const std::string config_path = dir + "/prometheus.yml";
    std::ofstream(config_path) << YAML::Dump(config) << "\n";
    process_ = std::make_unique<Process>(
        std::vector<std::string>{"/usr/bin/prometheus", "--config.file=" + config_path,
                                 "--storage.tsdb.path=" + dir + "/tsdb",
                                 absl::StrCat("--web.listen-address=127.0.0.1:", port_),
                                 "--log.level=warn"},
        dir + "/prometheus.log");
  }
  ~Prometheus() { process_->Stop(); }

  bool WaitReady() {
    return PollUntil([&] { return HttpGet(Url("/-/ready")).ok() || !process_->running(); },
                     absl::Seconds(60)) &&
           process_->running();
  }
  std::string Url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", port_, path);
  }
  // The result vector of an instant query; empty on any error.
  json Query(const std::string& promql) const {
    auto body = HttpGet(Url("/api/v1/query?query=" + Escape(promql)));
    if (!body.ok()) return json::array();
    json reply = json::parse(*body, nullptr, false);
    if (reply.is_discarded() || reply["status"] != "success") return json::array();
    return reply["data"]["result"];
  }
  // The value of a query that yields one sample; NaN otherwise.
  double Scalar(const std::string& promql) const {
    json result = Query(promql);
    if (result.size() != 1) return std::nan("");
    double v = std::nan("");
    if (!absl::SimpleAtod(result[0]["value"][1].get<std::string>(), &v)) return std::nan("");
    return v;
  }
  std::string Log() const { return process_->Log(); }

 private:
  int port_;
  std::unique_ptr<Process> process_;
};

std::string Job(const std::string& name, int64_t max_steps, int64_t every_steps) {
  return SyntheticJobYaml(name, max_steps,
                          absl::StrCat("max_runtime: 2h\ncheckpoint: {every_steps: ", every_steps,
                                       ", keep_last: 2}\n"));
}

TEST(MetricsTest, PrometheusScrapesTheClusterWithTheDeployedConfig) {
  // Metrics behind HTTP basic authentication, as Prometheus's basic_auth presents it.
  TempDir secrets;
  const std::string auth_file = secrets.path() + "/metrics-auth";
  const std::string password_file = secrets.path() + "/metrics-password";
  std::ofstream(auth_file) << kScrapeAuth << "\n";
  std::ofstream(password_file) << "s3cret-scrape";
  // The coordinator's over HTTPS.
  TestCertificates certs(secrets.path());
  ClusterOptions options;
  options.workers = 2;
  options.coordinator_args = {"--metrics_basic_auth_file=" + auth_file,
                              "--metrics_tls_cert=" + certs.Path("server.pem"),
                              "--metrics_tls_key=" + certs.Path("server.key")};
  options.worker_args = {"--metrics_basic_auth_file=" + auth_file};
  Cluster cluster(options);
  const int coordinator_port = cluster.coordinator_metrics_port();
  const std::vector<int> worker_ports = {cluster.worker_metrics_port(0),
                                         cluster.worker_metrics_port(1)};
  ASSERT_GT(coordinator_port, 0);
  ASSERT_GT(worker_ports[0], 0);
  ASSERT_GT(worker_ports[1], 0);

  TempDir dir;
  // Without the credentials (or with wrong ones) a scrape is refused.
  const std::string coordinator_url =
      absl::StrCat("https://127.0.0.1:", coordinator_port, "/metrics");
  for (const std::string& url :
       {coordinator_url, absl::StrCat("http://127.0.0.1:", worker_ports[0], "/metrics")}) {
    for (const std::string user : {"", "-u prometheus:wrong "}) {
      auto [code, out] =
          Shell(absl::StrCat("curl -s -o /dev/null -w '%{http_code}' --cacert ",
                             certs.Path("ca.pem"), " ", user, url),
                absl::StrCat(dir.path(), "/curl-", url.size(), "-", user.size(), ".log"));
      EXPECT_EQ(out, "401") << url << " " << user;
    }
  }
  // Plaintext to the HTTPS port gets nowhere; a client that trusts another CA neither.
  EXPECT_FALSE(
      HttpGet(absl::StrCat("http://127.0.0.1:", coordinator_port, "/metrics"), kScrapeAuth).ok());
  EXPECT_FALSE(HttpGet(coordinator_url, kScrapeAuth, certs.Path("other-ca.pem")).ok());
  Prometheus prometheus(dir.path(), coordinator_port, worker_ports, password_file,
                        certs.Path("ca.pem"));
  ASSERT_TRUE(prometheus.WaitReady()) << prometheus.Log();

  auto quick = cluster.Submit(Job("quick", 20, 0));
  ASSERT_TRUE(quick.ok()) << quick.status();
  // The long job is a parameter_server one (a rank and a shard, one slot each) so that the
  // shard's series exist too.
  auto slow = cluster.Submit(absl::StrReplaceAll(
      Job("slow", 100000000, 500),
      {{"strategy: single", "strategy: parameter_server\nparameter_servers: 1"}}));
  ASSERT_TRUE(slow.ok()) << slow.status();
  const std::string id = slow->id();
  auto running = cluster.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.committed_step() > 0 && j.progress().step() > 0;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  auto finished = cluster.WaitForFinal(quick->id());
  ASSERT_TRUE(finished.ok()) << finished.status();
  ASSERT_EQ(finished->state(), v1::SUCCEEDED) << finished->reason();

  // Every target is up.
  ASSERT_TRUE(PollUntil([&] { return prometheus.Scalar("sum(up)") == 3; }, absl::Seconds(30)))
      << prometheus.Query("up").dump();

  // A running job's step increases between scrapes.
  const std::string step_query = absl::StrCat("trainyard_job_step{job=\"", id, "\"}");
  double first = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        first = prometheus.Scalar(step_query);
        return first > 0;
      },
      absl::Seconds(30)));
  EXPECT_TRUE(PollUntil([&] { return prometheus.Scalar(step_query) > first; }, absl::Seconds(30)));
  EXPECT_TRUE(PollUntil(
      [&] { return prometheus.Scalar(absl::StrCat("trainyard_job_loss{job=\"", id, "\"}")) > 0; },
      absl::Seconds(30)));
  EXPECT_TRUE(PollUntil(
      [&] {
        return prometheus.Scalar(absl::StrCat("trainyard_job_committed_step{job=\"", id, "\"}")) >=
               500;
      },
      absl::Seconds(30)));

  // Jobs by state add up to the jobs submitted, one succeeded and one runs.
  EXPECT_TRUE(PollUntil(
      [&] {
        return prometheus.Scalar("sum(trainyard_jobs)") == 2 &&
               prometheus.Scalar("trainyard_job_submissions_total") == 2 &&
               prometheus.Scalar(R"(trainyard_jobs{state="succeeded"})") == 1 &&
               prometheus.Scalar(R"(trainyard_jobs{state="running"})") == 1;
      },
      absl::Seconds(30)))
      << prometheus.Query("trainyard_jobs").dump();
  EXPECT_TRUE(PollUntil(
      [&] {
        return prometheus.Scalar(R"(trainyard_job_scheduling_latency_seconds_count)") == 2 &&
               prometheus.Scalar(R"(sum(trainyard_slots{state="used"}))") == 2;
      },
      absl::Seconds(30)));

  // The agents: a rank and a shard running, with their CPU time; the machine's memory.
  EXPECT_TRUE(PollUntil(
      [&] {
        return prometheus.Scalar(R"(sum(trainyard_worker_trainers{state="running"}))") == 2 &&
               prometheus.Scalar(absl::StrCat("trainyard_worker_trainer_cpu_seconds_total{job=\"",
                                              id, "\",rank=\"0\"}")) > 0 &&
               prometheus.Scalar(absl::StrCat("trainyard_worker_trainer_cpu_seconds_total{job=\"",
                                              id, "\",shard=\"0\"}")) > 0;
      },
      absl::Seconds(30)))
      << prometheus.Query("trainyard_worker_trainers").dump();
  // The shard's own counters: it answers a push and a pull per step.
  const std::string pushes =
      absl::StrCat("trainyard_ps_pushes_total{job=\"", id, "\",shard=\"0\"}");
  double first_pushes = 0;
  EXPECT_TRUE(PollUntil(
      [&] {
        first_pushes = prometheus.Scalar(pushes);
        return first_pushes > 0;
      },
      absl::Seconds(30)))
      << prometheus.Query("trainyard_ps_pushes_total").dump();
  EXPECT_TRUE(
      PollUntil([&] { return prometheus.Scalar(pushes) > first_pushes; }, absl::Seconds(30)));
  EXPECT_GT(prometheus.Scalar(absl::StrCat("trainyard_ps_received_bytes_total{job=\"", id, "\"}")),
            0);
  EXPECT_GT(prometheus.Scalar(absl::StrCat("trainyard_ps_version{job=\"", id, "\"}")), 0);
  EXPECT_GT(prometheus.Scalar("min(trainyard_worker_memory_total_bytes)"), 0);
  EXPECT_EQ(prometheus.Scalar("max(trainyard_worker_gpu_monitoring)"), 0);

  // The deployed rules are loaded and evaluate without errors against real series: every one of
  // them.
  const YAML::Node deployed = YAML::LoadFile(SourceDir() + "/deploy/prometheus/alerts.yml");
  size_t deployed_alerts = 0;
  for (const YAML::Node& group : deployed["groups"]) deployed_alerts += group["rules"].size();
  ASSERT_GT(deployed_alerts, 10u);
  std::set<std::string> alerts;
  ASSERT_TRUE(PollUntil(
      [&] {
        auto body = HttpGet(prometheus.Url("/api/v1/rules"));
        if (!body.ok()) return false;
        json rules = json::parse(*body, nullptr, false);
        if (rules.is_discarded()) return false;
        alerts.clear();
        bool evaluated = true;
        for (const json& group : rules["data"]["groups"]) {
          for (const json& rule : group["rules"]) {
            alerts.insert(rule["name"].get<std::string>());
            EXPECT_EQ(rule["health"], "ok") << rule.dump();
            evaluated = evaluated && rule["health"] == "ok";
          }
        }
        return evaluated && alerts.size() == deployed_alerts;
      },
      absl::Seconds(30)));
  EXPECT_THAT(alerts, ::testing::IsSupersetOf({"TrainyardJobOverRuntime", "TrainyardJobStalled",
                                               "TrainyardJobRestartLoop", "TrainyardWorkerLost",
                                               "TrainyardQueueBacklog", "TrainyardCheckpointTooOld",
                                               "TrainyardGpusIdle", "TrainyardJobGpuIdle",
                                               "TrainyardParameterServerStalePushes"}));

  // Every /metrics output passes promtool's checks, and together they hold every metric that a
  // dashboard or an alert rule names (the GPU ones need NVML: agent_metrics_test covers them).
  std::string coordinator_text;
  ASSERT_TRUE(PollUntil(
      [&] {
        auto text = HttpGet(coordinator_url, kScrapeAuth, certs.Path("ca.pem"));
        coordinator_text = text.ok() ? *text : "";
        return absl::StrContains(coordinator_text,
                                 "trainyard_job_last_checkpoint_commit_latency_seconds{");
      },
      absl::Seconds(30)))
      << coordinator_text;
  std::set<std::string> exported = SampleNames(coordinator_text);
  std::vector<std::pair<std::string, std::string>> outputs = {{"coordinator", coordinator_text}};
  for (size_t i = 0; i < worker_ports.size(); ++i) {
    auto text =
        HttpGet(absl::StrCat("http://127.0.0.1:", worker_ports[i], "/metrics"), kScrapeAuth);
    ASSERT_TRUE(text.ok()) << text.status();
    outputs.emplace_back(absl::StrCat("worker-", i), *text);
    for (const std::string& name : SampleNames(*text)) exported.insert(name);
  }
  for (const auto& [name, text] : outputs) {
    const std::string path = absl::StrCat(dir.path(), "/", name, ".metrics");
    std::ofstream(path) << text;
    auto [code, output] = Shell(absl::StrCat("promtool check metrics < ", path),
                                absl::StrCat(dir.path(), "/", name, ".promtool.log"));
    EXPECT_EQ(code, 0) << name << ":\n" << output;
  }
  const std::set<std::string> needs_nvml = {"trainyard_worker_gpu_utilization_ratio",
                                            "trainyard_worker_gpu_memory_used_bytes",
                                            "trainyard_worker_gpu_memory_total_bytes"};
  std::set<std::string> named = NamesIn(SourceDir() + "/deploy/prometheus/alerts.yml");
  for (const auto& entry : fs::directory_iterator(SourceDir() + "/deploy/grafana/dashboards")) {
    for (const std::string& name : NamesIn(entry.path().string())) named.insert(name);
  }
  ASSERT_GT(named.size(), 20u);
  // A running search's series: search_integration_test scrapes them (and runs promtool on them).
  const std::set<std::string> needs_search = {"trainyard_search_trials",
                                              "trainyard_search_best_metric"};
  // A running pipeline's series (server metrics_test renders them from a pipeline's progress).
  const std::set<std::string> needs_pipeline = {"trainyard_pipeline_stage_seconds",
                                                "trainyard_pipeline_bubble_ratio",
                                                "trainyard_pipeline_ideal_bubble_ratio"};
  for (const std::string& name : named) {
    if (needs_nvml.count(name) || needs_search.count(name) || needs_pipeline.count(name)) {
      continue;
    }
    EXPECT_TRUE(exported.count(name)) << name << " is used in deploy/ but not exported";
  }

  // Per-job series go when the job ends.
  ASSERT_TRUE(cluster.Cli({"cancel", id}).exit_code == 0);
  auto cancelled = cluster.WaitForFinal(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  auto after = HttpGet(coordinator_url, kScrapeAuth, certs.Path("ca.pem"));
  ASSERT_TRUE(after.ok());
  EXPECT_THAT(*after, ::testing::Not(::testing::HasSubstr(absl::StrCat("job=\"", id, "\""))));
  EXPECT_THAT(*after,
              ::testing::HasSubstr(R"(trainyard_jobs_finished_total{state="cancelled"} 1)"));
}

}  // namespace
}  // namespace trainyard::testing
