#include "json_reader.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/suggest.h"

namespace distplan::detail {
namespace {

std::string_view type_name(const nlohmann::json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  return "an object";
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t prev = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cur = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
      prev = cur;
    }
  }
  return row[b.size()];
}

// Printable, bounded rendering of a key taken from input (which may hold any bytes).
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (s.size() > 64) out += "...";
  return out;
}

// Lower case without the separators people vary ('-', '_', '.', ' ').
std::string fold(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 128)) {
    if (c == '-' || c == '_' || c == '.' || c == ' ') continue;
    out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  return out;
}

}  // namespace
}  // namespace distplan::detail

namespace distplan {

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

std::optional<std::string> closest_name(std::string_view name,
                                        const std::vector<std::string>& candidates) {
  const std::string n = detail::fold(name);
  std::optional<std::string> best;
  std::size_t best_d = 0;
  for (const std::string& c : candidates) {
    const std::string k = detail::fold(c);
    if (k.empty() || n.empty()) continue;
    std::size_t d = detail::edit_distance(n, k);
    const std::size_t shorter = std::min(n.size(), k.size());
    const bool prefix = shorter >= 4 && (k.starts_with(n) || n.starts_with(k));
    const std::size_t limit = std::max<std::size_t>(2, std::max(n.size(), k.size()) / 3);
    if (d > limit && !prefix) continue;
    if (prefix) d = std::min(d, std::max(n.size(), k.size()) - shorter);
    if (!best || d < best_d) best = c, best_d = d;
  }
  return best;
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
  const auto c = closest_name(name, candidates);
  return c ? fmt::format(" (did you mean '{}'?)", *c) : std::string();
}

}  // namespace distplan

namespace distplan::detail {

std::string list_hint(const nlohmann::json& v) {
  return v.is_array() ? "; a plan takes one value, lists of candidates are for `distplan search` "
                        "(docs/search.md)"
                      : "";
}

std::string_view json_type_name(const nlohmann::json& j) {
  return type_name(j);
}

std::string pointer_escape(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

ObjectReader::ObjectReader(const nlohmann::json& j, std::string path)
    : j_(j), path_(std::move(path)) {
  if (!j.is_object()) {
    throw InputError(path_, fmt::format("must be an object, not {}", type_name(j)));
  }
}

std::string ObjectReader::child(std::string_view key) const {
  return path_ + "/" + pointer_escape(key);
}

bool ObjectReader::has(std::string_view key) const {
  return j_.contains(key);
}

const nlohmann::json* ObjectReader::find(std::string_view key) {
  seen_.emplace_back(key);
  auto it = j_.find(key);
  if (it == j_.end()) return nullptr;
  return &*it;
}

const nlohmann::json* ObjectReader::take(std::string_view key) {
  return find(key);
}

std::optional<Count> ObjectReader::integer(std::string_view key, Count min, Count max) {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  Count value = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(max)) {
      throw InputError(child(key), fmt::format("{} is too large (at most {})", key, max));
    }
    value = v->get<Count>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) {
      throw InputError(child(key), fmt::format("{} must be an integer", key));
    }
    if (d > static_cast<double>(max)) {
      throw InputError(child(key), fmt::format("{} is too large (at most {})", key, max));
    }
    if (d < static_cast<double>(min)) {
      throw InputError(child(key), fmt::format("{} must be at least {}", key, min));
    }
    value = static_cast<Count>(d);
  } else {
    throw InputError(child(key), fmt::format("{} must be an integer, not {}{}", key, type_name(*v),
                                             list_hint(*v)));
  }
  if (value < min)
    throw InputError(child(key), fmt::format("{}={} must be at least {}", key, value, min));
  if (value > max)
    throw InputError(child(key), fmt::format("{}={} is too large (at most {})", key, value, max));
  return value;
}

std::optional<double> ObjectReader::number(std::string_view key, double min, double max,
                                           bool min_exclusive) {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) {
    throw InputError(child(key), fmt::format("{} must be a number, not {}", key, type_name(*v)));
  }
  const double d = v->get<double>();
  if (!std::isfinite(d)) throw InputError(child(key), fmt::format("{} must be finite", key));
  if (min_exclusive ? d <= min : d < min) {
    throw InputError(child(key), fmt::format("{}={} must be {} {}", key, d,
                                             min_exclusive ? "greater than" : "at least", min));
  }
  if (d > max) throw InputError(child(key), fmt::format("{}={} must be at most {}", key, d, max));
  return d;
}

std::optional<bool> ObjectReader::boolean(std::string_view key) {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) {
    throw InputError(child(key), fmt::format("{} must be true or false, not {}{}", key,
                                             type_name(*v), list_hint(*v)));
  }
  return v->get<bool>();
}

std::optional<std::string> ObjectReader::string(std::string_view key) {
  const nlohmann::json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    throw InputError(child(key), fmt::format("{} must be a string, not {}{}", key, type_name(*v),
                                             list_hint(*v)));
  }
  std::string text = v->get<std::string>();
  // Names reach terminals in tables: a control character (C0, DEL, or C1 as UTF-8 U+0080-U+009F)
  // could move the cursor or recolour the screen, so it is refused rather than printed raw.
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool c1 = c == 0xC2 && i + 1 < text.size() &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (c < 0x20 || c == 0x7F || c1) {
      throw InputError(child(key),
                       fmt::format("{} must not contain control characters (byte {} "
                                   "is U+{:04X})",
                                   key, i, c1 ? static_cast<unsigned char>(text[i + 1]) : c));
    }
  }
  return text;
}

std::optional<int> ObjectReader::choice(std::string_view key,
                                        std::initializer_list<std::string_view> names) {
  const auto s = string(key);
  if (!s) return std::nullopt;
  int i = 0;
  for (std::string_view n : names) {
    if (*s == n) return i;
    ++i;
  }
  throw InputError(child(key), fmt::format("{}='{}' is not one of: {}", key, printable(*s),
                                           fmt::join(names, ", ")));
}

void ObjectReader::finish(std::initializer_list<std::string_view> ignored) const {
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(seen_.begin(), seen_.end(), k) != seen_.end()) continue;
    if (std::find(ignored.begin(), ignored.end(), k) != ignored.end()) continue;
    std::vector<std::string> known = seen_;
    known.insert(known.end(), ignored.begin(), ignored.end());
    throw InputError(child(k),
                     fmt::format("unknown field '{}'{}", printable(k), did_you_mean(k, known)));
  }
}

void ObjectReader::missing(std::string_view key, std::string_view message) const {
  // A misspelling of the missing field is the likelier mistake: report it first.
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(seen_.begin(), seen_.end(), k) != seen_.end()) continue;
    if (closest_name(k, {std::string(key)})) {
      throw InputError(child(k), fmt::format("unknown field '{}' (did you mean '{}'?); {}",
                                             printable(k), key, message));
    }
  }
  throw InputError(child(key), std::string(message));
}

}  // namespace distplan::detail
