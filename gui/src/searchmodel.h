// Table model over the search's ranked plans (plain rows, so the view works with or without the
// search library): layout (tp, cp, pp, v, dp, ep, micro-batch, ZeRO, recompute, sp, schedule),
// pipeline split (when a plan has light ends), peak memory, step time, tokens/s, MFU, bubble.
#pragma once

#include <vector>

#include <QAbstractTableModel>

#include "distplan/planner/spec.h"

namespace distplan::gui {

struct SearchRow {
  int rank = 0;  // 1 = best
  ParallelSpec parallel;
  Count shard_group =
      0;  // the layout's ZeRO shard group (0: the whole dp group), as the CLI has it
  Count micro_batch_size = 1;
  // The search's split choice: the first and last stages hold fewer layers (the CLI's "light
  // ends" note). `parallel` carries the split itself, so the row plans as it was searched.
  bool light_ends = false;
  Bytes peak_bytes = 0;
  Bytes capacity_bytes = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;
  double bubble_fraction = 0;
  bool operator==(const SearchRow&) const = default;
};

class SearchModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column {
    RankColumn,
    TpColumn,
    CpColumn,
    PpColumn,
    VirtualStagesColumn,
    DpColumn,
    EpColumn,
    MicroBatchColumn,
    ZeroColumn,
    RecomputeColumn,
    SequenceParallelColumn,
    ScheduleColumn,
    SplitColumn,
    PeakColumn,
    StepColumn,
    TokensColumn,
    MfuColumn,
    BubbleColumn,
    ColumnCount
  };
  /// Qt::UserRole holds each cell's number (the sort key).
  static constexpr int SortRole = Qt::UserRole;

  explicit SearchModel(QObject* parent = nullptr);

  void setRows(std::vector<SearchRow> rows);
  [[nodiscard]] const std::vector<SearchRow>& rows() const { return rows_; }
  /// Whether a parallel axis column (cp, v, ep) holds anything but 1, or the split column a plan
  /// with light ends: the view hides it when not.
  [[nodiscard]] bool axisUsed(Column column) const;

  [[nodiscard]] int rowCount(const QModelIndex& parent = {}) const override;
  [[nodiscard]] int columnCount(const QModelIndex& parent = {}) const override;
  [[nodiscard]] QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  [[nodiscard]] QVariant headerData(int section, Qt::Orientation orientation,
                                    int role = Qt::DisplayRole) const override;

 private:
  std::vector<SearchRow> rows_;
};

}  // namespace distplan::gui
