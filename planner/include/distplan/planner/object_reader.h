// Strict JSON object reader shared by the parsers of every module (scenarios, presets, the
// validate/v1 report): every accessor checks the type and range of one field and names its JSON
// pointer on failure (InputError); finish() rejects unknown keys.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "distplan/planner/units.h"

namespace distplan::detail {

class ObjectReader {
 public:
  ObjectReader(const nlohmann::json& j, std::string path);

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] std::string child(std::string_view key) const;
  [[nodiscard]] bool has(std::string_view key) const;
  /// Marks a key as handled by the caller (e.g. parsed by another reader).
  const nlohmann::json* take(std::string_view key);

  std::optional<Count> integer(std::string_view key, Count min, Count max);
  std::optional<double> number(std::string_view key, double min, double max, bool min_exclusive);
  std::optional<bool> boolean(std::string_view key);
  std::optional<std::string> string(std::string_view key);
  /// One of `names`; returns its index.
  std::optional<int> choice(std::string_view key, std::initializer_list<std::string_view> names);

  /// Throws for the first key that no accessor asked for (with a did-you-mean hint).
  void finish(std::initializer_list<std::string_view> ignored = {}) const;
  /// Throws for a required `key` that is absent: for an unknown key that looks like it first.
  [[noreturn]] void missing(std::string_view key, std::string_view message) const;

 private:
  const nlohmann::json* find(std::string_view key);
  const nlohmann::json& j_;
  std::string path_;
  std::vector<std::string> seen_;
};

/// "null", "a boolean", "a number", "a string", "an array" or "an object", for messages.
std::string_view json_type_name(const nlohmann::json& j);

/// Escapes a key for use in a JSON pointer (RFC 6901).
std::string pointer_escape(std::string_view key);

}  // namespace distplan::detail
