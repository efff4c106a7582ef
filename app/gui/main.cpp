// phaselab: the desktop application. With --model/--prompt/--screenshot it
// also runs unattended (loads, asks, saves a picture of the window, exits),
// which is how the README screenshot and the crash-recovery test drive it.
#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>
#include <cstdio>

#include "chat_session.h"
#include "engine_controller.h"
#include "hardware_probe.h"
#include "main_window.h"
#include "metrics_dock.h"
#include "phaselab/log.h"

using namespace phaselab::ui;

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setOrganizationName(QStringLiteral("PhaseLab"));
  QApplication::setApplicationName(QStringLiteral("PhaseLab"));
  QApplication::setApplicationVersion(QStringLiteral(PHASELAB_VERSION));
  QApplication::setDesktopFileName(QStringLiteral("phaselab"));
  phaselab::init_logging("warn", true);

  QCommandLineParser p;
  p.setApplicationDescription(QStringLiteral("PhaseLab: run language models locally and see how inference works."));
  p.addHelpOption();
  p.addVersionOption();
  const QCommandLineOption model({QStringLiteral("m"), QStringLiteral("model")}, QStringLiteral("GGUF model to load."), QStringLiteral("FILE"));
  const QCommandLineOption prompt({QStringLiteral("p"), QStringLiteral("prompt")}, QStringLiteral("Send TEXT once the model is loaded."), QStringLiteral("TEXT"));
  const QCommandLineOption shot(QStringLiteral("screenshot"), QStringLiteral("After the answer, save the window to PATH.png."), QStringLiteral("PATH"));
  const QCommandLineOption quit(QStringLiteral("quit"), QStringLiteral("Exit after the answer (and the screenshot)."));
  const QCommandLineOption nPredict({QStringLiteral("n"), QStringLiteral("n-predict")}, QStringLiteral("Answer token limit for this run."), QStringLiteral("N"));
  const QCommandLineOption temp(QStringLiteral("temp"), QStringLiteral("Temperature for this run (0 = greedy)."), QStringLiteral("T"));
  const QCommandLineOption seed(QStringLiteral("seed"), QStringLiteral("Sampling seed for this run."), QStringLiteral("S"));
  const QCommandLineOption noKv(QStringLiteral("no-kv-cache"), QStringLiteral("Recompute the whole sequence every token (slow on purpose)."));
  const QCommandLineOption ignoreEos(QStringLiteral("ignore-eos"), QStringLiteral("Keep generating past end-of-generation tokens."));
  const QCommandLineOption threads({QStringLiteral("t"), QStringLiteral("threads")}, QStringLiteral("CPU threads for this run."), QStringLiteral("N"));
  const QCommandLineOption db(QStringLiteral("db"), QStringLiteral("Conversation database (default: $PHASELAB_DB or the data folder)."), QStringLiteral("FILE"));
  p.addOptions({model, prompt, shot, quit, nPredict, temp, seed, noKv, ignoreEos, threads, db});
  p.process(app);

  const bool unattended = p.isSet(prompt) || p.isSet(shot) || p.isSet(quit);
  MainWindow::Options options;
  options.dbPath = p.value(db);
  options.autoLoadLastModel = !p.isSet(model);
  options.rememberModel = !unattended;  // a scripted run must not change what the next start loads
  // Unattended runs measure the machine first (if never measured) so the probe
  // does not compete with the answer for the cores.
  options.measureHardware = !unattended;
  if (unattended && !HardwareProbe::cached().valid()) HardwareProbe::store(HardwareProbe::measure());

  MainWindow window(options);
  GenerationSettings g = window.settings().generation;
  if (p.isSet(nPredict)) g.maxTokens = std::max(1, p.value(nPredict).toInt());
  if (p.isSet(temp)) g.temperature = p.value(temp).toFloat();
  if (p.isSet(seed)) g.seed = p.value(seed).toULongLong();
  if (p.isSet(noKv)) g.useKvCache = false;
  if (p.isSet(ignoreEos)) g.ignoreEos = true;
  window.setGenerationSettings(g);
  if (p.isSet(threads)) {
    EngineConfig e = window.settings().engine;
    e.threads = p.value(threads).toInt();
    window.setEngineConfig(e);
  }
  window.show();

  int exitCode = 0;
  auto fail = [&](const QString& message) {
    std::fprintf(stderr, "phaselab: %s\n", qPrintable(message));
    if (p.isSet(quit)) {
      exitCode = 1;
      QTimer::singleShot(0, &app, &QApplication::quit);
    }
  };
  QObject::connect(window.engine(), &EngineController::modelLoadFailed, &app, fail);
  if (p.isSet(prompt)) {
    QObject::connect(&window, &MainWindow::modelReady, &app, [&] {
      if (!window.sendMessage(p.value(prompt))) fail(window.lastError());
    }, Qt::SingleShotConnection);
  }
  QObject::connect(window.chatSession(), &ChatSession::answerFinished, &app,
                   [&](qint64, const MessageRecord& answer) {
    if (!unattended) return;
    if (answer.state == QLatin1String("error")) fail(answer.stats.error);
    if (p.isSet(quit)) std::printf("%s\n", qPrintable(answer.content));
    // A moment for the last Markdown render and the charts to repaint.
    QTimer::singleShot(200, &app, [&] {
      if (p.isSet(shot)) {
        if (!window.grab().save(p.value(shot))) {
          fail(QStringLiteral("cannot write %1").arg(p.value(shot)));
        } else {
          std::fprintf(stderr, "phaselab: saved %s\n", qPrintable(p.value(shot)));
        }
      }
      if (p.isSet(quit)) QApplication::quit();
    });
  });
  if (p.isSet(model)) window.loadModel(p.value(model));
  else if (p.isSet(prompt)) fail(QStringLiteral("--prompt needs --model FILE"));

  const int rc = app.exec();
  return exitCode ? exitCode : rc;
}
