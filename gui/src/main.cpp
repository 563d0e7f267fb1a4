// distplan-gui: the interactive planner. With --screenshot it renders one tab offscreen at the
// given size, saves a PNG and exits (for docs and CI).
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include <QApplication>
#include <QCommandLineParser>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QFile>
#include <QFileInfo>
#include <QPixmap>
#include <QSize>
#include <QTimer>

#include "mainwindow.h"
#include "plansession.h"
#include "searchview.h"
#include "timelineview.h"
#include "timelinewidget.h"
#include "validationview.h"

using distplan::gui::MainWindow;

namespace {

// Bound of --size: a 8192 × 8192 ARGB grab is 256 MiB, the most a screenshot needs.
constexpr int kMaxScreenshotSide = 8192;

/// Parses "WxH" with both sides in [1, kMaxScreenshotSide].
std::optional<QSize> parseSize(const QString& text) {
  const QStringList parts = text.split(QLatin1Char('x'));
  if (parts.size() != 2) return std::nullopt;
  bool okW = false, okH = false;
  const int w = parts[0].toInt(&okW);
  const int h = parts[1].toInt(&okH);
  if (!okW || !okH || w < 1 || h < 1 || w > kMaxScreenshotSide || h > kMaxScreenshotSide) {
    return std::nullopt;
  }
  return QSize(w, h);
}

/// Parses "FROM:TO" in milliseconds, 0 <= FROM < TO.
std::optional<std::pair<double, double>> parseWindow(const QString& text) {
  const QStringList parts = text.split(QLatin1Char(':'));
  if (parts.size() != 2) return std::nullopt;
  bool okA = false, okB = false;
  const double a = parts[0].toDouble(&okA);
  const double b = parts[1].toDouble(&okB);
  if (!okA || !okB || !(a >= 0) || !(b > a) || !std::isfinite(b)) return std::nullopt;
  return std::make_pair(a, b);
}

/// The arguments less the options Qt's application object reads itself (-platform, -style, ...,
/// as --help-all lists them): QApplication takes them from argv, and the parser would refuse
/// them ("-platform" read as the short options p, l, a, ...).
QStringList withoutQtOptions(const QStringList& arguments) {
  static const QStringList withValue = {
      QStringLiteral("platform"),        QStringLiteral("platformpluginpath"),
      QStringLiteral("platformtheme"),   QStringLiteral("plugin"),
      QStringLiteral("qwindowgeometry"), QStringLiteral("qwindowicon"),
      QStringLiteral("qwindowtitle"),    QStringLiteral("session"),
      QStringLiteral("display"),         QStringLiteral("name"),
      QStringLiteral("title"),           QStringLiteral("visual"),
      QStringLiteral("geometry"),        QStringLiteral("style"),
      QStringLiteral("stylesheet")};
  // Without a value of their own (-qmljsdebugger takes its value after '=').
  static const QStringList flags = {QStringLiteral("reverse"),       QStringLiteral("widgetcount"),
                                    QStringLiteral("qmljsdebugger"), QStringLiteral("nograb"),
                                    QStringLiteral("dograb"),        QStringLiteral("sync")};
  QStringList out;
  for (qsizetype i = 0; i < arguments.size(); ++i) {
    const QString& a = arguments[i];
    if (i == 0 || !a.startsWith(QLatin1Char('-')) || a == QStringLiteral("--")) {
      out << a;
      continue;
    }
    QString name = a.mid(a.startsWith(QStringLiteral("--")) ? 2 : 1);
    const qsizetype equals = name.indexOf(QLatin1Char('='));
    if (equals >= 0) name.truncate(equals);
    if (withValue.contains(name)) {
      if (equals < 0) ++i;  // its value is the next argument
      continue;
    }
    if (flags.contains(name)) continue;
    out << a;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // The command line is read before any QApplication exists: --help, --version and bad options
  // need no display (a QApplication aborts without one).
  QStringList arguments;
  for (int i = 0; i < argc; ++i) arguments << QString::fromLocal8Bit(argv[i]);
  arguments = withoutQtOptions(arguments);
  QCoreApplication::setOrganizationName(QStringLiteral("distplan"));
  QCoreApplication::setApplicationName(QStringLiteral("distplan-gui"));
  QCoreApplication::setApplicationVersion(QStringLiteral("0.1.0"));

  QCommandLineParser parser;
  parser.setApplicationDescription(QCoreApplication::translate(
      "main", "Plan, simulate and search distributed training layouts."));
  const QCommandLineOption helpOption = parser.addHelpOption();
  const QCommandLineOption versionOption = parser.addVersionOption();
  const QCommandLineOption scenarioOption(
      QStringLiteral("scenario"), QCoreApplication::translate("main", "Scenario JSON to open."),
      QStringLiteral("FILE"));
  const QCommandLineOption tabOption(QStringLiteral("tab"),
                                     QCoreApplication::translate("main", "Tab to show: %1.")
                                         .arg(MainWindow::tabNames().join(QStringLiteral(", "))),
                                     QStringLiteral("NAME"));
  const QCommandLineOption screenshotOption(
      QStringLiteral("screenshot"),
      QCoreApplication::translate("main", "Render the window, save it as a PNG and exit."),
      QStringLiteral("FILE"));
  const QCommandLineOption sizeOption(
      QStringLiteral("size"),
      QCoreApplication::translate("main", "Window size for --screenshot (WxH, each side 1 to %1).")
          .arg(kMaxScreenshotSide),
      QStringLiteral("WxH"), QStringLiteral("1440x900"));
  const QCommandLineOption validationOption(
      QStringLiteral("validation-result"),
      QCoreApplication::translate("main",
                                  "A `distplan validate` result to show in the Validation tab."),
      QStringLiteral("FILE"));
  const QCommandLineOption windowOption(
      QStringLiteral("timeline-window"),
      QCoreApplication::translate("main",
                                  "With --screenshot: the Timeline tab shows FROM to TO "
                                  "milliseconds of the step (e.g. 0:2000, its first two seconds)."),
      QStringLiteral("FROM:TO"));
  parser.addOptions(
      {scenarioOption, tabOption, screenshotOption, sizeOption, validationOption, windowOption});
  if (!parser.parse(arguments)) {
    std::fprintf(stderr, "distplan-gui: %s\n", qPrintable(parser.errorText()));
    return 2;
  }
  if (parser.isSet(helpOption)) {
    // Without a QCoreApplication (none exists yet: --help needs no display) Qt writes
    // "<executable_name>" where the program's name goes.
    QString help = parser.helpText();
    help.replace(QStringLiteral("<executable_name>"),
                 arguments.isEmpty() ? QStringLiteral("distplan-gui")
                                     : QFileInfo(arguments.first()).fileName());
    std::fputs(qPrintable(help), stdout);
    return 0;
  }
  if (parser.isSet(QStringLiteral("help-all"))) {
    // --help-all adds the options Qt's application object reads (-platform, -style, ...), so
    // it needs one, but not a display: built on the offscreen platform from the program's name
    // alone (a -platform on the command line is not applied), it only lists them. process()
    // prints the text, with the program's name, and exits 0.
    qputenv("QT_QPA_PLATFORM", "offscreen");
    int helpArgc = 1;
    // The usage line names the program as --help does, without the path it was started by.
    QByteArray name = arguments.isEmpty()
                          ? QByteArray()
                          : QFile::encodeName(QFileInfo(arguments.first()).fileName());
    if (name.isEmpty()) name = "distplan-gui";
    char* helpArgv[] = {name.data(), nullptr};
    QApplication helpApp(helpArgc, helpArgv);
    parser.process(arguments);
    return 0;
  }
  if (parser.isSet(versionOption)) {
    std::printf("%s %s\n", qPrintable(QCoreApplication::applicationName()),
                qPrintable(QCoreApplication::applicationVersion()));
    return 0;
  }
  const std::optional<QSize> size = parseSize(parser.value(sizeOption));
  if (!size) {
    std::fprintf(stderr, "distplan-gui: --size \"%s\" is not WxH with each side 1 to %d\n",
                 qPrintable(parser.value(sizeOption)), kMaxScreenshotSide);
    return 2;
  }
  std::optional<std::pair<double, double>> timelineWindow;
  if (parser.isSet(windowOption)) {
    timelineWindow = parseWindow(parser.value(windowOption));
    if (!timelineWindow) {
      std::fprintf(stderr,
                   "distplan-gui: --timeline-window \"%s\" is not FROM:TO in milliseconds with "
                   "0 <= FROM < TO\n",
                   qPrintable(parser.value(windowOption)));
      return 2;
    }
  }
  const QString tab = parser.value(tabOption);
  if (!tab.isEmpty() && !MainWindow::tabNames().contains(tab.toLower())) {
    std::fprintf(stderr, "distplan-gui: unknown tab \"%s\" (one of %s)\n", qPrintable(tab),
                 qPrintable(MainWindow::tabNames().join(QStringLiteral(", "))));
    return 2;
  }

  QApplication app(argc, argv);
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
  if (!tab.isEmpty()) window.showTab(tab);
  if (!screenshot) {
    window.show();
    return QApplication::exec();
  }

  window.resize(std::max(size->width(), 1280), std::max(size->height(), 800));
  window.show();
  window.session()->simulateNow();
  if (timelineWindow) {
    window.timelineView()->timeline()->showWindow(
        timelineWindow->first / 1e3, (timelineWindow->second - timelineWindow->first) / 1e3);
  }
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
