// Table model over the planner's per-stage memory: one row per pipeline stage, one column per
// category, then total, transient, allocated and reserved as the CLI's table has them (GiB shown,
// exact bytes in the tooltip and under Qt::UserRole).
#pragma once

#include <vector>

#include <QAbstractTableModel>

#include "distplan/planner/estimate.h"

namespace distplan::gui {

class MemoryModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  // The CLI's columns (`distplan plan --format table`): the six categories, their total with the
  // transient, then the transient alone, what the allocator hands out and what the GPU holds.
  enum Column {
    StageColumn,
    LayersColumn,
    InflightColumn,
    FirstCategoryColumn,
    TotalColumn = 9,
    TransientColumn,
    AllocatedColumn,
    ReservedColumn,
  };

  explicit MemoryModel(QObject* parent = nullptr);

  void setMemory(const MemoryEstimate& memory);
  [[nodiscard]] const MemoryEstimate& memory() const { return memory_; }

  [[nodiscard]] int rowCount(const QModelIndex& parent = {}) const override;
  [[nodiscard]] int columnCount(const QModelIndex& parent = {}) const override;
  [[nodiscard]] QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  [[nodiscard]] QVariant headerData(int section, Qt::Orientation orientation,
                                    int role = Qt::DisplayRole) const override;

 private:
  MemoryEstimate memory_;
};

}  // namespace distplan::gui
