// Helpers shared by the GUI tests: set editor fields the way a person does, and compare what a
// view shows with the planner's own answer for the editor's document.
#pragma once

#include <QComboBox>
#include <QImage>
#include <QSpinBox>
#include <QtTest>
#include <set>

#include "mainwindow.h"
#include "scenarioeditor.h"

namespace distplan::gui::test {

/// Picks the item whose data is `value` in the combo at JSON path `path`.
inline bool chooseInt(MainWindow& w, const char* path, qlonglong value) {
  auto* box = w.editor()->findChild<QComboBox*>(QString::fromLatin1(path));
  if (!box) return false;
  const int index = box->findData(QVariant::fromValue(value));
  if (index < 0) return false;
  box->setCurrentIndex(index);
  return true;
}

inline bool chooseText(MainWindow& w, const char* path, const QString& text) {
  auto* box = w.editor()->findChild<QComboBox*>(QString::fromLatin1(path));
  if (!box) return false;
  const int index = box->findText(text);
  if (index < 0) return false;
  box->setCurrentIndex(index);
  return true;
}

inline bool setCount(MainWindow& w, const char* path, int value) {
  auto* box = w.editor()->findChild<QSpinBox*>(QString::fromLatin1(path));
  if (!box) return false;
  box->setValue(value);
  return true;
}

/// Share of the pixels of `image` that have its most common colour (1.0: a blank picture), and
/// the number of distinct colours.
inline std::pair<double, std::size_t> colourStats(const QImage& image) {
  std::map<QRgb, std::size_t> counts;
  for (int y = 0; y < image.height(); y += 2) {
    for (int x = 0; x < image.width(); x += 2) ++counts[image.pixel(x, y)];
  }
  std::size_t total = 0, top = 0;
  for (const auto& [rgb, n] : counts) {
    total += n;
    top = std::max(top, n);
  }
  return {total ? static_cast<double>(top) / static_cast<double>(total) : 1.0, counts.size()};
}

}  // namespace distplan::gui::test
