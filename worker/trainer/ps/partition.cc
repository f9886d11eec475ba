#include "worker/trainer/ps/partition.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainyard::trainer {

std::vector<Piece> Partition::PiecesOf(int shard) const {
  std::vector<Piece> out;
  for (const Piece& piece : pieces) {
    if (piece.shard == shard) out.push_back(piece);
  }
  return out;
}

absl::StatusOr<Partition> PartitionParameters(const std::vector<ParameterShape>& parameters,
                                              int shards, int64_t chunk_bytes) {
  if (shards < 1) {
    return absl::InvalidArgumentError(absl::StrCat("shards must be >= 1, got ", shards));
  }
  Partition partition;
  partition.shards = shards;
  partition.chunk_bytes = chunk_bytes;
  partition.shard_bytes.assign(shards, 0);
  for (const ParameterShape& p : parameters) {
    if (p.numel < 0 || p.element_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", p.name, ": ", p.numel,
                                                     " elements of ", p.element_size, " bytes"));
    }
    if (chunk_bytes < p.element_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk of ", chunk_bytes, " bytes is smaller than an element of ", p.name));
    }
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ParameterShape& p = parameters[i];
    const int64_t per_piece = chunk_bytes / p.element_size;
    for (int64_t offset = 0; offset < p.numel; offset += per_piece) {
      partition.pieces.push_back(
          Piece{static_cast<int>(i), offset, std::min(per_piece, p.numel - offset), 0});
    }
  }
  auto bytes = [&](const Piece& piece) {
    return piece.length * parameters[piece.parameter].element_size;
  };
  // Largest first onto the least loaded shard (longest-processing-time first): the shards end
  // within one piece of each other. A stable order keeps it deterministic.
  std::vector<size_t> order(partition.pieces.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return bytes(partition.pieces[a]) > bytes(partition.pieces[b]);
  });
  for (size_t index : order) {
    Piece& piece = partition.pieces[index];
    const auto lightest =
        std::min_element(partition.shard_bytes.begin(), partition.shard_bytes.end());
    piece.shard = static_cast<int>(lightest - partition.shard_bytes.begin());
    *lightest += bytes(piece);
  }
  return partition;
}

std::string PartitionToJson(const Partition& partition,
                            const std::vector<ParameterShape>& parameters) {
  nlohmann::json json;
  json["shards"] = partition.shards;
  json["chunk_bytes"] = partition.chunk_bytes;
  json["parameters"] = nlohmann::json::array();
  for (const ParameterShape& p : parameters) {
    json["parameters"].push_back(
        {{"name", p.name}, {"numel", p.numel}, {"element_size", p.element_size}});
  }
  json["pieces"] = nlohmann::json::array();
  for (const Piece& piece : partition.pieces) {
    json["pieces"].push_back({piece.parameter, piece.offset, piece.length, piece.shard});
  }
  return json.dump();
}

absl::StatusOr<Partition> ParsePartitionJson(const std::string& text,
                                             const std::vector<ParameterShape>& parameters) {
  auto bad = [](const std::string& what) {
    return absl::DataLossError(absl::StrCat("parameter-server layout: ", what));
  };
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return bad("not a JSON object");
  Partition partition;
  try {
    partition.shards = json.at("shards").get<int>();
    partition.chunk_bytes = json.at("chunk_bytes").get<int64_t>();
    const nlohmann::json& recorded = json.at("parameters");
    if (!recorded.is_array() || recorded.size() != parameters.size()) {
      return bad(absl::StrCat("records ", recorded.size(), " parameters, the model has ",
                              parameters.size()));
    }
    for (size_t i = 0; i < parameters.size(); ++i) {
      const std::string name = recorded[i].at("name").get<std::string>();
      const int64_t numel = recorded[i].at("numel").get<int64_t>();
      if (name != parameters[i].name || numel != parameters[i].numel) {
        return bad(absl::StrCat("parameter ", i, " is ", name, " of ", numel,
                                " elements, the model's is ", parameters[i].name, " of ",
                                parameters[i].numel));
      }
    }
    for (const nlohmann::json& row : json.at("pieces")) {
      if (!row.is_array() || row.size() != 4)
        return bad("a piece is not [parameter, offset, length, shard]");
      partition.pieces.push_back(Piece{row[0].get<int>(), row[1].get<int64_t>(),
                                       row[2].get<int64_t>(), row[3].get<int>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  if (partition.shards < 1) return bad(absl::StrCat("shards is ", partition.shards));
  partition.shard_bytes.assign(partition.shards, 0);
  // The pieces must tile each parameter in order: parameter by parameter, offset after offset.
  size_t next = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    int64_t covered = 0;
    while (next < partition.pieces.size() &&
           partition.pieces[next].parameter == static_cast<int>(i)) {
      const Piece& piece = partition.pieces[next];
      if (piece.offset != covered || piece.length < 1 || piece.shard < 0 ||
          piece.shard >= partition.shards) {
        return bad(absl::StrCat("piece ", next, " of ", parameters[i].name,
                                " does not continue the pieces before it on a shard that exists"));
      }
      covered += piece.length;
      partition.shard_bytes[piece.shard] += piece.length * parameters[i].element_size;
      ++next;
    }
    if (covered != parameters[i].numel) {
      return bad(absl::StrCat("the pieces of ", parameters[i].name, " cover ", covered, " of ",
                              parameters[i].numel, " elements"));
    }
  }
  if (next != partition.pieces.size()) {
    return bad(absl::StrCat("piece ", next, " is out of order or names no parameter"));
  }
  return partition;
}

}  // namespace trainyard::trainer
