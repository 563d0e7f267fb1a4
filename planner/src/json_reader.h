// Strict JSON object reader used by the scenario and preset parsers: every accessor checks the
// type and range of one field and names its JSON pointer on failure; finish() rejects unknown keys.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "distplan/planner/spec.h"
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

/// A model: a preset name, or an object (fields, optionally over a `preset` or `hf_config`).
ModelSpec read_model(const nlohmann::json& doc, const std::string& path);
/// A GPU: a preset name, or an object (fields, optionally over a `preset`).
GpuSpec read_gpu(const nlohmann::json& doc, const std::string& path);

/// "; ... lists are for `distplan search`" when `v` is an array, else "".
std::string list_hint(const nlohmann::json& v);

/// assumptions.framework_profile: fields present override `p` (framework.cpp).
void read_framework_profile(const nlohmann::json& doc, const std::string& path,
                            FrameworkProfile& p);
nlohmann::json framework_profile_json(const FrameworkProfile& p);

/// Escapes a key for use in a JSON pointer (RFC 6901).
std::string pointer_escape(std::string_view key);

}  // namespace distplan::detail
