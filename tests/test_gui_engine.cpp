// EngineController + EngineWorker with the real engine and the tiny real
// model: coalescing, Stop, errors, metrics.
#include <QFile>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>

#include "engine_controller.h"
#include "engine_worker.h"
#include "app_settings.h"
#include "gui_test_util.h"
#include "model_manager.h"

using namespace phaselab::ui;

class TestGuiEngine : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;

  static GenerationSettings longAnswer(int n) {
    GenerationSettings g;
    g.temperature = 0;
    g.maxTokens = n;
    g.ignoreEos = true;  // stories260K ends stories quickly; tests need length
    return g;
  }
  static bool load(EngineController& e, const QString& path, const QString& backend = QStringLiteral("cpu")) {
    QSignalSpy loaded(&e, &EngineController::modelLoaded);
    EngineConfig c;
    c.threads = 1;  // a spinning pool on a shared 2-core machine would measure the neighbours
    c.backend = backend;
    e.loadModel(path, c);
    return loaded.wait(20000);
  }

 private slots:
  void initTestCase() {
    testing::isolate(m_dir, "test_gui_engine");
#ifdef PHASELAB_CUDA_EMU_LIB
    // The CUDA backend, where no GPU is present, is the CUDA emulator's
    // (tests/cuda_emu); set before anything loads the CUDA library.
    if (qEnvironmentVariableIsEmpty("PHASELAB_CUDA_LIB")) qputenv("PHASELAB_CUDA_LIB", PHASELAB_CUDA_EMU_LIB);
#endif
  }

  // The desktop application's CUDA path: the worker thread drives the CUDA
  // backend and streams the same greedy text as the CPU reference.
  void cuda_backend_streams_the_cpu_text() {
#ifndef PHASELAB_CUDA_EMU_LIB
    QSKIP("built without CUDA: there is no CUDA backend to run");
#else
    QString texts[2];
    for (int i = 0; i < 2; i++) {
      EngineController e;
      QStringList errors;
      connect(&e, &EngineController::errorOccurred, this, [&](const QString& m) { errors << m; });
      // The CPU reference: the fast CPU backend's 8-bit activations may
      // break a near-tie differently.
      QVERIFY(load(e, testing::stories(), i == 0 ? QStringLiteral("cpu-reference") : QStringLiteral("cuda")));
      QVERIFY2(errors.isEmpty(), qPrintable(errors.join('\n')));
      connect(&e, &EngineController::tokensReady, this, [&](int, const QString& d, int) { texts[i] += d; });
      QSignalSpy finished(&e, &EngineController::generationFinished);
      // 32 tokens: at the 42nd the CPU reference's two best logits are
      // 0.0025 apart, a tie that summation order may break either way.
      e.send({{QStringLiteral("user"), QStringLiteral("Tell me a story")}}, longAnswer(32));
      QVERIFY(finished.wait(60000));
      const auto stats = finished.takeFirst().at(1).value<RequestStats>();
      QVERIFY2(stats.error.isEmpty(), qPrintable(stats.error));
      if (i == 0)
        QVERIFY(stats.backend.startsWith(QStringLiteral("cpu")));
      else
        QCOMPARE(stats.backend, QStringLiteral("cuda"));
      QCOMPARE(stats.nGenerated, 32);
    }
    QVERIFY(!texts[0].isEmpty());
    QCOMPARE(texts[1], texts[0]);
#endif
  }

  void send_without_model_is_refused() {
    EngineController e;
    QCOMPARE(e.send({{QStringLiteral("user"), QStringLiteral("hi")}}, GenerationSettings{}), 0);
    QVERIFY(!e.isBusy());
  }

  void deltas_are_coalesced_under_a_fast_engine() {
    EngineController e;
    QVERIFY(load(e, testing::stories()));
    QCOMPARE(e.modelInfo().architecture, QStringLiteral("llama"));
    QVERIFY(e.modelInfo().weightBytes > 0);

    int deltas = 0, lastCount = 0;
    QString text;
    connect(&e, &EngineController::tokensReady, this, [&](int, const QString& d, int n) {
      deltas++;
      text += d;
      QVERIFY(n >= lastCount);
      lastCount = n;
    });
    QSignalSpy finished(&e, &EngineController::generationFinished);
    const int id = e.send({{QStringLiteral("user"), QStringLiteral("Tell me a story")}}, longAnswer(1500));
    QVERIFY(id > 0);
    QVERIFY(e.isBusy());
    QVERIFY(finished.wait(60000));
    const auto stats = finished.takeFirst().at(1).value<RequestStats>();
    QVERIFY2(stats.error.isEmpty(), qPrintable(stats.error));
    QCOMPARE(stats.nGenerated, 1500);
    QCOMPARE(stats.stopReason, QStringLiteral("length"));
    QCOMPARE(lastCount, 1500);
    QVERIFY(!text.isEmpty());
    // One delta per >= 16 ms plus the first and the last: at ~3000 tokens/s
    // that is a few per 48 tokens, never one per token.
    const double decodeMs = stats.decodeMs + stats.ttftMs;
    qInfo("1500 tokens in %.0f ms -> %d deltas", decodeMs, deltas);
    QVERIFY2(deltas <= decodeMs / EngineWorker::kDeltaIntervalMs + 3,
             qPrintable(QStringLiteral("%1 deltas in %2 ms").arg(deltas).arg(decodeMs)));
    QVERIFY2(deltas * 10 < 1500, qPrintable(QStringLiteral("%1 deltas for 1500 tokens").arg(deltas)));
    QVERIFY(!e.isBusy());
  }

  void metrics_arrive_during_and_after_a_request() {
    EngineController e;
    QVERIFY(load(e, testing::stories()));
    QList<LiveMetrics> snaps;
    connect(&e, &EngineController::metricsUpdated, this, [&](const LiveMetrics& m) { snaps << m; });
    QSignalSpy finished(&e, &EngineController::generationFinished);
    e.send({{QStringLiteral("user"), QStringLiteral("Hello")}}, longAnswer(300));
    QVERIFY(finished.wait(60000));
    QVERIFY(snaps.size() >= 2);
    QCOMPARE(snaps.first().phase, Phase::prefill);
    QVERIFY(snaps.first().nPrompt > 0);
    // The phase turns with the first token (the screenshots had shown
    // "prefill" beside a streaming answer for an update interval).
    QCOMPARE(snaps.at(1).phase, Phase::decode);
    QCOMPARE(snaps.at(1).nGenerated, 1);
    QVERIFY(snaps.at(1).ttftMs > 0);
    QCOMPARE(snaps.last().phase, Phase::done);
    QCOMPARE(snaps.last().nGenerated, 300);
    QCOMPARE(snaps.last().kvUsed, static_cast<quint64>(snaps.first().nPrompt + 300 - 1));
    QCOMPARE(snaps.last().kvCapacity, static_cast<quint64>(e.modelInfo().contextSize));
    QVERIFY(snaps.last().decodeTps > 0);
  }

  void stop_stops_within_one_step() {
    EngineController e;
    QVERIFY(load(e, testing::stories()));
    GenerationSettings g = longAnswer(1000);
    g.useKvCache = false;  // slow steps, so Stop lands mid-answer
    int atStop = -1;
    connect(&e, &EngineController::tokensReady, this, [&](int, const QString&, int) {
      if (atStop >= 0) return;
      e.stop();
      // Read after setting the flag: at most the step already running may follow.
      atStop = e.tokensGenerated();
    });
    QSignalSpy finished(&e, &EngineController::generationFinished);
    e.send({{QStringLiteral("user"), QStringLiteral("Tell me a story")}}, g);
    QVERIFY(finished.wait(60000));
    const auto stats = finished.takeFirst().at(1).value<RequestStats>();
    QCOMPARE(stats.stopReason, QStringLiteral("cancelled"));
    QVERIFY(atStop >= 1);
    QVERIFY2(stats.nGenerated <= atStop + 1,
             qPrintable(QStringLiteral("stop at %1 tokens, ended at %2").arg(atStop).arg(stats.nGenerated)));
    // The engine takes the next request normally.
    QSignalSpy again(&e, &EngineController::generationFinished);
    QVERIFY(e.send({{QStringLiteral("user"), QStringLiteral("Hi")}}, longAnswer(5)) > 0);
    QVERIFY(again.wait(60000));
    QCOMPARE(again.takeFirst().at(1).value<RequestStats>().nGenerated, 5);
  }

  void garbage_model_fails_and_engine_stays_usable() {
    const QString bad = m_dir.filePath(QStringLiteral("garbage.gguf"));
    {
      QFile f(bad);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(QByteArray(4096, 'x'));
    }
    EngineController e;
    QSignalSpy failed(&e, &EngineController::modelLoadFailed);
    QSignalSpy errors(&e, &EngineController::errorOccurred);
    e.loadModel(bad, EngineConfig{});
    QVERIFY(failed.wait(20000));
    QVERIFY(!failed.takeFirst().at(0).toString().isEmpty());
    QCOMPARE(errors.size(), 1);
    QVERIFY(!e.hasModel());
    QVERIFY(!e.isLoading());
    QVERIFY(load(e, testing::stories()));
    QSignalSpy finished(&e, &EngineController::generationFinished);
    QVERIFY(e.send({{QStringLiteral("user"), QStringLiteral("Hi")}}, longAnswer(8)) > 0);
    QVERIFY(finished.wait(60000));
    QCOMPARE(finished.takeFirst().at(1).value<RequestStats>().nGenerated, 8);
  }

  void model_manager_describes_models() {
    QString err;
    const ModelInfo info = ModelManager::describe(testing::stories(), &err);
    QVERIFY2(err.isEmpty(), qPrintable(err));
    QCOMPARE(info.architecture, QStringLiteral("llama"));
    QCOMPARE(info.contextTrained, 2048);
    QVERIFY(info.nParams > 290'000 && info.nParams < 300'000);
    QVERIFY(info.typeMix.contains(QStringLiteral("F32")));
    QCOMPARE(info.chatTemplate, QStringLiteral("plain-fewshot"));  // no template: a base model
    QVERIFY(!info.hasChatTemplate);
    const ModelInfo bad = ModelManager::describe(m_dir.filePath(QStringLiteral("missing.gguf")), &err);
    QVERIFY(bad.architecture.isEmpty());
    QVERIFY(!err.isEmpty());
  }

  void settings_round_trip() {
    AppSettings a;
    a.engine.backend = QStringLiteral("cpu-reference");
    a.engine.threads = 3;
    a.engine.contextSize = 1024;
    a.engine.kvType = QStringLiteral("f32");
    a.generation.temperature = 0.25f;
    a.generation.topK = 7;
    a.generation.seed = 123456789012345ULL;
    a.generation.useKvCache = false;
    a.generation.systemPrompt = QStringLiteral("Be brief.");
    a.save();
    const AppSettings b = AppSettings::load();
    QCOMPARE(b.engine.backend, a.engine.backend);
    QCOMPARE(b.engine.threads, 3);
    QCOMPARE(b.engine.contextSize, 1024);
    QCOMPARE(b.engine.kvType, QStringLiteral("f32"));
    QCOMPARE(b.generation.temperature, 0.25f);
    QCOMPARE(b.generation.topK, 7);
    QCOMPARE(b.generation.seed, a.generation.seed);
    QCOMPARE(b.generation.useKvCache, false);
    QCOMPARE(b.generation.systemPrompt, a.generation.systemPrompt);
  }

  void bad_sampling_parameters_become_an_error_signal() {
    EngineController e;
    QVERIFY(load(e, testing::stories()));
    GenerationSettings g;
    g.topP = 5.0f;  // out of range
    QSignalSpy errors(&e, &EngineController::errorOccurred);
    QSignalSpy finished(&e, &EngineController::generationFinished);
    QVERIFY(e.send({{QStringLiteral("user"), QStringLiteral("Hi")}}, g) > 0);
    QVERIFY(finished.wait(20000));
    QVERIFY(!finished.takeFirst().at(1).value<RequestStats>().error.isEmpty());
    QCOMPARE(errors.size(), 1);
    QVERIFY(!e.isBusy());
  }

  // The KV cache storage setting reaches the engine: F32 takes twice the
  // bytes of F16 (the default) and BF16 as many; an unknown stored value
  // loads with the default.
  void kv_storage_setting_reaches_the_session() {
    auto loadWith = [&](const QString& kvType) -> ModelInfo {
      EngineController e;
      QSignalSpy loaded(&e, &EngineController::modelLoaded);
      EngineConfig c;
      c.threads = 1;
      c.contextSize = 256;
      c.kvType = kvType;
      e.loadModel(testing::stories(), c);
      if (!loaded.wait(20000)) return {};
      return loaded.first().first().value<ModelInfo>();
    };
    const ModelInfo h = loadWith(QStringLiteral("f16")), f = loadWith(QStringLiteral("f32")),
                    b = loadWith(QStringLiteral("bf16")), odd = loadWith(QStringLiteral("q9"));
    QCOMPARE(h.kvType, QStringLiteral("f16"));
    QCOMPARE(f.kvType, QStringLiteral("f32"));
    QCOMPARE(b.kvType, QStringLiteral("bf16"));
    QCOMPARE(odd.kvType, QStringLiteral("f16"));
    QVERIFY(h.kvBytes > 0);
    QCOMPARE(f.kvBytes, 2 * h.kvBytes);
    QCOMPARE(b.kvBytes, h.kvBytes);
  }
};

QTEST_GUILESS_MAIN(TestGuiEngine)
#include "test_gui_engine.moc"
