// Memory tab: a stacked bar per pipeline stage by category (GiB), topped by the transient and the
// allocator's cache so it stands as high as the reserved bytes, the GPU's capacity as a line,
// exact bytes on hover, and the CLI's columns as a table.
#pragma once

#include <QWidget>

#include "categories.h"
#include "distplan/planner/estimate.h"

class QChart;
class QChartView;
class QLabel;
class QLineSeries;
class QStackedBarSeries;
class QTableView;

namespace distplan::gui {

class MemoryModel;

class MemoryView : public QWidget {
  Q_OBJECT

 public:
  explicit MemoryView(QWidget* parent = nullptr);

  void setMemory(const MemoryEstimate& memory);

  [[nodiscard]] QChartView* chartView() const { return chartView_; }
  [[nodiscard]] MemoryModel* model() const { return model_; }
  /// The bar heights drawn, in GiB: value of `category` on `stage` (the weights: frozen and
  /// trained together).
  [[nodiscard]] double barValueGiB(MemoryCategory category, int stage) const;
  /// Fine-tuning: the frozen weights' bar on `stage` in GiB (-1 when the plan freezes nothing).
  [[nodiscard]] double frozenWeightsGiB(int stage) const;
  [[nodiscard]] int barCount() const;
  /// The height of stage `stage`'s whole bar in GiB: categories, transient and allocator cache,
  /// i.e. the stage's reserved bytes.
  [[nodiscard]] double stackGiB(int stage) const;
  /// The capacity line's height in GiB.
  [[nodiscard]] double capacityLineGiB() const;

 private:
  void rebuildChart();
  bool frozen_ = false;  // the weights are drawn as frozen and trained bars (fine-tuning)

  MemoryModel* model_ = nullptr;
  QChart* chart_ = nullptr;
  QChartView* chartView_ = nullptr;
  QTableView* table_ = nullptr;
  QStackedBarSeries* bars_ = nullptr;
  QLineSeries* capacity_ = nullptr;
};

}  // namespace distplan::gui
