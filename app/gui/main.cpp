// phaselab: the desktop application. With --model/--prompt/--screenshot it
// also runs unattended (loads, asks, saves a picture of the window, exits),
// which is how the README screenshot and the crash-recovery test drive it.
// The options: gui_options.h; the unattended run: unattended.h.
#include <QApplication>
#include <QCommandLineParser>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <pwd.h>
#include <unistd.h>

#include "app_identity.h"
#include "appearance.h"
#include "gui_options.h"
#include "hardware_probe.h"
#include "main_window.h"
#include "phaselab/log.h"
#include "phaselab/thread_pool.h"
#include "unattended.h"

using namespace phaselab::ui;

namespace {

// Without HOME, Qt and the data folder would land in the current folder (or
// /.config): take the home folder from the password database instead.
void ensureHome() {
  const char* home = std::getenv("HOME");
  if (home && *home) return;
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir && *pw->pw_dir) ::setenv("HOME", pw->pw_dir, 1);
}

// Whether QApplication can open a window: a platform chosen explicitly
// (QT_QPA_PLATFORM, -platform), else an X11 or Wayland display.
bool hasDisplay(int argc, char** argv) {
  for (const char* var : {"QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"})
    if (const char* v = std::getenv(var); v && *v) return true;
  for (int i = 1; i < argc; i++)
    if (std::string_view(argv[i]) == "-platform") return true;
  return false;
}

void setApplicationNames() {
  QCoreApplication::setOrganizationName(QStringLiteral("PhaseLab"));
  QCoreApplication::setApplicationName(QStringLiteral("PhaseLab"));
  QCoreApplication::setApplicationVersion(QStringLiteral(PHASELAB_VERSION));
}

// The overrides of this run's command line (not saved).
void applyRunSettings(MainWindow& window, const GuiArgs& args) {
  GenerationSettings g = window.settings().generation;
  if (args.nPredict) g.maxTokens = *args.nPredict;
  if (args.temperature) g.temperature = static_cast<float>(*args.temperature);
  if (args.seed) g.seed = *args.seed;
  if (args.noKvCache) g.useKvCache = false;
  if (args.ignoreEos) g.ignoreEos = true;
  window.setGenerationSettings(g);
  if (args.threads) {
    EngineConfig e = window.settings().engine;
    e.threads = *args.threads;
    window.setEngineConfig(e);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ensureHome();
  if (asksOnlyForHelpOrVersion(argc, argv)) {
    QCoreApplication core(argc, argv);
    setApplicationNames();
    QCommandLineParser p;
    GuiOptionSpec().addTo(p);
    p.process(core);  // prints the help or the version and exits 0
    return 0;
  }
  if (!hasDisplay(argc, argv)) {
    std::fprintf(stderr,
                 "phaselab: no display to open the window on (DISPLAY and WAYLAND_DISPLAY are not set).\n"
                 "Chat in the terminal with phaselab-cli chat, or run the window unattended with "
                 "QT_QPA_PLATFORM=offscreen.\n");
    return 2;
  }
  QApplication app(argc, argv);
  setApplicationNames();
  applyAppIdentity();  // desktop file name (io.github.phaselab.PhaseLab) and window icon
  phaselab::ui::loadAppearance();  // the saved theme and text size (needs the names above for QSettings)
  const char* logLevel = std::getenv("PHASELAB_LOG");
  phaselab::init_logging(logLevel && *logLevel ? logLevel : "warn", true);

  GuiArgs args;
  if (!parseGuiArgs(QCoreApplication::arguments(), &args)) return 2;
  const bool unattended = args.unattended();
  MainWindow::Options options;
  options.dbPath = args.dbPath;
  options.autoLoadLastModel = args.modelPath.isEmpty();
  options.rememberModel = !unattended;  // a scripted run must not change what the next start loads
  // Unattended runs measure the machine first (if never measured) so the probe
  // does not compete with the answer for the cores.
  options.measureHardware = !unattended;
  if (unattended && !HardwareProbe::cached().usable()) HardwareProbe::store(HardwareProbe::measure());
  if (const std::string w = phaselab::thread_count_warning(args.threads.value_or(0)); !w.empty())
    std::fprintf(stderr, "phaselab: warning: %s\n", w.c_str());

  MainWindow window(options);
  applyRunSettings(window, args);
  window.show();
  UnattendedRun run(&window, args);
  if (!run.start()) return 2;
  const int rc = app.exec();
  return run.exitCode() ? run.exitCode() : rc;
}
