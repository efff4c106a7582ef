// phaselab: the desktop application. With --model/--prompt/--screenshot it
// also runs unattended (loads, asks, saves a picture of the window, exits),
// which is how the README screenshot and the crash-recovery test drive it.
#include <QApplication>
#include <QCommandLineParser>
#include <QFileInfo>
#include <QTimer>
#include <QUrl>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <pwd.h>
#include <unistd.h>

#include "chat_session.h"
#include "compare_window.h"
#include "engine_controller.h"
#include "hardware_probe.h"
#include "appearance.h"
#include "batch_sweep_panel.h"
#include "main_window.h"
#include "metrics_dock.h"
#include "phaselab/log.h"
#include "phaselab/thread_pool.h"
#include "app_identity.h"

using namespace phaselab::ui;

namespace {

// Without HOME, Qt and the data folder would land in the current folder (or
// /.config): take the home folder from the password database instead.
void ensureHome() {
  const char* home = std::getenv("HOME");
  if (home && *home) return;
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir && *pw->pw_dir) ::setenv("HOME", pw->pw_dir, 1);
}

// The numeric options, checked like phaselab-cli's: a bad value is an error
// (exit 2), never silently 0 or 1.
bool parseInt(const QString& text, const char* name, qint64 min, qint64 max, qint64* out) {
  bool ok = false;
  const qint64 v = text.trimmed().toLongLong(&ok);
  if (!ok || v < min || v > max) {
    std::fprintf(stderr, "phaselab: %s must be an integer from %lld to %lld, not '%s'\n", name,
                 static_cast<long long>(min), static_cast<long long>(max), qPrintable(text));
    return false;
  }
  *out = v;
  return true;
}

// Every option of the window, in one place: the window and the display-free
// --help / --version share them.
struct GuiOptions {
  const QCommandLineOption model{{QStringLiteral("m"), QStringLiteral("model")}, QStringLiteral("GGUF model to load."), QStringLiteral("FILE")};
  const QCommandLineOption prompt{{QStringLiteral("p"), QStringLiteral("prompt")}, QStringLiteral("Send TEXT once the model is loaded."), QStringLiteral("TEXT")};
  const QCommandLineOption shot{QStringLiteral("screenshot"), QStringLiteral("After the answer, save the window to PATH.png."), QStringLiteral("PATH")};
  const QCommandLineOption quit{QStringLiteral("quit"), QStringLiteral("Exit after the answer (and the screenshot).")};
  const QCommandLineOption nPredict{{QStringLiteral("n"), QStringLiteral("n-predict")}, QStringLiteral("Answer token limit for this run."), QStringLiteral("N")};
  const QCommandLineOption temp{QStringLiteral("temp"), QStringLiteral("Temperature for this run (0 = greedy)."), QStringLiteral("T")};
  const QCommandLineOption seed{QStringLiteral("seed"), QStringLiteral("Sampling seed for this run."), QStringLiteral("S")};
  const QCommandLineOption noKv{QStringLiteral("no-kv-cache"), QStringLiteral("Recompute the whole sequence every token (slow on purpose).")};
  const QCommandLineOption ignoreEos{QStringLiteral("ignore-eos"), QStringLiteral("Keep generating past end-of-generation tokens.")};
  const QCommandLineOption threads{{QStringLiteral("t"), QStringLiteral("threads")}, QStringLiteral("CPU threads for this run."), QStringLiteral("N")};
  const QCommandLineOption notebook{QStringLiteral("notebook"), QStringLiteral("Send the prompt in notebook mode: the model continues the text.")};
  const QCommandLineOption compare{QStringLiteral("compare"), QStringLiteral("Open the Compare window with these models (comma-separated) and run it; with --screenshot, of that window."), QStringLiteral("A.gguf[,B.gguf]")};
  const QCommandLineOption quant{QStringLiteral("quant"), QStringLiteral("With --compare: also these quantizations of the first model."), QStringLiteral("T1,T2")};
  const QCommandLineOption text{QStringLiteral("text"), QStringLiteral("With --compare: the evaluation text (default: the bundled one)."), QStringLiteral("FILE")};
  const QCommandLineOption chunks{QStringLiteral("chunks"), QStringLiteral("With --compare: perplexity chunks of 512 tokens (default 8)."), QStringLiteral("N")};
  const QCommandLineOption batchSweep{QStringLiteral("batch-sweep"), QStringLiteral("Open the Compare window's Batch sweep tab with the model (--model, FILE or the last one) and run it at these batch sizes; with --screenshot, of that window."), QStringLiteral("1,2,4,...")};
  const QCommandLineOption db{QStringLiteral("db"), QStringLiteral("Conversation database (default: $PHASELAB_DB or the data folder)."), QStringLiteral("FILE")};

  void addTo(QCommandLineParser& p) const {
    p.setApplicationDescription(QStringLiteral("PhaseLab: run language models locally and see how inference works."));
    p.addHelpOption();
    p.addVersionOption();
    p.addOptions({model, prompt, shot, quit, nPredict, temp, seed, noKv, ignoreEos, threads, notebook, compare, quant, text, chunks, batchSweep, db});
    p.addPositionalArgument(QStringLiteral("FILE"),
                            QStringLiteral("GGUF model to open (what a file manager passes; same as --model)."),
                            QStringLiteral("[FILE.gguf]"));
  }
};

// --help and --version print and exit without a display (QApplication aborts
// when it cannot open one).
bool asksOnlyForHelpOrVersion(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    const std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "-h" || a == "--help" || a == "-?" || a == "--help-all" || a == "-v" || a == "--version") return true;
  }
  return false;
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

}  // namespace

int main(int argc, char** argv) {
  ensureHome();
  if (asksOnlyForHelpOrVersion(argc, argv)) {
    QCoreApplication core(argc, argv);
    setApplicationNames();
    QCommandLineParser p;
    GuiOptions().addTo(p);
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

  QCommandLineParser p;
  const GuiOptions guiOptions;
  guiOptions.addTo(p);
  const QCommandLineOption& model = guiOptions.model;
  const QCommandLineOption& prompt = guiOptions.prompt;
  const QCommandLineOption& shot = guiOptions.shot;
  const QCommandLineOption& quit = guiOptions.quit;
  const QCommandLineOption& nPredict = guiOptions.nPredict;
  const QCommandLineOption& temp = guiOptions.temp;
  const QCommandLineOption& seed = guiOptions.seed;
  const QCommandLineOption& noKv = guiOptions.noKv;
  const QCommandLineOption& ignoreEos = guiOptions.ignoreEos;
  const QCommandLineOption& threads = guiOptions.threads;
  const QCommandLineOption& notebook = guiOptions.notebook;
  const QCommandLineOption& compare = guiOptions.compare;
  const QCommandLineOption& quant = guiOptions.quant;
  const QCommandLineOption& text = guiOptions.text;
  const QCommandLineOption& chunks = guiOptions.chunks;
  const QCommandLineOption& batchSweep = guiOptions.batchSweep;
  const QCommandLineOption& db = guiOptions.db;
  p.process(app);

  // The model: --model FILE or the positional FILE (Exec=phaselab %f in the
  // desktop file), which may arrive as a file:// URL.
  QString modelPath = p.value(model);
  const QStringList positional = p.positionalArguments();
  if (positional.size() > 1 || (!positional.isEmpty() && p.isSet(model))) {
    std::fprintf(stderr, "phaselab: give one model, either as FILE or with --model (run phaselab --help)\n");
    return 2;
  }
  if (!positional.isEmpty()) {
    const QUrl url(positional.front());
    modelPath = url.isLocalFile() ? url.toLocalFile() : positional.front();
  }

  const bool unattended = p.isSet(prompt) || p.isSet(shot) || p.isSet(quit) || p.isSet(compare) || p.isSet(batchSweep);
  int chunksValue = 8;
  if (p.isSet(chunks)) {
    bool ok = false;
    chunksValue = p.value(chunks).toInt(&ok);
    if (!ok || chunksValue < 1 || chunksValue > 10000) {
      std::fprintf(stderr, "phaselab: --chunks must be a whole number from 1 to 10000\n");
      return 2;
    }
  }
  if ((p.isSet(quant) || p.isSet(text) || p.isSet(chunks)) && !p.isSet(compare)) {
    std::fprintf(stderr, "phaselab: --quant, --text and --chunks go with --compare (run phaselab --help)\n");
    return 2;
  }
  if (p.isSet(batchSweep)) {
    QString error;
    if (!BatchSweepPanel::parseSizes(p.value(batchSweep), &error)) {
      std::fprintf(stderr, "phaselab: --batch-sweep: %s\n", qPrintable(error));
      return 2;
    }
    if (p.isSet(compare) || p.isSet(prompt)) {
      std::fprintf(stderr, "phaselab: --batch-sweep runs alone, without --compare or --prompt (run phaselab --help)\n");
      return 2;
    }
  }
  MainWindow::Options options;
  options.dbPath = p.value(db);
  options.autoLoadLastModel = modelPath.isEmpty();
  options.rememberModel = !unattended;  // a scripted run must not change what the next start loads
  // Unattended runs measure the machine first (if never measured) so the probe
  // does not compete with the answer for the cores.
  options.measureHardware = !unattended;
  if (unattended && !HardwareProbe::cached().usable()) HardwareProbe::store(HardwareProbe::measure());

  // Every numeric option is checked before anything starts.
  qint64 nValue = 0, threadsValue = 0;
  double tempValue = 0;
  quint64 seedValue = 0;
  if (p.isSet(nPredict) && !parseInt(p.value(nPredict), "-n", 1, 1 << 20, &nValue)) return 2;
  if (p.isSet(threads) && !parseInt(p.value(threads), "--threads", 1, 256, &threadsValue)) return 2;
  if (p.isSet(temp)) {
    bool ok = false;
    tempValue = p.value(temp).trimmed().toDouble(&ok);
    if (!ok || !(tempValue >= 0 && tempValue <= 100)) {
      std::fprintf(stderr, "phaselab: --temp must be a number from 0 to 100, not '%s'\n", qPrintable(p.value(temp)));
      return 2;
    }
  }
  if (p.isSet(seed)) {
    bool ok = false;
    const QString text = p.value(seed).trimmed();
    seedValue = text.toULongLong(&ok);
    if (!ok || text.startsWith(QLatin1Char('-')) || text.startsWith(QLatin1Char('+'))) {
      std::fprintf(stderr, "phaselab: --seed must be a non-negative integer below 2^64, not '%s'\n", qPrintable(text));
      return 2;
    }
  }
  if (const std::string w = phaselab::thread_count_warning(static_cast<int>(threadsValue)); !w.empty())
    std::fprintf(stderr, "phaselab: warning: %s\n", w.c_str());

  MainWindow window(options);
  GenerationSettings g = window.settings().generation;
  if (p.isSet(nPredict)) g.maxTokens = static_cast<int>(nValue);
  if (p.isSet(temp)) g.temperature = static_cast<float>(tempValue);
  if (p.isSet(seed)) g.seed = seedValue;
  if (p.isSet(noKv)) g.useKvCache = false;
  if (p.isSet(ignoreEos)) g.ignoreEos = true;
  window.setGenerationSettings(g);
  if (p.isSet(threads)) {
    EngineConfig e = window.settings().engine;
    e.threads = static_cast<int>(threadsValue);
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
      if (p.isSet(notebook)) window.setConversationMode(QStringLiteral("notebook"));
      if (!window.sendMessage(p.value(prompt))) fail(window.lastError());
    }, Qt::SingleShotConnection);
  }
  // The end of an unattended run: a moment for the last Markdown render and
  // the charts to repaint, then the screenshot, then exit when --quit.
  auto finishUnattended = [&] {
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
  };
  QObject::connect(window.chatSession(), &ChatSession::answerFinished, &app,
                   [&](qint64, const MessageRecord& answer) {
    if (!p.isSet(prompt)) return;
    if (answer.state == QLatin1String("error")) fail(answer.stats.error);
    if (p.isSet(quit)) std::printf("%s\n", qPrintable(answer.content));
    finishUnattended();
  });
  if (!modelPath.isEmpty()) window.loadModel(modelPath);
  else if (p.isSet(prompt)) fail(QStringLiteral("--prompt needs a model (--model FILE or FILE)"));
  // --screenshot / --quit without --prompt: the window once the model is
  // loaded, or as it opened when there is no model to load.
  if (!p.isSet(prompt) && !p.isSet(compare) && !p.isSet(batchSweep) && (p.isSet(shot) || p.isSet(quit))) {
    if (!modelPath.isEmpty())
      QObject::connect(&window, &MainWindow::modelReady, &app, finishUnattended, Qt::SingleShotConnection);
    else
      finishUnattended();
  }

  // --compare: the Compare window runs the models (and quantizations) and,
  // unattended, saves its screenshot, prints the rows as JSON and exits.
  if (p.isSet(compare)) {
    CompareWindow* cw = window.compareWindow();
    for (const QString& m : p.value(compare).split(QLatin1Char(','), Qt::SkipEmptyParts)) cw->addModel(m);
    for (const QString& q : p.value(quant).split(QLatin1Char(','), Qt::SkipEmptyParts))
      if (!cw->addQuantization(q)) {
        std::fprintf(stderr, "phaselab: unknown quantization type %s\n", qPrintable(q));
        return 2;
      }
    if (p.isSet(text)) cw->setTextFile(p.value(text));
    cw->setChunks(chunksValue);
    if (p.isSet(threads)) cw->setThreads(static_cast<int>(threadsValue));
    cw->show();
    QObject::connect(cw, &CompareWindow::runFinished, &app, [&, cw](bool ok, const QString& error) {
      if (!ok) {
        std::fprintf(stderr, "phaselab: compare: %s\n", qPrintable(error));
        exitCode = 1;
      } else {
        std::printf("%s\n", phaselab::compare_rows_json(cw->rows()).c_str());
      }
      QTimer::singleShot(300, &app, [&, cw] {
        if (p.isSet(shot)) {
          if (!cw->grab().save(p.value(shot))) fail(QStringLiteral("cannot write %1").arg(p.value(shot)));
          else std::fprintf(stderr, "phaselab: saved %s\n", qPrintable(p.value(shot)));
        }
        if (p.isSet(quit)) QApplication::exit(exitCode);
      });
    });
    QTimer::singleShot(0, cw, [cw] { cw->startRun(); });
  }

  // --batch-sweep: the sweep starts once the main window has loaded the model
  // (so the load does not compete with the measurement), then as --compare.
  if (p.isSet(batchSweep)) {
    if (modelPath.isEmpty() && !QFileInfo::exists(window.settings().lastModel)) {
      std::fprintf(stderr, "phaselab: --batch-sweep needs a model: --model FILE or FILE\n");
      return 2;
    }
    CompareWindow* cw = window.compareWindow();
    cw->setBatchSweep(p.value(batchSweep), 128, 32);
    if (p.isSet(threads)) cw->setThreads(static_cast<int>(threadsValue));
    cw->showBatchSweep();
    cw->show();
    QObject::connect(&window, &MainWindow::modelReady, cw, [&window, cw, &fail] {
      cw->setBatchModel(window.engine()->modelInfo().path);
      if (!cw->startBatchSweep()) fail(cw->batchSweep()->lastError());
    }, Qt::SingleShotConnection);
    QObject::connect(cw, &CompareWindow::batchSweepFinished, &app, [&, cw](bool ok, const QString& error) {
      if (!ok) {
        std::fprintf(stderr, "phaselab: batch sweep: %s\n", qPrintable(error));
        exitCode = 1;
      } else {
        std::printf("%s", cw->batchSweep()->pointsJson().constData());
        std::fflush(stdout);  // the window may stay open: let a script see the points now
      }
      QTimer::singleShot(300, &app, [&, cw] {
        if (p.isSet(shot)) {
          if (!cw->grab().save(p.value(shot))) fail(QStringLiteral("cannot write %1").arg(p.value(shot)));
          else std::fprintf(stderr, "phaselab: saved %s\n", qPrintable(p.value(shot)));
        }
        if (p.isSet(quit)) QApplication::exit(exitCode);
      });
    });
  }

  const int rc = app.exec();
  return exitCode ? exitCode : rc;
}
