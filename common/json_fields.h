#ifndef TRAINYARD_COMMON_JSON_FIELDS_H_
#define TRAINYARD_COMMON_JSON_FIELDS_H_

// Fields of JSON objects that come from outside (files in object storage, other ranks, a user's
// program), read without exceptions: nlohmann's value() throws when the field is there with
// another type, or when the value is no object at all.

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace trainyard {

// `object[key]` when `object` is an object whose `key` is a string; else `fallback`.
inline std::string JsonString(const nlohmann::json& object, const char* key,
                              std::string fallback = "") {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// `object[key]` when it is an integer (that fits int64); else `fallback`.
inline int64_t JsonInt(const nlohmann::json& object, const char* key, int64_t fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return fallback;
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return fallback;
  }
  return it->get<int64_t>();
}

// `object[key]` when it is there (any type); else `fallback`.
inline nlohmann::json JsonField(const nlohmann::json& object, const char* key,
                                nlohmann::json fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  return it != object.end() ? *it : fallback;
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_JSON_FIELDS_H_
