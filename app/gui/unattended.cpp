#include "unattended.h"

#include <QApplication>
#include <QFileInfo>
#include <QTimer>
#include <cstdio>

#include "batch_sweep_panel.h"
#include "chat_session.h"
#include "compare_window.h"
#include "engine_controller.h"
#include "main_window.h"

using namespace phaselab::ui;

UnattendedRun::UnattendedRun(MainWindow* window, const GuiArgs& args) : m_window(window), m_args(args) {}

void UnattendedRun::fail(const QString& message) {
  std::fprintf(stderr, "phaselab: %s\n", qPrintable(message));
  if (m_args.quit) {
    m_exitCode = 1;
    QTimer::singleShot(0, qApp, &QApplication::quit);
  }
}

void UnattendedRun::saveScreenshot(QWidget* window) {
  if (!m_args.screenshot) return;
  if (!window->grab().save(*m_args.screenshot))
    fail(QStringLiteral("cannot write %1").arg(*m_args.screenshot));
  else
    std::fprintf(stderr, "phaselab: saved %s\n", qPrintable(*m_args.screenshot));
}

void UnattendedRun::finishChat() {
  QTimer::singleShot(200, this, [this] {
    saveScreenshot(m_window);
    if (m_args.quit) QApplication::quit();
  });
}

void UnattendedRun::finishWindow(QWidget* window) {
  QTimer::singleShot(300, this, [this, window] {
    saveScreenshot(window);
    if (m_args.quit) QApplication::exit(m_exitCode);
  });
}

bool UnattendedRun::start() {
  MainWindow& window = *m_window;
  connect(window.engine(), &EngineController::modelLoadFailed, this, &UnattendedRun::fail);
  if (m_args.prompt) {
    connect(&window, &MainWindow::modelReady, this, [this] {
      if (m_args.notebook) m_window->setConversationMode(QStringLiteral("notebook"));
      if (!m_window->sendMessage(*m_args.prompt)) fail(m_window->lastError());
    }, Qt::SingleShotConnection);
  }
  connect(window.chatSession(), &ChatSession::answerFinished, this, [this](qint64, const MessageRecord& answer) {
    if (!m_args.prompt) return;
    if (answer.state == QLatin1String("error")) fail(answer.stats.error);
    if (m_args.quit) std::printf("%s\n", qPrintable(answer.content));
    finishChat();
  });
  if (!m_args.modelPath.isEmpty()) window.loadModel(m_args.modelPath);
  else if (m_args.prompt) fail(QStringLiteral("--prompt needs a model (--model FILE or FILE)"));
  // --screenshot / --quit without --prompt: the window once the model is
  // loaded, or as it opened when there is no model to load.
  if (!m_args.prompt && !m_args.compare && !m_args.batchSweep && (m_args.screenshot || m_args.quit)) {
    if (!m_args.modelPath.isEmpty())
      connect(&window, &MainWindow::modelReady, this, &UnattendedRun::finishChat, Qt::SingleShotConnection);
    else
      finishChat();
  }
  if (m_args.compare && !startCompare()) return false;
  if (m_args.batchSweep && !startBatchSweep()) return false;
  return true;
}

// --compare: the Compare window runs the models (and quantizations) and,
// unattended, saves its screenshot, prints the rows as JSON and exits.
bool UnattendedRun::startCompare() {
  CompareWindow* cw = m_window->compareWindow();
  for (const QString& m : m_args.compare->split(QLatin1Char(','), Qt::SkipEmptyParts)) cw->addModel(m);
  for (const QString& q : m_args.quant.split(QLatin1Char(','), Qt::SkipEmptyParts))
    if (!cw->addQuantization(q)) {
      std::fprintf(stderr, "phaselab: unknown quantization type %s\n", qPrintable(q));
      return false;
    }
  for (const QString& s : m_args.prune.split(QLatin1Char(','), Qt::SkipEmptyParts))
    if (!cw->addPruned(s)) {
      std::fprintf(stderr, "phaselab: --prune %s: see phaselab-cli prune --help for the spellings\n", qPrintable(s));
      return false;
    }
  if (m_args.drafts)
    for (int r = 1; r < cw->variantCount(); r++) cw->setDraft(r, true);
  if (!m_args.compareTab.isEmpty() && !cw->showResultTab(m_args.compareTab)) {
    std::fprintf(stderr, "phaselab: --compare-tab %s: no such tab (Table, Speed, Speed vs quality, Memory, Drafts)\n",
                 qPrintable(m_args.compareTab));
    return false;
  }
  if (m_args.textFile) cw->setTextFile(*m_args.textFile);
  cw->setChunks(m_args.chunks);
  if (m_args.threads) cw->setThreads(*m_args.threads);
  cw->show();
  connect(cw, &CompareWindow::runFinished, this, [this, cw](bool ok, const QString& error) {
    if (!ok) {
      std::fprintf(stderr, "phaselab: compare: %s\n", qPrintable(error));
      m_exitCode = 1;
    } else {
      std::printf("%s\n", phaselab::compare_rows_json(cw->rows()).c_str());
    }
    finishWindow(cw);
  });
  QTimer::singleShot(0, cw, [cw] { cw->startRun(); });
  return true;
}

// --batch-sweep: the sweep starts once the main window has loaded the model
// (so the load does not compete with the measurement), then as --compare.
bool UnattendedRun::startBatchSweep() {
  if (m_args.modelPath.isEmpty() && !QFileInfo::exists(m_window->settings().lastModel)) {
    std::fprintf(stderr, "phaselab: --batch-sweep needs a model: --model FILE or FILE\n");
    return false;
  }
  CompareWindow* cw = m_window->compareWindow();
  cw->setBatchSweep(*m_args.batchSweep, 128, 32);
  if (m_args.threads) cw->setThreads(*m_args.threads);
  cw->showBatchSweep();
  cw->show();
  connect(m_window, &MainWindow::modelReady, cw, [this, cw] {
    cw->setBatchModel(m_window->engine()->modelInfo().path);
    if (!cw->startBatchSweep()) fail(cw->batchSweep()->lastError());
  }, Qt::SingleShotConnection);
  connect(cw, &CompareWindow::batchSweepFinished, this, [this, cw](bool ok, const QString& error) {
    if (!ok) {
      std::fprintf(stderr, "phaselab: batch sweep: %s\n", qPrintable(error));
      m_exitCode = 1;
    } else {
      std::printf("%s", cw->batchSweep()->pointsJson().constData());
      std::fflush(stdout);  // the window may stay open: let a script see the points now
    }
    finishWindow(cw);
  });
  return true;
}
