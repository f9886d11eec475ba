// A checkpoint as trainers and programs read it back from object storage: the manifest (JSON),
// the trainer state (JSON) and the model's and optimizer's safetensors. The input is the
// manifest, then the objects "trainer_state.json", "model.safetensors" and
// "optimizer.safetensors", separated by "|OBJECT|". The first byte picks whether the manifest is
// read as given (its sizes and hashes rarely match) or with the true size and SHA-256 of every
// object it names that the input holds, so that the readers behind the checks are reached too.

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/sha256.h"
#include "tests/common/test_stores.h"
#include "worker/trainer/checkpoint/checkpoint.h"
#include "worker/trainer/program/files.h"

namespace {

constexpr char kStep[] = "s3://ckpt/jobs/j-1/step-000000000100";
const char* const kObjects[] = {"trainer_state.json", "model.safetensors", "optimizer.safetensors"};

// The manifest with the true size and hash of each object the store holds.
std::string Corrected(const std::string& manifest, const std::vector<absl::string_view>& parts) {
  nlohmann::json j = nlohmann::json::parse(manifest, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("objects") || !j["objects"].is_array()) return manifest;
  for (nlohmann::json& entry : j["objects"]) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) continue;
    for (size_t i = 0; i + 1 < parts.size() && i < 3; ++i) {
      if (entry["name"].get<std::string>() != kObjects[i]) continue;
      entry["size"] = parts[i + 1].size();
      entry["sha256"] = trainyard::Sha256Hex(parts[i + 1]);
    }
  }
  return j.dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool correct = data[0] & 1;
  const absl::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<absl::string_view> parts = absl::StrSplit(input, "|OBJECT|");
  const std::string manifest =
      correct ? Corrected(std::string(parts[0]), parts) : std::string(parts[0]);

  trainyard::MemoryStore store;
  store.Put(absl::StrCat(kStep, "/MANIFEST.g1.json"), manifest).IgnoreError();
  for (size_t i = 0; i + 1 < parts.size() && i < 3; ++i) {
    store.Put(absl::StrCat(kStep, "/", kObjects[i]), parts[i + 1]).IgnoreError();
  }
  trainyard::trainer::ReadCheckpoint(store, kStep).IgnoreError();
  // The same bytes through a reader that keeps some tensors only (a pipeline stage resuming).
  const trainyard::trainer::CheckpointFilter odd{
      [](const std::string& name) { return name.size() % 2 == 1; },
      [](const std::string& name) { return name.size() % 2 == 1; }};
  trainyard::trainer::ReadCheckpoint(store, kStep, &odd).IgnoreError();
  // A program's manifest, and a trainer state alone.
  trainyard::trainer::program::DecodeManifest(manifest).IgnoreError();
  if (parts.size() > 1) trainyard::trainer::DecodeTrainerState(parts[1]).IgnoreError();
  return 0;
}
