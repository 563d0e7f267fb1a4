// Helpers shared by the GUI tests: set editor fields the way a person does, and compare what a
// view shows with the planner's own answer for the editor's document.
#pragma once

#include <QComboBox>
#include <QImage>
#include <QLineEdit>
#include <QSpinBox>
#include <QtTest>
#include <set>

#include "mainwindow.h"
#include "plansession.h"
#include "scenarioeditor.h"

namespace distplan::gui::test {

/// Loads the default scenario and waits for its plan (planning runs on a worker).
inline void loadDefault(MainWindow& w) {
  w.loadDefaultScenario();
  w.session()->waitForPlan();
}

/// Picks, as a person does, the item whose data is `value` in the combo at JSON path `path`,
/// then waits for the plan.
inline bool chooseInt(MainWindow& w, const char* path, qlonglong value) {
  auto* box = w.editor()->findChild<QComboBox*>(QString::fromLatin1(path));
  if (!box) return false;
  const int index = box->findData(QVariant::fromValue(value));
  if (index < 0) return false;
  box->setCurrentIndex(index);
  emit box->activated(index);
  return w.session()->waitForPlan();
}

inline bool chooseText(MainWindow& w, const char* path, const QString& text) {
  auto* box = w.editor()->findChild<QComboBox*>(QString::fromLatin1(path));
  if (!box) return false;
  const int index = box->findText(text);
  if (index < 0) return false;
  box->setCurrentIndex(index);
  emit box->activated(index);
  return w.session()->waitForPlan();
}

/// Types `text` into the field at `path` and finishes the edit, then waits for the plan.
inline bool typeText(MainWindow& w, const char* path, const QString& text) {
  auto* field = w.editor()->findChild<QLineEdit*>(QString::fromLatin1(path));
  if (!field) return false;
  field->setFocus();
  field->selectAll();
  QTest::keyClick(field, Qt::Key_Backspace);
  QTest::keyClicks(field, text);
  QTest::keyClick(field, Qt::Key_Return);
  return w.session()->waitForPlan();
}

inline bool setCount(MainWindow& w, const char* path, qlonglong value) {
  auto* field = w.editor()->findChild<QLineEdit*>(QString::fromLatin1(path));
  if (!field) return false;
  field->setText(QString::number(value));
  emit field->editingFinished();
  return w.session()->waitForPlan();
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
