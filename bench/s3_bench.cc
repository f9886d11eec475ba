// Benchmarks for object storage (docs/benchmarks.md, "Object storage"); bench/s3_throughput.sh
// and bench/checkpoint_inflation.sh drive it.
//
//   s3_bench put LOCAL_FILE s3://bucket/key     streaming (multipart) upload; prints seconds
//   s3_bench get s3://bucket/key LOCAL_FILE     parallel ranged download; prints seconds
//   s3_bench checkpoint s3://bucket/prefix MB   step time of a model of MB megabytes of
//                                                parameters, without and while an asynchronous
//                                                checkpoint uploads
// Endpoint and credentials come from the environment as for the trainer (AWS_ENDPOINT_URL, ...).

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/object_store.h"
#include "worker/trainer/checkpoint.h"

namespace {

using trainyard::ObjectStore;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::unique_ptr<ObjectStore> Open(const std::string& uri) {
  auto store = trainyard::OpenObjectStore(uri);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(store);
}

int Checkpoint(const std::string& base, int64_t megabytes) {
  torch::set_num_threads(1);
  // A deep MLP of `megabytes` of float32 parameters: 1024-wide layers of 4 MiB each.
  const int64_t width = 1024;
  const int64_t layers = std::max<int64_t>(1, megabytes / 4);
  torch::nn::Sequential net;
  for (int64_t i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::ReLU());
  }
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.001));
  torch::Tensor x = torch::randn({32, width});
  auto step = [&] {
    const Clock::time_point t = Clock::now();
    optimizer.zero_grad();
    torch::Tensor loss = net->forward(x).pow(2).mean();
    loss.backward();
    optimizer.step();
    return Since(t);
  };
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  for (int i = 0; i < 5; ++i) step();  // warm up
  std::vector<double> base_steps;
  for (int i = 0; i < 30; ++i) base_steps.push_back(step());

  std::unique_ptr<ObjectStore> store = Open(base);
  trainyard::trainer::Checkpointer::Options options;
  options.base_uri = base;
  trainyard::trainer::Checkpointer checkpointer(store.get(), nullptr, trainyard::RealClock::Get(),
                                                options);
  const Clock::time_point snap_start = Clock::now();
  trainyard::trainer::CheckpointData data;
  {
    torch::NoGradGuard no_grad;
    for (const auto& item : net->named_parameters()) {
      data.model.emplace_back(item.key(), item.value().detach().clone());
    }
  }
  data.state.step = 1;
  data.state.lr_schedule = "constant";
  checkpointer.SaveAsync(std::move(data));
  const double snapshot_s = Since(snap_start);
  const Clock::time_point upload_start = Clock::now();
  std::vector<double> during;
  while (checkpointer.Uploading()) during.push_back(step());
  const double upload_s = Since(upload_start);
  absl::Status saved = checkpointer.Wait();
  if (!saved.ok()) {
    std::fprintf(stderr, "checkpoint failed: %s\n", saved.ToString().c_str());
    return 1;
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double d : v) s += d;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  const double b = mean(base_steps), d = mean(during);
  std::printf(
      "model_mb=%.1f baseline_step_ms=%.2f during_upload_step_ms=%.2f steps_during_upload=%zu "
      "inflation_pct=%.1f snapshot_ms=%.1f upload_s=%.2f\n",
      static_cast<double>(params) * 4 / 1e6, b * 1e3, d * 1e3, during.size(),
      b > 0 ? (d / b - 1) * 100 : 0.0, snapshot_s * 1e3, upload_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr,
                 "usage: s3_bench put LOCAL URI | get URI LOCAL | checkpoint URI_PREFIX MB\n");
    return 2;
  }
  const std::string command = argv[1];
  if (command == "put") {
    std::unique_ptr<ObjectStore> store = Open(argv[3]);
    const Clock::time_point t = Clock::now();
    absl::Status status = store->PutFile(argv[3], argv[2]);
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", status.ToString().c_str());
      return 1;
    }
    std::printf("%.3f\n", Since(t));
    return 0;
  }
  if (command == "get") {
    std::unique_ptr<ObjectStore> store = Open(argv[2]);
    const Clock::time_point t = Clock::now();
    auto info = store->GetToFile(argv[2], argv[3]);
    if (!info.ok()) {
      std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
      return 1;
    }
    std::printf("%.3f\n", Since(t));
    return 0;
  }
  if (command == "checkpoint") {
    int64_t mb = 0;
    if (!absl::SimpleAtoi(argv[3], &mb) || mb <= 0) return 2;
    return Checkpoint(argv[2], mb);
  }
  return 2;
}
