#include "searchmodel.h"

#include <algorithm>

#include "categories.h"

namespace distplan::gui {

namespace {
QString qs(std::string_view v) {
  return QString::fromUtf8(v.data(), static_cast<int>(v.size()));
}
}  // namespace

SearchModel::SearchModel(QObject* parent) : QAbstractTableModel(parent) {}

void SearchModel::setRows(std::vector<SearchRow> rows) {
  beginResetModel();
  rows_ = std::move(rows);
  endResetModel();
}

bool SearchModel::axisUsed(Column column) const {
  return std::any_of(rows_.begin(), rows_.end(), [column](const SearchRow& r) {
    switch (column) {
      case CpColumn:
        return r.parallel.cp > 1;
      case VirtualStagesColumn:
        return r.parallel.virtual_stages > 1;
      case EpColumn:
        return r.parallel.ep > 1;
      case SplitColumn:
        return r.light_ends;
      default:
        return true;
    }
  });
}

int SearchModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int SearchModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant SearchModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid()) return {};
  const SearchRow& r = rows_[static_cast<std::size_t>(index.row())];
  const ParallelSpec& p = r.parallel;
  if (role == SortRole) {
    switch (index.column()) {
      case RankColumn:
        return r.rank;
      case TpColumn:
        return QVariant::fromValue<qlonglong>(p.tp);
      case CpColumn:
        return QVariant::fromValue<qlonglong>(p.cp);
      case PpColumn:
        return QVariant::fromValue<qlonglong>(p.pp);
      case VirtualStagesColumn:
        return QVariant::fromValue<qlonglong>(p.virtual_stages);
      case DpColumn:
        return QVariant::fromValue<qlonglong>(p.dp);
      case EpColumn:
        return QVariant::fromValue<qlonglong>(p.ep);
      case MicroBatchColumn:
        return QVariant::fromValue<qlonglong>(r.micro_batch_size);
      case ZeroColumn:
        return p.zero_stage;
      case RecomputeColumn:
        return static_cast<int>(p.recompute);
      case SequenceParallelColumn:
        return p.sequence_parallel;
      case ScheduleColumn:
        return static_cast<int>(p.schedule);
      case SplitColumn:
        return r.light_ends;
      case PeakColumn:
        return QVariant::fromValue<qlonglong>(r.peak_bytes);
      case StepColumn:
        return r.step_seconds;
      case TokensColumn:
        return r.tokens_per_second;
      case MfuColumn:
        return r.mfu;
      case BubbleColumn:
        return r.bubble_fraction;
      default:
        return {};
    }
  }
  if (role == Qt::ToolTipRole && index.column() == ZeroColumn && r.shard_group > 0) {
    return tr("ZeRO-%1 sharded over groups of %2 within dp %3")
        .arg(p.zero_stage)
        .arg(r.shard_group)
        .arg(p.dp);
  }
  if (role == Qt::ToolTipRole && index.column() == CpColumn && p.cp > 1) {
    return tr("context parallel: each sequence split over %1 GPUs (%2 exchange)")
        .arg(p.cp)
        .arg(qs(to_string(p.cp_comm)));
  }
  if (role == Qt::ToolTipRole && index.column() == PeakColumn) {
    return tr("%1 of %2").arg(formatBytesExact(r.peak_bytes), formatGiB(r.capacity_bytes));
  }
  if (role == Qt::TextAlignmentRole) return QVariant(Qt::AlignRight | Qt::AlignVCenter);
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case RankColumn:
      return r.rank;
    case TpColumn:
      return QVariant::fromValue<qlonglong>(p.tp);
    case CpColumn:
      return QVariant::fromValue<qlonglong>(p.cp);
    case PpColumn:
      return QVariant::fromValue<qlonglong>(p.pp);
    case VirtualStagesColumn:
      return QVariant::fromValue<qlonglong>(p.virtual_stages);
    case DpColumn:
      return QVariant::fromValue<qlonglong>(p.dp);
    case EpColumn:
      return QVariant::fromValue<qlonglong>(p.ep);
    case MicroBatchColumn:
      return QVariant::fromValue<qlonglong>(r.micro_batch_size);
    case ZeroColumn:
      // As `distplan search --format table` writes it: "3/4" is ZeRO-3 sharded over groups of 4.
      if (p.zero_stage > 0 && r.shard_group > 0) {
        return QStringLiteral("%1/%2").arg(p.zero_stage).arg(r.shard_group);
      }
      return QString::number(p.zero_stage);
    case RecomputeColumn:
      return qs(to_string(p.recompute));
    case SequenceParallelColumn:
      return p.sequence_parallel ? tr("on") : tr("-");
    case ScheduleColumn:
      return qs(to_string(p.schedule));
    case SplitColumn:
      return r.light_ends ? tr("light ends") : tr("even");
    case PeakColumn:
      return QString::number(to_gib(r.peak_bytes), 'f', 2);
    case StepColumn:
      return QString::number(r.step_seconds * 1e3, 'f', 1);
    case TokensColumn:
      return QString::number(r.tokens_per_second, 'f', 0);
    case MfuColumn:
      return QString::number(r.mfu * 100, 'f', 1);
    case BubbleColumn:
      return QString::number(r.bubble_fraction * 100, 'f', 1);
    default:
      return {};
  }
}

QVariant SearchModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal) return {};
  if (role == Qt::ToolTipRole) {
    switch (section) {
      case CpColumn:
        return tr("context parallel size (the sequence split over cp GPUs)");
      case VirtualStagesColumn:
        return tr("virtual pipeline stages per GPU (interleaved and V schedules)");
      case EpColumn:
        return tr("expert parallel size (each MoE layer's experts split ep ways)");
      case MicroBatchColumn:
        return tr("micro-batch size");
      case ZeroColumn:
        return tr("ZeRO stage; 3/4: ZeRO-3 sharded over groups of 4 (as the CLI writes it)");
      case SequenceParallelColumn:
        return tr("sequence parallelism");
      case ScheduleColumn:
        return tr("pipeline schedule");
      case SplitColumn:
        return tr(
            "pipeline split: light ends = the first and last stages hold fewer layers "
            "(they also hold the embedding and the loss); even = equal layers per stage");
      default:
        return {};
    }
  }
  if (role != Qt::DisplayRole) return {};
  // Short headers, as `distplan search --format table` has them, so every column fits.
  switch (section) {
    case RankColumn:
      return tr("#");
    case TpColumn:
      return tr("tp");
    case CpColumn:
      return tr("cp");
    case PpColumn:
      return tr("pp");
    case VirtualStagesColumn:
      return tr("v");
    case DpColumn:
      return tr("dp");
    case EpColumn:
      return tr("ep");
    case MicroBatchColumn:
      return tr("mb");
    case ZeroColumn:
      return tr("ZeRO");
    case RecomputeColumn:
      return tr("recompute");
    case SequenceParallelColumn:
      return tr("sp");
    case ScheduleColumn:
      return tr("schedule");
    case SplitColumn:
      return tr("split");
    case PeakColumn:
      return tr("peak GiB");
    case StepColumn:
      return tr("step ms");
    case TokensColumn:
      return tr("tokens/s");
    case MfuColumn:
      return tr("MFU %");
    case BubbleColumn:
      return tr("bubble %");
    default:
      return {};
  }
}

}  // namespace distplan::gui
