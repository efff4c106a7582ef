// The desktop application's OpenAI API server and remote endpoints, with the
// real engine and the tiny real model: the worker serves the loaded model on
// 127.0.0.1, a plain HTTP client gets completions from it, a second engine in
// remote mode chats with it (tokens, metrics, Stop), and the failures (a dead
// port, an unknown model, a port in use) reach the GUI as messages.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <QCheckBox>
#include <QComboBox>
#include <QLabel>
#include <QLineEdit>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTabWidget>
#include <QStatusBar>
#include <QTemporaryDir>
#include <QTest>
#include <QUrl>
#include <nlohmann/json.hpp>

#include "app_settings.h"
#include "engine_controller.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "metrics_dock.h"
#include "phase_meter.h"
#include "settings_dialog.h"

using namespace phaselab::ui;

namespace {

// A port nothing listens on: bound by the kernel's choice, then closed.
int deadPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// "http://127.0.0.1:PORT/v1" -> "http://127.0.0.1:PORT"
std::string originOf(const QString& url) {
  const QString s = url.endsWith(QLatin1String("/v1")) ? url.chopped(3) : url;
  return s.toStdString();
}

}  // namespace

class TestGuiServe : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  int m_n = 0;

  static bool load(EngineController& e) {
    QSignalSpy loaded(&e, &EngineController::modelLoaded);
    EngineConfig c;
    c.threads = 1;  // the server's backend gets as many: two on a shared 2-core machine
    // The model's own context: stories260K has no chat template, so a chat
    // is rendered with three example exchanges first (~330 tokens).
    c.contextSize = 0;
    e.loadModel(testing::stories(), c);
    return loaded.wait(20000);
  }
  // Starts serving on a free port; the API's base, or empty.
  static QString serve(EngineController& e) {
    QSignalSpy started(&e, &EngineController::serverStarted);
    QSignalSpy failed(&e, &EngineController::serverFailed);
    e.startServer(0);
    if (!QTest::qWaitFor([&] { return !started.isEmpty() || !failed.isEmpty(); }, 20000)) return {};
    if (!failed.isEmpty()) qWarning("serverFailed: %s", qPrintable(failed.first().first().toString()));
    return started.isEmpty() ? QString() : started.first().first().toString();
  }
  static GenerationSettings greedy(int n) {
    GenerationSettings g;
    g.temperature = 0;
    g.maxTokens = n;
    return g;
  }
  MainWindow::Options options() { return testing::windowOptions(m_dir.filePath(QStringLiteral("s%1.sqlite").arg(++m_n))); }

 private slots:
  void initTestCase() { testing::isolate(m_dir, "test_gui_serve"); }

  // The worker serves the loaded model: a plain HTTP client gets a
  // completion, and a second engine in remote mode chats with it.
  void served_model_answers_http_and_a_remote_engine() {
    EngineController server;
    QVERIFY(load(server));
    const QString url = serve(server);
    QVERIFY2(url.startsWith(QLatin1String("http://127.0.0.1:")) && url.endsWith(QLatin1String("/v1")), qPrintable(url));
    QVERIFY(server.isServing());
    QCOMPARE(server.serverUrl(), url);

    // A real HTTP request, not through PhaseLab's client.
    httplib::Client http(originOf(url));
    http.set_read_timeout(60, 0);
    const nlohmann::json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
    auto res = http.Post("/v1/completions", body.dump(), "application/json");
    QVERIFY2(res, res ? "" : httplib::to_string(res.error()).c_str());
    QVERIFY2(res->status == 200, res->body.c_str());
    const auto j = nlohmann::json::parse(res->body);
    QVERIFY(!j.at("choices").at(0).at("text").get<std::string>().empty());
    QVERIFY(j.at("usage").at("completion_tokens").get<int>() > 0);

    // A second engine, remote: the model is the server's first (only) one.
    EngineController client;
    QSignalSpy loaded(&client, &EngineController::modelLoaded);
    client.connectRemote({url, {}, {}});
    QVERIFY(loaded.wait(20000));
    const auto info = loaded.first().first().value<ModelInfo>();
    QVERIFY(info.remote);
    QCOMPARE(info.remoteUrl, url);
    QCOMPARE(info.path, url);
    QVERIFY(!info.remoteModel.isEmpty());
    QCOMPARE(info.name, info.remoteModel);
    QCOMPARE(info.backend, QStringLiteral("remote"));
    QCOMPARE(info.nParams, qint64(0));  // not known from here: shown as "—", never as a figure
    QVERIFY(client.hasModel());

    QString text;
    int lastCount = 0;
    connect(&client, &EngineController::tokensReady, this, [&](int, const QString& d, int n) {
      text += d;
      lastCount = n;
    });
    QList<LiveMetrics> metrics;
    connect(&client, &EngineController::metricsUpdated, this, [&](const LiveMetrics& m) { metrics << m; });
    QSignalSpy finished(&client, &EngineController::generationFinished);
    QVERIFY(client.send({{QStringLiteral("user"), QStringLiteral("Tell me a story")}}, greedy(24)) > 0);
    QVERIFY(finished.wait(60000));
    const auto stats = finished.first().at(1).value<RequestStats>();
    QVERIFY2(stats.error.isEmpty(), qPrintable(stats.error));
    QVERIFY(stats.nGenerated > 0);
    QVERIFY(stats.nGenerated <= 24);
    QVERIFY(stats.nPrompt > 0);  // from the server's usage
    QVERIFY(stats.ttftMs > 0);
    QCOMPARE(stats.backend, QStringLiteral("remote"));
    QVERIFY2(stats.stopReason == QLatin1String("stop") || stats.stopReason == QLatin1String("length"),
             qPrintable(stats.stopReason));
    QVERIFY(!text.isEmpty());
    QVERIFY(lastCount > 0);
    QVERIFY(!metrics.isEmpty());
    for (const LiveMetrics& m : metrics) QVERIFY(m.remote);
    QCOMPARE(metrics.last().phase, Phase::done);
    QCOMPARE(metrics.last().nGenerated, stats.nGenerated);
    QCOMPARE(metrics.last().kvCapacity, quint64(0));  // no KV figures from a remote server
    QVERIFY(!client.isBusy());

    // Stop before the first piece: the client closes the stream at once and
    // the answer ends "cancelled" (the cancel atomic reaches RemoteClient).
    finished.clear();
    QVERIFY(client.send({{QStringLiteral("user"), QStringLiteral("Tell me another story")}}, greedy(200)) > 0);
    client.stop();
    QVERIFY(finished.wait(60000));
    const auto stopped = finished.first().at(1).value<RequestStats>();
    QVERIFY2(stopped.error.isEmpty(), qPrintable(stopped.error));
    QCOMPARE(stopped.stopReason, QStringLiteral("cancelled"));

    // The server is still serving after a client went away mid-request.
    finished.clear();
    QVERIFY(client.send({{QStringLiteral("user"), QStringLiteral("Hello")}}, greedy(8)) > 0);
    QVERIFY(finished.wait(60000));
    QVERIFY(finished.first().at(1).value<RequestStats>().nGenerated > 0);

    // A model the server does not serve: a load failure that names it.
    EngineController wrong;
    QSignalSpy failed(&wrong, &EngineController::modelLoadFailed);
    wrong.connectRemote({url, {}, QStringLiteral("no-such-model")});
    QVERIFY(failed.wait(20000));
    const QString why = failed.first().first().toString();
    QVERIFY2(why.contains(QLatin1String("no-such-model")) && why.contains(QLatin1String("does not serve")), qPrintable(why));
    QVERIFY(!wrong.hasModel());

    // Unloading stops the server: the signal, and the port no longer answers.
    QSignalSpy stoppedSpy(&server, &EngineController::serverStopped);
    server.unloadModel();
    QVERIFY(stoppedSpy.wait(20000));
    QVERIFY(!server.isServing());
    httplib::Client after(originOf(url));
    after.set_connection_timeout(2, 0);
    QVERIFY(!after.Get("/health"));
  }

  // Nothing listens at the URL: the usual load failure, saying so.
  void remote_connect_to_a_dead_port_fails() {
    const int port = deadPort();
    QVERIFY(port > 0);
    EngineController e;
    QSignalSpy failed(&e, &EngineController::modelLoadFailed);
    QSignalSpy loaded(&e, &EngineController::modelLoaded);
    QSignalSpy errors(&e, &EngineController::errorOccurred);
    const QString url = QStringLiteral("http://127.0.0.1:%1/v1").arg(port);
    e.connectRemote({url, {}, {}});
    QVERIFY(e.isLoading());
    QVERIFY(failed.wait(30000));
    const QString why = failed.first().first().toString();
    QVERIFY2(why.contains(QLatin1String("cannot reach")) && why.contains(url), qPrintable(why));
    QVERIFY(loaded.isEmpty());
    QVERIFY(!e.isLoading());
    QVERIFY(!e.hasModel());
    QVERIFY(!errors.isEmpty());  // "Could not load the model: ..." for the banner
    // Nothing to chat with.
    QCOMPARE(e.send({{QStringLiteral("user"), QStringLiteral("Hi")}}, greedy(4)), 0);

    // A URL that is not one: said before any connection.
    failed.clear();
    e.connectRemote({QStringLiteral("127.0.0.1:8080"), {}, {}});
    QVERIFY(failed.wait(10000));
    QVERIFY2(failed.first().first().toString().contains(QLatin1String("http://")),
             qPrintable(failed.first().first().toString()));
  }

  // A taken port fails with a message that says what to do; serving without
  // a model, or with a remote one, is refused with the reason.
  void serving_failures_say_why() {
    EngineController first;
    QVERIFY(load(first));
    const QString url = serve(first);
    QVERIFY(!url.isEmpty());
    const int port = QUrl(url).port();
    QVERIFY(port > 0);

    EngineController second;
    QVERIFY(load(second));
    QSignalSpy failed(&second, &EngineController::serverFailed);
    second.startServer(port);
    QVERIFY(failed.wait(20000));
    const QString why = failed.first().first().toString();
    QVERIFY2(why.contains(QString::number(port)) && why.contains(QLatin1String("in use")), qPrintable(why));
    QVERIFY(!second.isServing());

    EngineController none;
    QSignalSpy noModel(&none, &EngineController::serverFailed);
    none.startServer(0);
    QVERIFY(noModel.wait(10000));
    QVERIFY2(noModel.first().first().toString().contains(QLatin1String("No model")),
             qPrintable(noModel.first().first().toString()));

    EngineController remote;
    QSignalSpy loaded(&remote, &EngineController::modelLoaded);
    remote.connectRemote({url, {}, {}});
    QVERIFY(loaded.wait(20000));
    QSignalSpy remoteFailed(&remote, &EngineController::serverFailed);
    remote.startServer(0);
    QVERIFY(remoteFailed.wait(10000));
    QVERIFY2(remoteFailed.first().first().toString().contains(QLatin1String("local model")),
             qPrintable(remoteFailed.first().first().toString()));

    // Loading another model stops the first one's server.
    QSignalSpy stopped(&first, &EngineController::serverStopped);
    QVERIFY(load(first));
    QCOMPARE(stopped.size(), 1);
    QVERIFY(!first.isServing());
  }

  // The window: the status bar says where it serves, and a remote model makes
  // the metrics say they are client-side only.
  void window_shows_serving_and_remote_state() {
    QString url;
    {
      MainWindow w(options());
      w.show();
      QVERIFY(testing::loadStories(w));
      QVERIFY(w.serveLabelText().isEmpty());
      QVERIFY(!w.metricsDock()->isRemoteNoteShown());
      QSignalSpy started(w.engine(), &EngineController::serverStarted);
      w.setServeSettings(true, 0);
      QVERIFY(started.wait(20000));
      url = started.first().first().toString();
      QCOMPARE(w.serveLabelText(), QStringLiteral("Serving at %1").arg(url));
      // Saved: the next start serves again once a model loads.
      QVERIFY(AppSettings::load().serve);
      QCOMPARE(AppSettings::load().servePort, 0);

      // A remote window on this one's server.
      MainWindow r(options());
      r.show();
      QSignalSpy remoteReady(&r, &MainWindow::modelReady);
      r.connectRemote({url, {}, {}});
      QVERIFY(remoteReady.wait(20000));
      QVERIFY(r.engine()->modelInfo().remote);
      QVERIFY(r.metricsDock()->isRemoteNoteShown());
      QVERIFY(r.metricsDock()->remoteNoteText().contains(QLatin1String("client-side figures only")));
      QVERIFY(r.metricsDock()->phaseMeter()->isRemote());
      QVERIFY(r.metricsDock()->phaseMeter()->decodeText().contains(QLatin1String("no prefill/KV/device data")));
      // The chat toolbar's KV cache and speculative decoding are not sent to
      // a server: off in the remote window, on in the local one.
      QVERIFY(!r.findChild<QCheckBox*>(QStringLiteral("kvToggle"))->isEnabled());
      QVERIFY(!r.findChild<QComboBox*>(QStringLiteral("specCombo"))->isEnabled());
      QVERIFY(w.findChild<QCheckBox*>(QStringLiteral("kvToggle"))->isEnabled());
      QVERIFY(w.findChild<QComboBox*>(QStringLiteral("specCombo"))->isEnabled());
      // An answer through the window: the phase meter stays without figures.
      GenerationSettings g;
      g.temperature = 0;
      g.maxTokens = 16;
      r.setGenerationSettings(g);
      QSignalSpy finished(r.engine(), &EngineController::generationFinished);
      QVERIFY(r.sendMessage(QStringLiteral("Hello")));
      QVERIFY(finished.wait(60000));
      QVERIFY(finished.first().at(1).value<RequestStats>().nGenerated > 0);
      QVERIFY(r.metricsDock()->phaseMeter()->isRemote());
      QCOMPARE(r.metricsDock()->phaseMeter()->decodeFraction(), 0.0);
      // The tiny model's tokens reach the client together (no measurable decode interval): either text is right,
      // both say the figure is the client's.
      QVERIFY(r.metricsDock()->phaseMeter()->decodeText().startsWith(PhaseMeter::remoteNote()));
      QVERIFY(r.metricsDock()->phaseMeter()->decodeText().contains(QLatin1String("here")));
      if (const QByteArray dir = qgetenv("PHASELAB_SCREENSHOTS"); !dir.isEmpty()) {
        r.resize(1280, 800);
        r.metricsDock()->showPhaseMeter();
        QTest::qWait(200);  // (screenshots only) let the charts lay out
        r.grab().save(QString::fromLocal8Bit(dir) + QStringLiteral("/remote-window.png"));
        w.grab().save(QString::fromLocal8Bit(dir) + QStringLiteral("/serving-window.png"));
      }
      // The serve setting (saved above, shared by both windows' settings) does
      // not serve a remote model.
      QVERIFY(r.serveLabelText().isEmpty());
      QVERIFY(!r.engine()->isServing());

      QSignalSpy stopped(w.engine(), &EngineController::serverStopped);
      w.setServeSettings(false, 0);
      QVERIFY(stopped.wait(20000));
      QVERIFY(w.serveLabelText().isEmpty());
      QVERIFY(!AppSettings::load().serve);
    }
  }

  // Settings > Servers: the fields reach AppSettings, the status line shows
  // what MainWindow gives it, and the dialog still fits a 1280x800 screen.
  void settings_dialog_servers_page() {
    AppSettings a;
    SettingsDialog dlg(a, a.engine, false);
    dlg.showServersPage();
    QCOMPARE(dlg.findChild<QTabWidget*>(QStringLiteral("settingsTabs"))->currentIndex(), 2);
    auto* serve = dlg.findChild<QCheckBox*>(QStringLiteral("serveCheck"));
    auto* port = dlg.findChild<QSpinBox*>(QStringLiteral("servePortSpin"));
    auto* useRemote = dlg.findChild<QCheckBox*>(QStringLiteral("useRemoteCheck"));
    auto* url = dlg.findChild<QLineEdit*>(QStringLiteral("remoteUrlEdit"));
    auto* model = dlg.findChild<QLineEdit*>(QStringLiteral("remoteModelEdit"));
    QVERIFY(serve && port && useRemote && url && model);
    QCOMPARE(port->value(), 8080);  // the default
    QVERIFY(!url->isEnabled());     // until a remote server is chosen
    serve->setChecked(true);
    port->setValue(9090);
    useRemote->setChecked(true);
    QVERIFY(url->isEnabled());
    url->setText(QStringLiteral(" http://127.0.0.1:8000/v1 "));
    model->setText(QStringLiteral("qwen"));
    const AppSettings b = dlg.settings();
    QVERIFY(b.serve);
    QCOMPARE(b.servePort, 9090);
    QVERIFY(b.useRemote);
    QCOMPARE(b.remote.url, QStringLiteral("http://127.0.0.1:8000/v1"));
    QCOMPARE(b.remote.model, QStringLiteral("qwen"));
    dlg.setServeStatus(QStringLiteral("Serving at http://127.0.0.1:9090/v1"));
    QCOMPARE(dlg.findChild<QLabel*>(QStringLiteral("serveStatus"))->text(), QStringLiteral("Serving at http://127.0.0.1:9090/v1"));
    QVERIFY2(dlg.sizeHint().height() <= 760, qPrintable(QString::number(dlg.sizeHint().height())));
    if (const QByteArray dir = qgetenv("PHASELAB_SCREENSHOTS"); !dir.isEmpty()) {
      dlg.show();
      QVERIFY(QTest::qWaitForWindowExposed(&dlg));
      dlg.grab().save(QString::fromLocal8Bit(dir) + QStringLiteral("/settings-servers.png"));
    }
  }

  void settings_round_trip() {
    AppSettings a = AppSettings::load();
    a.serve = true;
    a.servePort = 18080;
    a.useRemote = true;
    a.remote = {QStringLiteral("http://10.0.0.5:8000/v1"), QStringLiteral("sk-test"), QStringLiteral("qwen")};
    a.save();
    AppSettings b = AppSettings::load();
    QCOMPARE(b.serve, true);
    QCOMPARE(b.servePort, 18080);
    QCOMPARE(b.useRemote, true);
    QCOMPARE(b.remote.url, a.remote.url);
    QCOMPARE(b.remote.apiKey, a.remote.apiKey);
    QCOMPARE(b.remote.model, a.remote.model);
    b.useRemote = false;
    b.serve = false;
    b.remote.apiKey.clear();
    b.save();
    const AppSettings c = AppSettings::load();
    QVERIFY(!c.useRemote);
    QVERIFY(!c.serve);
    QVERIFY(c.remote.apiKey.isEmpty());
  }
};

QTEST_MAIN(TestGuiServe)
#include "test_gui_serve.moc"
