// distplan-gui: the interactive planner. With --screenshot it renders one tab offscreen at the
// given size, saves a PNG and exits (for docs and CI).
#include <cstdio>

#include <QApplication>
#include <QCommandLineParser>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QPixmap>
#include <QTimer>

#include "mainwindow.h"
#include "plansession.h"
#include "searchview.h"
#include "validationview.h"

using distplan::gui::MainWindow;

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setOrganizationName(QStringLiteral("distplan"));
  QApplication::setApplicationName(QStringLiteral("distplan-gui"));
  QApplication::setApplicationVersion(QStringLiteral("0.1.0"));

  QCommandLineParser parser;
  parser.setApplicationDescription(
      QApplication::translate("main", "Plan, simulate and search distributed training layouts."));
  parser.addHelpOption();
  parser.addVersionOption();
  const QCommandLineOption scenarioOption(QStringLiteral("scenario"),
                                          QApplication::translate("main", "Scenario JSON to open."),
                                          QStringLiteral("FILE"));
  const QCommandLineOption tabOption(QStringLiteral("tab"),
                                     QApplication::translate("main", "Tab to show: %1.")
                                         .arg(MainWindow::tabNames().join(QStringLiteral(", "))),
                                     QStringLiteral("NAME"));
  const QCommandLineOption screenshotOption(
      QStringLiteral("screenshot"),
      QApplication::translate("main", "Render the window, save it as a PNG and exit."),
      QStringLiteral("FILE"));
  const QCommandLineOption sizeOption(
      QStringLiteral("size"),
      QApplication::translate("main", "Window size for --screenshot (WxH)."), QStringLiteral("WxH"),
      QStringLiteral("1440x900"));
  const QCommandLineOption validationOption(
      QStringLiteral("validation-result"),
      QApplication::translate("main",
                              "A `distplan validate` result to show in the Validation tab."),
      QStringLiteral("FILE"));
  parser.addOptions({scenarioOption, tabOption, screenshotOption, sizeOption, validationOption});
  parser.process(app);

  const bool screenshot = parser.isSet(screenshotOption);
  MainWindow window(/*persistent=*/!screenshot);
  if (parser.isSet(scenarioOption)) {
    QString error;
    if (!window.openScenario(parser.value(scenarioOption), &error)) {
      std::fprintf(stderr, "distplan-gui: %s\n", qPrintable(error));
      return 2;
    }
  } else {
    window.loadDefaultScenario();
  }
  if (parser.isSet(validationOption) &&
      !window.validationView()->openFile(parser.value(validationOption))) {
    std::fprintf(stderr, "distplan-gui: cannot read %s\n",
                 qPrintable(parser.value(validationOption)));
    return 2;
  }
  const QString tab = parser.value(tabOption);
  if (!tab.isEmpty() && !window.showTab(tab)) {
    std::fprintf(stderr, "distplan-gui: unknown tab \"%s\" (one of %s)\n", qPrintable(tab),
                 qPrintable(MainWindow::tabNames().join(QStringLiteral(", "))));
    return 2;
  }
  if (!screenshot) {
    window.show();
    return QApplication::exec();
  }

  const QStringList size = parser.value(sizeOption).split(QLatin1Char('x'));
  const int width = size.value(0).toInt();
  const int height = size.value(1).toInt();
  window.resize(std::max(width, 1280), std::max(height, 800));
  window.show();
  window.session()->simulateNow();
  if (tab.compare(QStringLiteral("search"), Qt::CaseInsensitive) == 0 &&
      distplan::gui::SearchView::searchAvailable()) {
    QEventLoop loop;
    QObject::connect(window.searchView(), &distplan::gui::SearchView::searchFinished, &loop,
                     &QEventLoop::quit);
    QTimer::singleShot(300000, &loop, &QEventLoop::quit);
    window.searchView()->startSearch();
    if (window.searchView()->isRunning()) loop.exec();
  }
  QApplication::processEvents();
  QApplication::processEvents();
  if (!window.grab().save(parser.value(screenshotOption))) {
    std::fprintf(stderr, "distplan-gui: cannot write %s\n",
                 qPrintable(parser.value(screenshotOption)));
    return 1;
  }
  return 0;
}
