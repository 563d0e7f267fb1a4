// `training.peft` read and echoed (peft_json.cpp), private to the planner's JSON readers.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "distplan/planner/object_reader.h"
#include "distplan/planner/spec.h"

namespace distplan::detail {

/// Reads `training.peft` into t.peft; t.precision and the model must be read already.
void read_peft(const nlohmann::json& doc, const std::string& path, const ModelSpec& m,
               TrainingSpec& t);
/// The object read_peft reads back to the same PeftSpec.
nlohmann::json peft_json(const PeftSpec& p);

}  // namespace distplan::detail
