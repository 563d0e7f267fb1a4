#include "chartexport.h"

#include <QFileDialog>
#include <QFileInfo>
#include <QMessageBox>
#include <QPainter>
#include <QPixmap>
#include <QWidget>

#ifdef DISTPLAN_GUI_HAVE_SVG
#include <QSvgGenerator>
#endif

namespace distplan::gui {

bool svgExportAvailable() {
#ifdef DISTPLAN_GUI_HAVE_SVG
  return true;
#else
  return false;
#endif
}

bool exportWidget(QWidget* widget, const QString& path, QString* error) {
  const QString suffix = QFileInfo(path).suffix().toLower();
  if (suffix == QLatin1String("svg")) {
#ifdef DISTPLAN_GUI_HAVE_SVG
    QSvgGenerator generator;
    generator.setFileName(path);
    generator.setSize(widget->size());
    generator.setViewBox(widget->rect());
    generator.setTitle(widget->windowTitle());
    QPainter painter;
    if (!painter.begin(&generator)) {
      if (error) *error = QWidget::tr("cannot write %1").arg(path);
      return false;
    }
    widget->render(&painter);
    painter.end();
    if (!QFileInfo::exists(path)) {
      if (error) *error = QWidget::tr("cannot write %1").arg(path);
      return false;
    }
    return true;
#else
    if (error) *error = QWidget::tr("SVG export needs Qt SVG, which this build lacks");
    return false;
#endif
  }
  const QPixmap pixmap = widget->grab();
  if (!pixmap.save(path)) {
    if (error) *error = QWidget::tr("cannot write %1").arg(path);
    return false;
  }
  return true;
}

void exportWidgetWithDialog(QWidget* parent, QWidget* widget, const QString& suggestedName) {
  QString filters = QWidget::tr("PNG image (*.png)");
  if (svgExportAvailable()) filters += QStringLiteral(";;") + QWidget::tr("SVG drawing (*.svg)");
  QString selected;
  const QString path =
      QFileDialog::getSaveFileName(parent, QWidget::tr("Export chart"),
                                   suggestedName + QStringLiteral(".png"), filters, &selected);
  if (path.isEmpty()) return;
  QString target = path;
  if (QFileInfo(target).suffix().isEmpty()) {
    target +=
        selected.contains(QLatin1String("svg")) ? QStringLiteral(".svg") : QStringLiteral(".png");
  }
  QString error;
  if (!exportWidget(widget, target, &error)) {
    QMessageBox::warning(parent, QWidget::tr("Export chart"), error);
  }
}

}  // namespace distplan::gui
