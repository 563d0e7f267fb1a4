// Communication tab: the collectives as a sortable table and a chart of the wire bytes one GPU
// sends per step, per group and op, split by the link they cross.
#pragma once

#include <QWidget>

#include "distplan/planner/estimate.h"

class QChart;
class QChartView;
class QHorizontalStackedBarSeries;
class QLabel;
class QSortFilterProxyModel;
class QTableView;

namespace distplan::gui {

class CommunicationModel;

class CommunicationView : public QWidget {
  Q_OBJECT

 public:
  explicit CommunicationView(QWidget* parent = nullptr);

  void setCommunication(const CommunicationEstimate& communication);

  [[nodiscard]] QChartView* chartView() const { return chartView_; }
  [[nodiscard]] CommunicationModel* model() const { return model_; }
  [[nodiscard]] QTableView* table() const { return table_; }

 private:
  void rebuildChart();

  CommunicationModel* model_ = nullptr;
  QSortFilterProxyModel* proxy_ = nullptr;
  QTableView* table_ = nullptr;
  QChart* chart_ = nullptr;
  QChartView* chartView_ = nullptr;
  QLabel* total_ = nullptr;
};

}  // namespace distplan::gui
