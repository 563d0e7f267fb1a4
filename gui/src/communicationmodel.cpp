#include "communicationmodel.h"

#include "categories.h"

namespace distplan::gui {

namespace {
QString qs(std::string_view v) {
  return QString::fromUtf8(v.data(), static_cast<int>(v.size()));
}
}  // namespace

CommunicationModel::CommunicationModel(QObject* parent) : QAbstractTableModel(parent) {}

void CommunicationModel::setCommunication(const CommunicationEstimate& communication) {
  beginResetModel();
  communication_ = communication;
  endResetModel();
}

int CommunicationModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(communication_.collectives.size());
}

int CommunicationModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant CommunicationModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid()) return {};
  const Collective& c = communication_.collectives[static_cast<std::size_t>(index.row())];
  const int col = index.column();
  if (role == Qt::UserRole) {  // sort keys: raw numbers
    switch (col) {
      case GroupSizeColumn:
        return QVariant::fromValue<qlonglong>(c.group_size);
      case BytesPerCallColumn:
        return QVariant::fromValue<qlonglong>(c.bytes_per_call);
      case CallsColumn:
        return QVariant::fromValue<qlonglong>(c.calls_per_step);
      case WireBytesColumn:
        return QVariant::fromValue<qlonglong>(c.wire_bytes_per_gpu_per_step);
      case TimeColumn:
        return c.seconds_per_step;
      default:
        break;
    }
  }
  if (role == Qt::ToolTipRole) {
    if (col == BytesPerCallColumn) return formatBytesExact(c.bytes_per_call);
    if (col == WireBytesColumn) return formatBytesExact(c.wire_bytes_per_gpu_per_step);
    return {};
  }
  if (role == Qt::TextAlignmentRole && col >= GroupSizeColumn) {
    return QVariant(Qt::AlignRight | Qt::AlignVCenter);
  }
  if (role != Qt::DisplayRole) return {};
  switch (col) {
    case GroupColumn:
      return qs(to_string(c.group));
    case OpColumn:
      return qs(to_string(c.op));
    case WhatColumn:
      return qs(c.what());
    case LinkColumn:
      return qs(to_string(c.link));
    case GroupSizeColumn:
      return QVariant::fromValue<qlonglong>(c.group_size);
    case BytesPerCallColumn:
      return tr("%1 MiB").arg(static_cast<double>(c.bytes_per_call) / (1024.0 * 1024.0), 0, 'f', 2);
    case CallsColumn:
      return QVariant::fromValue<qlonglong>(c.calls_per_step);
    case WireBytesColumn:
      return QString::number(to_gib(c.wire_bytes_per_gpu_per_step), 'f', 3);
    case TimeColumn:
      return QString::number(c.seconds_per_step * 1e3, 'f', 2);
    default:
      return {};
  }
}

QVariant CommunicationModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  switch (section) {
    case GroupColumn:
      return tr("Group");
    case OpColumn:
      return tr("Op");
    case WhatColumn:
      return tr("What");
    case LinkColumn:
      return tr("Link");
    case GroupSizeColumn:
      return tr("Ranks");
    case BytesPerCallColumn:
      return tr("Buffer/call");
    case CallsColumn:
      return tr("Calls/step");
    case WireBytesColumn:
      return tr("Wire GiB/step");
    case TimeColumn:
      return tr("ms/step");
    default:
      return {};
  }
}

}  // namespace distplan::gui
