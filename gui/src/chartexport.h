// Export of any chart or view as PNG (a grab of the widget) or SVG (the widget rendered into a
// QSvgGenerator, so text and shapes stay vectors).
#pragma once

#include <QString>

class QWidget;

namespace distplan::gui {

/// Writes `widget` to `path`; the suffix picks the format (".svg" or a raster format Qt knows).
/// Returns false and sets `error` when the file could not be written.
bool exportWidget(QWidget* widget, const QString& path, QString* error = nullptr);

/// Asks for a file name (PNG or SVG) and exports `widget`; reports failures in a message box.
void exportWidgetWithDialog(QWidget* parent, QWidget* widget, const QString& suggestedName);

/// Whether SVG export is built in (Qt SVG found at build time).
[[nodiscard]] bool svgExportAvailable();

}  // namespace distplan::gui
