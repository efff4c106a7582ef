// Never losing the loaded model: a load that fails (a file that is not a
// model, settings the model refuses) keeps the model that was working, the
// window goes on showing it, and Settings refuse a context the model cannot
// use before anything is applied.
#include <QFile>
#include <QLabel>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTemporaryDir>
#include <QTest>

#include "app_settings.h"
#include "chat_session.h"
#include "engine_controller.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "settings_dialog.h"
#include "status_bar_labels.h"

using namespace phaselab::ui;

class TestGuiModelSwap : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  int m_n = 0;

  MainWindow::Options options() {
    return testing::windowOptions(m_dir.filePath(QStringLiteral("w%1.sqlite").arg(++m_n)));
  }
  QString writeFile(const QString& name, const QByteArray& bytes) {
    const QString path = m_dir.filePath(name);
    QFile f(path);
    if (!f.open(QIODevice::WriteOnly)) return {};
    f.write(bytes);
    return path;
  }
  // Loads path over the working stories260K and checks that it is still loaded,
  // shown, and answers.
  void expectKeptAfterFailedLoad(MainWindow& w, const QString& path) {
    const ModelInfo before = w.engine()->modelInfo();
    QSignalSpy failed(w.engine(), &EngineController::modelLoadFailed);
    w.loadModel(path);
    QVERIFY(failed.wait(20000));
    QVERIFY(w.engine()->hasModel());
    QCOMPARE(w.engine()->modelInfo().path, before.path);
    QCOMPARE(w.engine()->modelInfo().contextSize, before.contextSize);
    QVERIFY(!w.isWelcomeShown());
    QVERIFY2(w.windowTitle().contains(before.name), qPrintable(w.windowTitle()));
    QVERIFY2(w.lastError().contains(QStringLiteral("still loaded")), qPrintable(w.lastError()));
    GenerationSettings g;
    g.temperature = 0;
    g.maxTokens = 4;
    g.ignoreEos = true;
    w.setGenerationSettings(g);
    QSignalSpy finished(w.chatSession(), &ChatSession::answerFinished);
    QVERIFY(w.sendMessage(QStringLiteral("still there?")));
    QVERIFY(finished.wait(60000));
  }

 private slots:
  void initTestCase() { testing::isolate(m_dir, "test_gui_model_swap"); }

  void a_failed_open_keeps_the_working_model() {
    MainWindow w(options());
    w.show();
    QVERIFY(testing::loadStories(w));
    expectKeptAfterFailedLoad(w, writeFile(QStringLiteral("notes.txt"), "just some text, not a model\n"));
    // A truncated copy of a real model.
    QFile real(testing::stories());
    QVERIFY(real.open(QIODevice::ReadOnly));
    expectKeptAfterFailedLoad(w, writeFile(QStringLiteral("truncated.gguf"), real.read(real.size() / 2)));
  }

  void engine_settings_that_fail_to_load_are_not_kept() {
    MainWindow w(options());
    w.show();
    QVERIFY(testing::loadStories(w));
    const EngineConfig working = w.engineConfig();
    EngineConfig bad = working;
    bad.contextSize = 1000000;  // beyond what the model was trained for: the engine refuses it
    w.setEngineConfig(bad);
    QSignalSpy failed(w.engine(), &EngineController::modelLoadFailed);
    w.loadModel(testing::stories());
    QVERIFY(failed.wait(20000));
    QVERIFY(w.engine()->hasModel());
    QVERIFY(w.engine()->modelInfo().config == working);
    QVERIFY(w.engineConfig() == working);  // the settings follow the model that is loaded
  }

  void settings_refuse_a_context_the_model_cannot_use() {
    AppSettings a;
    SettingsDialog dlg(a, a.engine, true);
    dlg.setTrainedContext(2048);
    auto* context = dlg.findChild<QSpinBox*>(QStringLiteral("contextSpin"));
    QVERIFY(context);
    for (int bad : {10, 1000000}) {
      context->setValue(bad);
      if (context->value() != bad) continue;  // the spin box itself refused it
      QVERIFY2(!dlg.engineError().isEmpty(), qPrintable(QString::number(bad)));
      dlg.accept();
      QVERIFY(dlg.result() != QDialog::Accepted);
      auto* error = dlg.findChild<QLabel*>(QStringLiteral("engineError"));
      QVERIFY(error && !error->isHidden() && !error->text().isEmpty());
    }
    context->setValue(1000000);
    QVERIFY(context->value() <= 2048 || !dlg.engineError().isEmpty());
    context->setValue(1024);
    QVERIFY(dlg.engineError().isEmpty());
    context->setValue(0);  // the model's own
    QVERIFY(dlg.engineError().isEmpty());
    dlg.accept();
    QCOMPARE(dlg.result(), int(QDialog::Accepted));
  }
};

QTEST_MAIN(TestGuiModelSwap)
#include "test_gui_model_swap.moc"
