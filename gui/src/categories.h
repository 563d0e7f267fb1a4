// The memory categories of DESIGN.md ("one vocabulary everywhere") with one colour each, so the
// memory chart, its table and the validation chart always agree.
#pragma once

#include <array>

#include <QColor>
#include <QString>

#include "distplan/planner/estimate.h"

namespace distplan::gui {

enum class MemoryCategory { weights, gradients, optimizer, activations, buffers, runtime };

inline constexpr std::array<MemoryCategory, 6> kMemoryCategories = {
    MemoryCategory::weights,     MemoryCategory::gradients, MemoryCategory::optimizer,
    MemoryCategory::activations, MemoryCategory::buffers,   MemoryCategory::runtime};

/// The JSON name ("weights"), as in `<category>_bytes`.
[[nodiscard]] QString categoryKey(MemoryCategory c);
/// The name people read ("Weights").
[[nodiscard]] QString categoryLabel(MemoryCategory c);
[[nodiscard]] QColor categoryColor(MemoryCategory c);
/// The stage's figure for one category, in bytes.
[[nodiscard]] Bytes categoryBytes(const StageMemory& stage, MemoryCategory c);

/// Bytes for people: "12.34 GiB (13,249,974,272 B)".
[[nodiscard]] QString formatBytesExact(Bytes bytes);
[[nodiscard]] QString formatGiB(Bytes bytes);

}  // namespace distplan::gui
