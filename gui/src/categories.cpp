#include "categories.h"

#include <QCoreApplication>
#include <QLocale>

namespace distplan::gui {

QString categoryKey(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::weights:
      return QStringLiteral("weights");
    case MemoryCategory::gradients:
      return QStringLiteral("gradients");
    case MemoryCategory::optimizer:
      return QStringLiteral("optimizer");
    case MemoryCategory::activations:
      return QStringLiteral("activations");
    case MemoryCategory::buffers:
      return QStringLiteral("buffers");
    case MemoryCategory::runtime:
      return QStringLiteral("runtime");
  }
  return {};
}

QString categoryLabel(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::weights:
      return QCoreApplication::translate("Categories", "Weights");
    case MemoryCategory::gradients:
      return QCoreApplication::translate("Categories", "Gradients");
    case MemoryCategory::optimizer:
      return QCoreApplication::translate("Categories", "Optimizer");
    case MemoryCategory::activations:
      return QCoreApplication::translate("Categories", "Activations");
    case MemoryCategory::buffers:
      return QCoreApplication::translate("Categories", "Buffers");
    case MemoryCategory::runtime:
      return QCoreApplication::translate("Categories", "Runtime");
  }
  return {};
}

QColor categoryColor(MemoryCategory c) {
  // A qualitative palette (ColorBrewer Set2-like) that stays distinct when stacked.
  switch (c) {
    case MemoryCategory::weights:
      return QColor(0x4e, 0x79, 0xa7);
    case MemoryCategory::gradients:
      return QColor(0xf2, 0x8e, 0x2b);
    case MemoryCategory::optimizer:
      return QColor(0xe1, 0x57, 0x59);
    case MemoryCategory::activations:
      return QColor(0x59, 0xa1, 0x4f);
    case MemoryCategory::buffers:
      return QColor(0xb0, 0x7a, 0xa1);
    case MemoryCategory::runtime:
      return QColor(0x9c, 0x9c, 0x9c);
  }
  return Qt::black;
}

Bytes categoryBytes(const StageMemory& s, MemoryCategory c) {
  switch (c) {
    case MemoryCategory::weights:
      return s.weights_bytes;
    case MemoryCategory::gradients:
      return s.gradients_bytes;
    case MemoryCategory::optimizer:
      return s.optimizer_bytes;
    case MemoryCategory::activations:
      return s.activations_bytes;
    case MemoryCategory::buffers:
      return s.buffers_bytes;
    case MemoryCategory::runtime:
      return s.runtime_bytes;
  }
  return 0;
}

QString formatGiB(Bytes bytes) {
  return QCoreApplication::translate("Categories", "%1 GiB").arg(to_gib(bytes), 0, 'f', 2);
}

QString formatBytesExact(Bytes bytes) {
  return QCoreApplication::translate("Categories", "%1 (%2 B)")
      .arg(formatGiB(bytes), QLocale(QLocale::English).toString(static_cast<qlonglong>(bytes)));
}

}  // namespace distplan::gui
