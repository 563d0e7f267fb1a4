// Summary tab: step time, tokens/s, MFU, bubble fraction, peak memory against capacity, whether
// the layout fits and, from the planner's fit suggestions, what would make it fit.
#pragma once

#include <vector>

#include <QHash>
#include <QWidget>

#include "distplan/planner/estimate.h"
#include "distplan/planner/report.h"
#include "distplan/planner/spec.h"

class QLabel;
class QTableWidget;

namespace distplan::gui {

class SummaryView : public QWidget {
  Q_OBJECT

 public:
  explicit SummaryView(QWidget* parent = nullptr);

  /// `suggestions`: the planner's fit_suggestions for the plan (computed on the plan's worker).
  void setPlan(const Scenario& s, const Estimate& e, std::vector<FitSuggestion> suggestions);
  [[nodiscard]] const std::vector<FitSuggestion>& suggestions() const { return suggestions_; }
  /// The text of the figure named `key` ("step", "tokens", "mfu", "bubble", "memory", "fits").
  [[nodiscard]] QString figureText(const QString& key) const;
  /// The levers line: cp, ep, FP8 and offload with the plan's host memory and PCIe traffic.
  [[nodiscard]] QString leversText() const;

 signals:
  /// A suggestion was double-clicked: its index in suggestions().
  void suggestionChosen(int index);

 private:
  void refresh();

  std::vector<FitSuggestion> suggestions_;
  Estimate estimate_;
  Scenario scenario_;
  QHash<QString, QLabel*> figures_;
  QLabel* details_ = nullptr;
  QLabel* levers_ = nullptr;
  QTableWidget* suggestionTable_ = nullptr;
};

}  // namespace distplan::gui
