// Search tab: runs distplan::search on the current scenario's model, cluster and training in a
// worker thread, with a progress bar and Cancel; shows the ranked plans as a sortable table and as
// a scatter of peak memory against tokens/s with the capacity line. Double-clicking a plan loads
// its layout into the editor.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <QWidget>
#include <nlohmann/json_fwd.hpp>

#include "distplan/planner/spec.h"
#include "searchmodel.h"

class QChart;
class QChartView;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QProgressBar;
class QPushButton;
class QSortFilterProxyModel;
class QSpinBox;
class QTableView;
class QThread;
class QTimer;

namespace distplan::search {
struct Request;
}

namespace distplan::gui {

/// True for a search document: a `search` object, or lists of candidates in `parallel` or
/// `training.micro_batch_size` (docs/api.md, "search").
[[nodiscard]] bool isSearchDocument(const nlohmann::json& doc);

class SearchView : public QWidget {
  Q_OBJECT

 public:
  explicit SearchView(QWidget* parent = nullptr);
  ~SearchView() override;

  /// The scenario whose model, cluster and training the search keeps.
  void setBaseScenario(const Scenario& s);
  /// A search document (isSearchDocument) whose request, read by the search library, replaces
  /// the default space; null returns to searching every layout of the base scenario. A request
  /// the library refuses throws its InputError.
  void setDocument(const nlohmann::json& doc);
  [[nodiscard]] bool hasRequest() const { return request_ != nullptr; }
  /// The request's base scenario (model, cluster, training resolved by the planner's reader; a
  /// placeholder layout); null without a request.
  [[nodiscard]] const Scenario* requestBase() const;
  [[nodiscard]] static bool searchAvailable();

  void startSearch();
  void cancelSearch();
  [[nodiscard]] bool isRunning() const;

  [[nodiscard]] SearchModel* model() const { return model_; }
  [[nodiscard]] QTableView* table() const { return table_; }
  [[nodiscard]] QSortFilterProxyModel* proxy() const { return proxy_; }
  [[nodiscard]] QChartView* chartView() const { return chartView_; }
  [[nodiscard]] QString statusText() const;
  /// The memory margin the next search keeps free, a fraction (0.05: a plan fits when its peak is
  /// at most 95 % of the GPU's memory), as `search.memory_margin`.
  [[nodiscard]] double memoryMargin() const;
  void setMemoryMargin(double fraction);

 signals:
  /// A plan was double-clicked: its row in model().
  void planChosen(int row);
  void searchFinished();

 private:
  struct Job;
  void finishJob(const std::shared_ptr<Job>& job);
  void pollProgress();
  void rebuildChart();
  void showUsedAxes();
  void setRunning(bool running);

  std::optional<Scenario> base_;
  std::shared_ptr<const search::Request> request_;
  SearchModel* model_ = nullptr;
  QSortFilterProxyModel* proxy_ = nullptr;
  QTableView* table_ = nullptr;
  QChart* chart_ = nullptr;
  QChartView* chartView_ = nullptr;
  QComboBox* objective_ = nullptr;
  QSpinBox* topK_ = nullptr;
  QDoubleSpinBox* margin_ = nullptr;
  QPushButton* start_ = nullptr;
  QPushButton* cancel_ = nullptr;
  QProgressBar* progress_ = nullptr;
  QLabel* status_ = nullptr;
  QTimer* pollTimer_ = nullptr;
  double marginUsed_ = 0;          // the memory margin of the search shown
  std::shared_ptr<Job> job_;       // the running search the view waits for
  std::vector<QThread*> threads_;  // every worker still running (a cancelled one finishes alone)
};

}  // namespace distplan::gui
