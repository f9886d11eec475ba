#ifndef TRAINYARD_COMMON_JSON_FIELDS_H_
#define TRAINYARD_COMMON_JSON_FIELDS_H_

// Fields of JSON objects that come from outside (files in object storage, other ranks, a user's
// program), read without exceptions: nlohmann's value() throws when the field is there with
// another type, or when the value is no object at all.

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "nlohmann/json.hpp"

namespace trainyard {

// `object[key]` when `object` is an object whose `key` is a string; else `fallback`.
inline std::string JsonString(const nlohmann::json& object, const char* key,
                              std::string fallback = "") {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// `object[key]` when it is there (any type); else `fallback`.
inline nlohmann::json JsonField(const nlohmann::json& object, const char* key,
                                nlohmann::json fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  return it != object.end() ? *it : fallback;
}

// `j[key]` into `out` when it is there with `out`'s type: an integer field takes only an integer
// that fits (nlohmann converts 3e72 to int by a cast, undefined behaviour), a bool only a bool, a
// floating-point field any number.
template <typename T>
bool ReadField(const nlohmann::json& j, const char* key, T& out) {
  if (!j.is_object()) return false;
  auto it = j.find(key);
  if (it == j.end()) return false;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return false;
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return false;
    if (it->is_number_unsigned()) {
      const uint64_t v = it->get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
      out = static_cast<T>(v);
      return true;
    }
    const int64_t v = it->get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0 || static_cast<uint64_t>(v) > std::numeric_limits<T>::max()) return false;
    } else if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
               v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return false;
    }
    out = static_cast<T>(v);
    return true;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return false;
  }
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return true;
}

// `object[key]` when it is an integer (that fits int64); else `fallback`.
inline int64_t JsonInt(const nlohmann::json& object, const char* key, int64_t fallback) {
  int64_t value = fallback;
  return ReadField(object, key, value) ? value : fallback;
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_JSON_FIELDS_H_
