// Schedule files: JSON and CSV (docs/simulator.md, "Schedule files").
#include "distplan/simulator/schedule_io.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/error.h"
#include "distplan/planner/scenario_json.h"

namespace distplan::sim {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::int32_t parse_index(std::string_view digits, std::string_view token, const std::string& path) {
  std::int32_t value = -1;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() || value < 0) {
    throw InputError(
        path,
        fmt::format("'{}' is not an action: expected F<mb>, B<mb>, BI<mb> or "
                    "W<mb>, optionally .<chunk> (e.g. F3, BI3.1) and, on a forward overlapped "
                    "with the next action, a trailing & (F3&)",
                    token));
  }
  return value;
}

void finish(SchedulePrograms& prog, std::optional<Count> m, std::optional<Count> v) {
  std::int32_t max_mb = -1, max_chunk = 0;
  for (const auto& stage : prog.programs)
    for (const Action& a : stage) {
      max_mb = std::max(max_mb, a.microbatch);
      max_chunk = std::max(max_chunk, a.chunk);
    }
  prog.stages = static_cast<Count>(prog.programs.size());
  prog.microbatches = m ? *m : max_mb + 1;
  prog.virtual_stages = v ? *v : max_chunk + 1;
}

Op parse_op_name(const nlohmann::json& j, const std::string& path) {
  if (!j.is_string()) throw InputError(path, "op must be a string");
  const auto name = j.get<std::string>();
  for (Op op : {Op::forward, Op::backward, Op::backward_input, Op::backward_weight})
    if (name == to_string(op)) return op;
  throw InputError(path, fmt::format("unknown op '{}': expected forward, backward, "
                                     "backward_input or backward_weight",
                                     name));
}

std::int32_t json_index(const nlohmann::json& j, const std::string& path) {
  if (!j.is_number_integer() || j.get<std::int64_t>() < 0 ||
      j.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max())
    throw InputError(path, "must be a non-negative integer");
  return static_cast<std::int32_t>(j.get<std::int64_t>());
}

}  // namespace

Action parse_action(std::string_view token, const std::string& path) {
  const std::string_view whole = token;
  token = trim(token);
  Action a;
  if (token.substr(0, 2) == "BI") {
    a.op = Op::backward_input;
    token.remove_prefix(2);
  } else if (!token.empty() && (token[0] == 'F' || token[0] == 'B' || token[0] == 'W')) {
    a.op = token[0] == 'F' ? Op::forward : token[0] == 'B' ? Op::backward : Op::backward_weight;
    token.remove_prefix(1);
  } else {
    parse_index({}, whole, path);  // throws the format message
  }
  // A trailing '&' overlaps a forward with the next action (an F&B pair; check_program).
  if (!token.empty() && token.back() == '&') {
    a.overlap_next = true;
    token.remove_suffix(1);
  }
  const std::size_t dot = token.find('.');
  a.microbatch = parse_index(token.substr(0, dot), whole, path);
  a.chunk = dot == std::string_view::npos ? 0 : parse_index(token.substr(dot + 1), whole, path);
  return a;
}

SchedulePrograms schedule_from_json(const nlohmann::json& doc) {
  if (!doc.is_object())
    throw InputError("", "a schedule file must be a JSON object with \"stages\"");
  std::optional<Count> m, v;
  SchedulePrograms prog;
  bool have_stages = false;
  for (const auto& [key, value] : doc.items()) {
    const std::string path = "/" + key;
    if (key == "microbatches" || key == "virtual_stages") {
      if (!value.is_number_integer() || value.get<std::int64_t>() < 1)
        throw InputError(path, "must be a positive integer");
      (key == "microbatches" ? m : v) = value.get<Count>();
    } else if (key == "placement") {
      if (!value.is_string() ||
          (value != "interleaved" && value != "v" && value != "bidirectional"))
        throw InputError(path,
                         "must be \"interleaved\" (chunk c of stage s is virtual stage "
                         "c*p + s), \"v\" (chunks s and 2p - 1 - s) or \"bidirectional\" "
                         "(DualPipe: model stages s and p - 1 - s)");
      prog.v_shape = value == "v";
      prog.bidirectional = value == "bidirectional";
    } else if (key == "schema" || key == "name" || key == "description") {
      if (!value.is_string()) throw InputError(path, "must be a string");
    } else if (key == "stages") {
      have_stages = true;
      if (!value.is_array() || value.empty())
        throw InputError(path, "must be a non-empty array with one program per stage");
      for (std::size_t s = 0; s < value.size(); ++s) {
        const auto& row = value[s];
        const std::string rpath = fmt::format("/stages/{}", s);
        if (!row.is_array())
          throw InputError(rpath, "a stage's program must be an array of actions");
        auto& actions = prog.programs.emplace_back();
        actions.reserve(row.size());
        for (std::size_t i = 0; i < row.size(); ++i) {
          const auto& item = row[i];
          const std::string apath = fmt::format("{}/{}", rpath, i);
          if (item.is_string()) {
            actions.push_back(parse_action(item.get<std::string>(), apath));
          } else if (item.is_object()) {
            Action a;
            bool have_op = false, have_mb = false;
            for (const auto& [k, x] : item.items()) {
              if (k == "op") {
                a.op = parse_op_name(x, apath + "/op");
                have_op = true;
              } else if (k == "microbatch") {
                a.microbatch = json_index(x, apath + "/microbatch");
                have_mb = true;
              } else if (k == "chunk") {
                a.chunk = json_index(x, apath + "/chunk");
              } else if (k == "overlap_next") {
                if (!x.is_boolean()) throw InputError(apath + "/overlap_next", "must be a boolean");
                a.overlap_next = x.get<bool>();
              } else {
                throw InputError(apath + "/" + k, fmt::format("unknown field '{}'", k));
              }
            }
            if (!have_op) throw InputError(apath + "/op", "missing field 'op'");
            if (!have_mb) throw InputError(apath + "/microbatch", "missing field 'microbatch'");
            actions.push_back(a);
          } else {
            throw InputError(apath,
                             "an action is a string like \"F3\" or an object with op, "
                             "microbatch and chunk");
          }
        }
      }
    } else {
      throw InputError(path, fmt::format("unknown field '{}'", key));
    }
  }
  if (!have_stages) throw InputError("/stages", "missing field 'stages'");
  finish(prog, m, v);
  return prog;
}

SchedulePrograms schedule_from_csv(std::string_view text) {
  SchedulePrograms prog;
  std::size_t row = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty() || line.front() == '#') continue;
    auto& actions = prog.programs.emplace_back();
    std::size_t col = 0;
    while (true) {
      const std::size_t comma = line.find(',');
      const std::string_view cell = trim(line.substr(0, comma));
      if (!cell.empty())
        actions.push_back(parse_action(cell, fmt::format("/stages/{}/{}", row, col)));
      ++col;
      if (comma == std::string_view::npos) break;
      line.remove_prefix(comma + 1);
    }
    ++row;
  }
  if (prog.programs.empty()) throw InputError("/stages", "the CSV schedule has no stage rows");
  finish(prog, std::nullopt, std::nullopt);
  return prog;
}

SchedulePrograms schedule_from_text(std::string_view text) {
  const std::string_view t = trim(text);
  const std::size_t first = t.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && t[first] == '{') {
    // The scenario's parser: the same errors at the same pointers (1e999, duplicate keys, NUL).
    return schedule_from_json(parse_json_text(text));
  }
  return schedule_from_csv(text);
}

nlohmann::json schedule_to_json(const SchedulePrograms& prog) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& actions : prog.programs) {
    nlohmann::json row = nlohmann::json::array();
    for (const Action& a : actions) row.push_back(action_to_string(a));
    stages.push_back(std::move(row));
  }
  nlohmann::json out = {{"microbatches", prog.microbatches},
                        {"virtual_stages", prog.virtual_stages},
                        {"stages", std::move(stages)}};
  if (prog.v_shape) out["placement"] = "v";
  if (prog.bidirectional) out["placement"] = "bidirectional";
  return out;
}

std::string schedule_to_csv(const SchedulePrograms& prog) {
  std::string out;
  for (const auto& actions : prog.programs) {
    for (std::size_t i = 0; i < actions.size(); ++i) {
      if (i) out += ',';
      out += action_to_string(actions[i]);
    }
    out += '\n';
  }
  return out;
}

}  // namespace distplan::sim
