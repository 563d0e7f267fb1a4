#include "memorymodel.h"

#include <QBrush>

#include "categories.h"

namespace distplan::gui {

MemoryModel::MemoryModel(QObject* parent) : QAbstractTableModel(parent) {}

void MemoryModel::setMemory(const MemoryEstimate& memory) {
  beginResetModel();
  memory_ = memory;
  endResetModel();
}

int MemoryModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(memory_.stages.size());
}

int MemoryModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ReservedColumn + 1;
}

QVariant MemoryModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid()) return {};
  const StageMemory& s = memory_.stages[static_cast<std::size_t>(index.row())];
  const int c = index.column();
  Bytes bytes = -1;
  if (c >= FirstCategoryColumn && c < TotalColumn) {
    bytes = categoryBytes(s, kMemoryCategories[static_cast<std::size_t>(c - FirstCategoryColumn)]);
  } else if (c == TotalColumn) {
    bytes = s.total_bytes;
  } else if (c == TransientColumn) {
    bytes = s.transient_bytes;
  } else if (c == AllocatedColumn) {
    bytes = s.allocated_bytes;
  } else if (c == ReservedColumn) {
    bytes = s.reserved_bytes;
  }
  switch (role) {
    case Qt::DisplayRole:
      if (c == StageColumn) return s.stage;
      if (c == LayersColumn) {
        return tr("%1 (%2–%3)").arg(s.num_layers).arg(s.first_layer).arg(s.end_layer - 1);
      }
      if (c == InflightColumn) return QString::number(s.inflight_microbatches, 'g', 4);
      return QString::number(to_gib(bytes), 'f', 2);
    case Qt::ToolTipRole:
      if (bytes >= 0 && c == FirstCategoryColumn && s.frozen_weights_bytes > 0) {
        // Fine-tuning: the frozen base and what trains (docs/peft.md).
        return tr("%1\nfrozen %2\ntrained %3")
            .arg(formatBytesExact(bytes), formatBytesExact(s.frozen_weights_bytes),
                 formatBytesExact(bytes - s.frozen_weights_bytes));
      }
      if (bytes >= 0) return formatBytesExact(bytes);
      return {};
    case Qt::UserRole:
      if (bytes >= 0) return QVariant::fromValue<qlonglong>(bytes);
      return {};
    case Qt::TextAlignmentRole:
      return QVariant(Qt::AlignRight | Qt::AlignVCenter);
    case Qt::ForegroundRole:
      if (c == ReservedColumn && s.reserved_bytes > memory_.capacity_bytes) return QBrush(Qt::red);
      return {};
    default:
      return {};
  }
}

QVariant MemoryModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal) return {};
  if (role == Qt::DecorationRole && section >= FirstCategoryColumn && section < TotalColumn) {
    return categoryColor(
        kMemoryCategories[static_cast<std::size_t>(section - FirstCategoryColumn)]);
  }
  if (role == Qt::ToolTipRole) {
    switch (section) {
      case TotalColumn:
        return tr("The categories plus the transient (docs/memory.md)");
      case TransientColumn:
        return tr("Inside a layer's backward: activation gradients, framework buckets");
      case AllocatedColumn:
        return tr(
            "What the caching allocator hands out at the peak "
            "(torch.cuda.max_memory_allocated)");
      case ReservedColumn:
        return tr(
            "What the GPU holds: the allocator's segments plus the runtime outside it; "
            "what fits compares");
      default:
        return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  switch (section) {
    case StageColumn:
      return tr("Stage");
    case LayersColumn:
      return tr("Layers");
    case InflightColumn:
      return tr("In flight");
    // GiB throughout (the view's caption says so), so thirteen columns fit beside the editor.
    case TotalColumn:
      return tr("Total");
    case TransientColumn:
      return tr("Transient");
    case AllocatedColumn:
      return tr("Allocated");
    case ReservedColumn:
      return tr("Reserved");
    default:
      return categoryLabel(
          kMemoryCategories[static_cast<std::size_t>(section - FirstCategoryColumn)]);
  }
}

}  // namespace distplan::gui
