// Table model over the planner's collectives: per group and op, the buffer per call, the calls per
// step, the wire bytes one GPU sends per step and the link they cross.
#pragma once

#include <vector>

#include <QAbstractTableModel>

#include "distplan/planner/estimate.h"

namespace distplan::gui {

class CommunicationModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column {
    GroupColumn,
    OpColumn,
    WhatColumn,
    LinkColumn,
    GroupSizeColumn,
    BytesPerCallColumn,
    CallsColumn,
    WireBytesColumn,
    TimeColumn,
    ColumnCount
  };

  explicit CommunicationModel(QObject* parent = nullptr);

  void setCommunication(const CommunicationEstimate& communication);
  [[nodiscard]] const CommunicationEstimate& communication() const { return communication_; }

  [[nodiscard]] int rowCount(const QModelIndex& parent = {}) const override;
  [[nodiscard]] int columnCount(const QModelIndex& parent = {}) const override;
  [[nodiscard]] QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  [[nodiscard]] QVariant headerData(int section, Qt::Orientation orientation,
                                    int role = Qt::DisplayRole) const override;

 private:
  CommunicationEstimate communication_;
};

}  // namespace distplan::gui
