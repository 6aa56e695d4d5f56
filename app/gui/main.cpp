// tokenfab: the desktop application. A main window with the pages (Chat, Models, Live, KV
// inspector, Draft heads, Devices, Demo, History) over the engine bridge; settings (window, last
// page, device roles, default head) persist in the user data directory; a first run without the
// default model offers to download it. A GGUF file named on the command line (as a file manager
// passes it) is opened as --model. `--screenshot FILE --view VIEW` renders one page after a
// short real workload and exits (for docs and review).

#include <QApplication>
#include <QCommandLineParser>
#include <QIcon>
#include <QMessageBox>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/model/model_files.h"
#include "model_fetch.h"
#include "screenshot.h"
#include "ui/bridge/api_server_bridge.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/app_settings.h"
#include "ui/views/chat_page.h"
#include "ui/views/demo_page.h"
#include "ui/views/devices_page.h"
#include "ui/views/heads_page.h"
#include "ui/views/history_page.h"
#include "ui/views/kv_page.h"
#include "ui/views/live_page.h"
#include "ui/views/main_window.h"
#include "ui/views/models_page.h"

using namespace tokenfab;

namespace {

// --view name → page title.
const std::map<QString, QString>& view_titles() {
  static const std::map<QString, QString> titles = {
      {"chat", "Chat"},       {"live", "Live"}, {"kv", "KV inspector"}, {"heads", "Draft heads"},
      {"devices", "Devices"}, {"demo", "Demo"}, {"history", "History"}, {"models", "Models"}};
  return titles;
}

bool has_argument(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0 || std::strncmp(argv[i], name, std::strlen(name)) == 0)
      return true;
  return false;
}

// The window icon at each size drawn (resources/icons, compiled in).
QIcon app_icon() {
  QIcon icon;
  for (int size : {16, 24, 32, 48, 64, 128, 256})
    icon.addFile(QStringLiteral(":/icons/tokenfab-%1.png").arg(size), QSize(size, size));
  return icon;
}

// Shows `message` as a dialog, or on stderr for --screenshot (no one is there to click).
void report_error(bool headless, const QString& title, const QString& message) {
  if (headless)
    std::fprintf(stderr, "tokenfab: %s\n", qPrintable(message));
  else
    QMessageBox::critical(nullptr, title, message);
}

}  // namespace

int main(int argc, char** argv) {
  // A screenshot, --help and --version need no screen: offscreen unless the caller chose a
  // platform.
  const bool screenless = has_argument(argc, argv, "--screenshot") ||
                          has_argument(argc, argv, "--help") || has_argument(argc, argv, "-h") ||
                          has_argument(argc, argv, "--version") || has_argument(argc, argv, "-v");
  if (screenless && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM"))
    qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("tokenfab"));
  QApplication::setApplicationDisplayName(QStringLiteral("Tokenfab"));
  QApplication::setApplicationVersion(QStringLiteral(TOKENFAB_VERSION));
  QApplication::setDesktopFileName(QStringLiteral(TOKENFAB_APP_ID));
  QApplication::setWindowIcon(app_icon());

  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("Tokenfab: a token factory on one workstation"));
  parser.addHelpOption();
  parser.addVersionOption();
  const QCommandLineOption model_option(
      "model", "GGUF model file (default: the embedded SmolLM2-135M-Instruct).", "PATH");
  const QCommandLineOption threads_option("threads", "CPU threads (default: all).", "N");
  const QCommandLineOption devices_option(
      "devices", "Colocated devices, e.g. cpu:0,cpu:1 (default: cpu:0).", "LIST");
  const QCommandLineOption prefill_option("prefill", "Disaggregated: prefill devices.", "LIST");
  const QCommandLineOption decode_option("decode", "Disaggregated: decode devices.", "LIST");
  const QCommandLineOption screenshot_option(
      "screenshot", "Run a short workload, render the --view page to FILE (PNG) and exit.", "FILE");
  const QCommandLineOption view_option(
      "view", "The page to show: chat, models, live, kv, heads, devices, demo or history.", "VIEW",
      "chat");
  parser.addOptions({model_option, threads_option, devices_option, prefill_option, decode_option,
                     screenshot_option, view_option});
  parser.addPositionalArgument("file", "GGUF model file to open (the same as --model FILE).",
                               "[file]");
  parser.process(app);

  const bool headless = parser.isSet(screenshot_option);
  const QString view = parser.value(view_option).toLower();
  if (!view_titles().count(view)) {
    std::fprintf(
        stderr,
        "tokenfab: --view %s: expected one of chat, models, live, kv, heads, devices, demo, "
        "history\n",
        qPrintable(view));
    return 2;
  }
  const QStringList files = parser.positionalArguments();
  if (files.size() > 1 || (files.size() == 1 && parser.isSet(model_option))) {
    std::fprintf(stderr, "tokenfab: expected one model file, as FILE or as --model FILE\n");
    return 2;
  }
  const QString model = files.isEmpty() ? parser.value(model_option) : files.front();
  EngineConfig config;
  if (parser.isSet(threads_option)) {
    bool ok = false;
    config.threads = parser.value(threads_option).toInt(&ok);
    if (!ok || config.threads < 1) {
      std::fprintf(stderr, "tokenfab: --threads %s: expected a positive integer\n",
                   qPrintable(parser.value(threads_option)));
      return 2;
    }
  }
  if (parser.isSet(devices_option)) config.devices = parser.value(devices_option).toStdString();
  config.prefill = parser.value(prefill_option).toStdString();
  config.decode = parser.value(decode_option).toStdString();
  // Without device flags, the roles last applied on the Devices page (a screenshot always uses
  // the flags or the defaults, so it does not depend on this machine's settings).
  const bool device_flags =
      parser.isSet(devices_option) || parser.isSet(prefill_option) || parser.isSet(decode_option);
  if (!headless && !device_flags) ui::load_device_roles(config);

  ui::EngineBridge bridge;  // outlives the window: pages cancel their requests through it
  // The local OpenAI-compatible server on the bridge's engine (the status bar's switch); it runs
  // from the start when it ran at the last exit (not for a screenshot).
  ui::ApiServerBridge api_server(&bridge);
  ui::MainWindow window(&bridge);
  window.set_api_server(&api_server);
  if (!headless && ui::ApiServerSettings::load().enabled)
    api_server.start(ui::ApiServerSettings::load());
  window.add_page(new ui::ChatPage);
  auto* models_page = new ui::ModelsPage;
  window.add_page(models_page);
  window.add_page(new ui::LivePage);
  window.add_page(new ui::KvPage);
  window.add_page(new ui::HeadsPage);
  window.add_page(new ui::DevicesPage);
  window.add_page(new ui::DemoPage);
  window.add_page(new ui::HistoryPage);
  QString page_title = view_titles().at(view);
  // Without --view, the page shown when the app was last closed.
  if (!headless && !parser.isSet(view_option) && !ui::MainWindow::saved_page().isEmpty() &&
      window.page(ui::MainWindow::saved_page()))
    page_title = ui::MainWindow::saved_page();
  if (!window.show_page(page_title)) {
    std::fprintf(stderr, "tokenfab: this build has no %s page\n", qPrintable(view));
    return 2;
  }

  std::unique_ptr<app::ScreenshotRun> screenshot;
  if (headless) {
    screenshot = std::make_unique<app::ScreenshotRun>(&window, &bridge, view, page_title,
                                                      parser.value(screenshot_option));
  } else {
    QObject::connect(&bridge, &ui::EngineBridge::failed, &window, [&window](const QString& m) {
      QMessageBox::critical(&window, QStringLiteral("Tokenfab"),
                            QStringLiteral("The model could not be loaded.\n\n%1").arg(m));
    });
  }
  window.show();

  const QString missing = QStringLiteral(
                              "The default model is not installed (expected %1).\n\nRun "
                              "`tokenfab-cli fetch` to download it once, or start Tokenfab with "
                              "--model PATH to use a GGUF file you have.")
                              .arg(QString::fromStdString(default_model_path().string()));
  app::ModelFetch fetch(&window);
  // The Models page's download buttons: `tokenfab-cli fetch NAME` (a license asked for first where
  // one must be accepted); the page rescans when a download succeeds.
  app::ModelFetch library_fetch(&window);
  models_page->set_downloads_enabled(true);
  QObject::connect(models_page, &ui::ModelsPage::downloadRequested, &library_fetch,
                   &app::ModelFetch::request);
  QObject::connect(&library_fetch, &app::ModelFetch::finished, models_page,
                   &ui::ModelsPage::download_finished);
  if (model.isEmpty() && !std::filesystem::exists(default_model_path())) {
    // First run: offer the download (with progress and Cancel); a screenshot just says why not.
    if (headless) {
      report_error(true, QStringLiteral("Tokenfab: no model"), missing);
      return 1;
    }
    QObject::connect(&fetch, &app::ModelFetch::finished, &window,
                     [&bridge, &window, config, missing](bool ok, const QString& message) {
                       if (ok) {
                         bridge.load(QString(), config);
                       } else {
                         QMessageBox::warning(&window, QStringLiteral("Tokenfab: no model"),
                                              message + QStringLiteral("\n\n") + missing);
                       }
                     });
    if (!fetch.ask_and_start()) report_error(false, QStringLiteral("Tokenfab: no model"), missing);
  } else {
    bridge.load(model, config);
  }
  return QApplication::exec();
}
