// File > Get Models (offscreen) against the fake Hugging Face
// (tests/hub/fake_hub.h: the API's JSON, a CDN on another origin, the real
// bytes of stories260K): a search lists the repositories in the chosen
// order; a repository shows its licence and its GGUF files with sizes; the
// Fits? column fills (and follows the context; a MoE header is named
// unsupported); a download lands in the model folder with its source note
// and Load emits the path; Pause then Resume completes it from the partial
// file; Cancel leaves nothing behind; closing mid-download pauses at once
// and closing while a fit reads a header does not wait for it; a gated repository without a token says how to add one, and the Token…
// dialog's token opens it; an unreachable endpoint says so in place of the
// results; stale answers are dropped; the token store; the layout at
// 800x600 and 1280x800; File > Get Models… and the Models dialog's button.
#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QHeaderView>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QScreen>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTimer>
#include <arpa/inet.h>
#include <memory>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine_controller.h"
#include "get_models_dialog.h"
#include "gui_test_util.h"
#include "hub/fake_hub.h"
#include "hub_token_store.h"
#include "main_window.h"
#include "model_manager.h"

using namespace phaselab::ui;
using phaselab::test::FakeHub;
namespace hub = phaselab::hub;
using State = GetModelsDialog::DownloadState;

namespace {

const QString kStories = QStringLiteral("phaselab-test/stories260K-GGUF");
const QString kGated = QStringLiteral("phaselab-test/gated-GGUF");
const QString kSplit = QStringLiteral("phaselab-test/split-GGUF");
const QString kQ8 = QStringLiteral("stories260K-Q8_0.gguf");
const QString kTokenService = QStringLiteral("PhaseLabTest");

int rowOf(QTableWidget* t, const QString& text, int column = 0) {
  for (int r = 0; r < t->rowCount(); r++)
    if (t->item(r, column) && t->item(r, column)->text() == text) return r;
  return -1;
}

QStringList partFiles(const QString& dir) { return QDir(dir).entryList({QStringLiteral("*.part")}, QDir::Files); }

// A loopback port nothing listens on (bound, then closed).
int closedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 0;
  ::close(fd);
  return ntohs(a.sin_port);
}

QByteArray readAll(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

}  // namespace

class TestGuiGetModels : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  std::unique_ptr<FakeHub> m_hub;
  int m_folders = 0;

  QString newModelDir() { return m_dir.filePath(QStringLiteral("models-%1").arg(++m_folders)); }

  hub::HubOptions fakeOptions() const {
    hub::HubOptions o;
    o.endpoint = m_hub->endpoint();
    o.connect_timeout_s = 5;
    o.stall_timeout_s = 10;
    o.max_retries = 1;
    return o;
  }

  // A dialog on the fake hub whose token is kept in memory only (the
  // desktop's secret store is never touched).
  std::unique_ptr<GetModelsDialog> dialog(const QString& modelDir) {
    auto* tokens = new HubTokenStore(nullptr, kTokenService);
    tokens->setSecretStoreEnabled(false);
    auto d = std::make_unique<GetModelsDialog>(modelDir, nullptr, tokens);
    tokens->setParent(d.get());
    d->setHubOptions(fakeOptions());
    d->show();
    return d;
  }

  static bool searchFor(GetModelsDialog& d, const QString& text) {
    d.searchEdit()->setText(text);
    QTest::keyClick(d.searchEdit(), Qt::Key_Return);
    return QTest::qWaitFor([&] { return d.resultsTable()->rowCount() > 0 && !d.isResultsMessageShown(); }, 10000);
  }

  static bool openRepo(GetModelsDialog& d, const QString& repo) {
    if (!searchFor(d, repo)) return false;
    const int r = rowOf(d.resultsTable(), repo);
    if (r < 0) return false;
    d.resultsTable()->selectRow(r);
    return QTest::qWaitFor([&] { return d.filesTable()->rowCount() > 0; }, 10000);
  }

  // Every fit estimated (they read the header from the CDN).
  static bool fitsDone(GetModelsDialog& d) {
    return QTest::qWaitFor([&] {
      for (int r = 0; r < std::min(d.filesTable()->rowCount(), GetModelsDialog::kFitCap); r++)
        if (d.filesTable()->item(r, GetModelsDialog::FitsColumn)->text() == QStringLiteral("estimating…")) return false;
      return true;
    }, 15000);
  }

  static void selectFile(GetModelsDialog& d, const QString& label) {
    d.filesTable()->selectRow(rowOf(d.filesTable(), label));
  }

  static bool waitState(GetModelsDialog& d, State s, int ms = 15000) {
    return QTest::qWaitFor([&] { return d.downloadState() == s; }, ms);
  }

  // A download started on a slow CDN, stopped once some bytes are in.
  bool startSlowDownload(GetModelsDialog& d) {
    if (!openRepo(d, kStories) || !fitsDone(d)) return false;
    selectFile(d, kQ8);
    m_hub->set_delay_ms(150);  // ~19 chunks of 64 KiB: about 3 s
    d.downloadButton()->click();
    return QTest::qWaitFor([&] { return d.progressBar()->value() > 0; }, 10000);
  }

 private slots:
  void initTestCase() {
    testing::isolate(m_dir, "test_gui_get_models");
    qunsetenv("HF_TOKEN");
    qunsetenv("HF_ENDPOINT");
    m_hub = std::make_unique<FakeHub>(testing::stories().toStdString());
  }

  void cleanup() {
    m_hub->set_delay_ms(0);
    HubTokenStore tokens(nullptr, kTokenService);
    tokens.setSecretStoreEnabled(false);
    tokens.save(QString());  // no session token carried into the next test
  }

  void search_lists_the_repositories() {
    auto d = dialog(newModelDir());
    QVERIFY(d->isResultsMessageShown());  // the hint, before any search
    QCOMPARE(d->searchEdit()->placeholderText(), QStringLiteral("Search Hugging Face for GGUF models…"));
    QVERIFY(searchFor(*d, QStringLiteral("phaselab-test")));
    QTableWidget* t = d->resultsTable();
    QVERIFY(t->rowCount() >= 6);
    const int s = rowOf(t, kStories);
    QCOMPARE(s, 0);  // the most downloaded
    QCOMPARE(t->item(s, GetModelsDialog::DownloadsColumn)->text(), QStringLiteral("12 k"));
    QCOMPARE(t->item(s, GetModelsDialog::LikesColumn)->text(), QStringLiteral("67"));
    QCOMPARE(t->item(s, GetModelsDialog::UpdatedColumn)->text(), QStringLiteral("2026-11-20"));
    QCOMPARE(t->item(s, GetModelsDialog::LicenceColumn)->text(), QStringLiteral("mit"));
    QCOMPARE(t->item(s, GetModelsDialog::GatedColumn)->text(), QString());
    const int g = rowOf(t, kGated);
    QCOMPARE(g, 1);
    QVERIFY(t->item(g, GetModelsDialog::GatedColumn)->text().startsWith(QStringLiteral("gated")));
    QVERIFY(rowOf(t, kSplit) >= 0);
    QVERIFY(d->statusLabel()->text().contains(QStringLiteral("repositories")));
    // Most liked: the split repository (50) before the gated one (5).
    d->sortCombo()->setCurrentIndex(1);
    d->searchButton()->click();
    QTRY_COMPARE_WITH_TIMEOUT(rowOf(t, kSplit), 1, 10000);
    // No match: said in place of the results.
    d->searchEdit()->setText(QStringLiteral("nothing-like-this"));
    d->searchButton()->click();
    QTRY_VERIFY_WITH_TIMEOUT(d->resultsMessage()->text().contains(QStringLiteral("No GGUF repositories match")), 10000);
    QVERIFY(d->isResultsMessageShown());
  }

  void a_repository_lists_its_files_with_sizes_and_licence() {
    auto d = dialog(newModelDir());
    QVERIFY(openRepo(*d, kStories));
    QTableWidget* f = d->filesTable();
    QCOMPARE(f->rowCount(), 2);  // README.md and the hostile paths are not listed
    QCOMPARE(f->item(0, GetModelsDialog::FileNameColumn)->text(), QStringLiteral("stories260K-F32.gguf"));
    QCOMPARE(f->item(1, GetModelsDialog::FileNameColumn)->text(), kQ8);
    QCOMPARE(f->item(0, GetModelsDialog::QuantColumn)->text(), QStringLiteral("F32"));
    QCOMPARE(f->item(1, GetModelsDialog::QuantColumn)->text(), QStringLiteral("Q8_0"));
    const QString size = QString::fromStdString(hub::format_bytes(m_hub->model_bytes().size()));
    QCOMPARE(f->item(1, GetModelsDialog::SizeColumn)->text(), size);
    QCOMPARE(d->licenceLabel()->text(), QStringLiteral("Licence: mit"));
    QVERIFY(d->repoNote()->text().contains(QStringLiteral("Model card")));
    QVERIFY(!d->downloadButton()->isEnabled());  // no file chosen yet
    selectFile(*d, kQ8);
    QVERIFY(d->downloadButton()->isEnabled());

    // One model in two parts is one row.
    QVERIFY(openRepo(*d, kSplit));
    QCOMPARE(f->rowCount(), 1);
    QVERIFY2(f->item(0, GetModelsDialog::FileNameColumn)->text().endsWith(QStringLiteral("(2 parts)")),
             qPrintable(f->item(0, 0)->text()));
    QCOMPARE(f->item(0, GetModelsDialog::QuantColumn)->text(), QStringLiteral("Q8_0"));
    QCOMPARE(f->item(0, GetModelsDialog::SizeColumn)->text(), size);
    QCOMPARE(d->licenceLabel()->text(), QStringLiteral("Licence: apache-2.0"));

    // No licence stated: said, with what to do.
    QVERIFY(openRepo(*d, QStringLiteral("phaselab-test/bad-checksum-GGUF")));
    QCOMPARE(d->licenceLabel()->text(), QStringLiteral("Licence: not stated — read the model card before use"));
  }

  void fit_column_fills_and_follows_the_context() {
    auto d = dialog(newModelDir());
    QVERIFY(openRepo(*d, kStories));
    QVERIFY(fitsDone(*d));
    QTableWidget* f = d->filesTable();
    for (int r = 0; r < f->rowCount(); r++) {
      QTableWidgetItem* cell = f->item(r, GetModelsDialog::FitsColumn);
      // A 1 MiB model fits any machine that runs this test.
      QVERIFY2(cell->text().startsWith(QStringLiteral("yes — needs ")) && cell->text().contains(QStringLiteral(" of ")),
               qPrintable(cell->text()));
      QVERIFY2(cell->toolTip().contains(QStringLiteral("Weights")) && cell->toolTip().contains(QStringLiteral("KV cache")),
               qPrintable(cell->toolTip()));
    }
    // Another context: estimated again (the header is read again).
    const int before = m_hub->cdn_requests();
    d->contextSpin()->setValue(1024);
    QTRY_VERIFY_WITH_TIMEOUT(m_hub->cdn_requests() >= before + 2, 10000);
    QVERIFY(fitsDone(*d));
    QVERIFY(f->item(0, GetModelsDialog::FitsColumn)->text().startsWith(QStringLiteral("yes — needs ")));
    QCOMPARE(d->contextSpin()->minimum(), 512);
    QCOMPARE(d->contextSpin()->maximum(), 131072);
    QCOMPARE(d->contextSpin()->singleStep(), 512);

    // An architecture PhaseLab cannot run, named.
    QVERIFY(openRepo(*d, QStringLiteral("phaselab-test/moe-GGUF")));
    QVERIFY(fitsDone(*d));
    QCOMPARE(f->item(0, GetModelsDialog::FitsColumn)->text(), QStringLiteral("unsupported architecture (deepseek2)"));
  }

  void download_writes_the_model_and_load_emits_it() {
    const QString dir = newModelDir();
    auto d = dialog(dir);
    QVERIFY(openRepo(*d, kStories));
    selectFile(*d, kQ8);
    QSignalSpy downloaded(d.get(), &GetModelsDialog::modelDownloaded);
    QVERIFY(!d->loadButton()->isEnabled());
    d->downloadButton()->click();
    QVERIFY2(waitState(*d, State::done), qPrintable(d->statusLabel()->text()));
    const QString path = QDir(dir).filePath(kQ8);
    QCOMPARE(d->savedPath(), path);
    QCOMPARE(readAll(path), readAll(testing::stories()));
    QVERIFY(partFiles(dir).isEmpty());
    const QJsonObject note = QJsonDocument::fromJson(readAll(path + QStringLiteral(".source.json"))).object();
    QCOMPARE(note.value(QStringLiteral("repo")).toString(), kStories);
    QCOMPARE(note.value(QStringLiteral("license")).toString(), QStringLiteral("mit"));
    QVERIFY2(d->statusLabel()->text().startsWith(QStringLiteral("Saved to ") + QDir::toNativeSeparators(path)),
             qPrintable(d->statusLabel()->text()));
    QCOMPARE(d->progressBar()->value(), d->progressBar()->maximum());
    QVERIFY(d->loadButton()->isEnabled());
    d->loadButton()->click();
    QCOMPARE(downloaded.count(), 1);
    QCOMPARE(downloaded.first().first().toString(), path);

    // Again: the same file is recognised, nothing is transferred.
    d->show();
    d->downloadButton()->click();
    QVERIFY(waitState(*d, State::done));
    QVERIFY2(d->statusLabel()->text().startsWith(QStringLiteral("Already in the model folder")),
             qPrintable(d->statusLabel()->text()));
  }

  void pause_then_resume_completes_it() {
    const QString dir = newModelDir();
    auto d = dialog(dir);
    QVERIFY(startSlowDownload(*d));
    QCOMPARE(d->downloadState(), State::running);
    QVERIFY(!d->downloadButton()->isEnabled());
    QVERIFY2(d->statusLabel()->text().contains(QStringLiteral(" of ")), qPrintable(d->statusLabel()->text()));
    d->pauseButton()->click();
    QVERIFY2(waitState(*d, State::paused, 5000), qPrintable(d->statusLabel()->text()));
    QCOMPARE(d->pauseButton()->text(), QStringLiteral("Resume"));
    QVERIFY(d->pauseButton()->isEnabled());
    QVERIFY(d->statusLabel()->text().startsWith(QStringLiteral("Paused")));
    const QStringList parts = partFiles(dir);
    QCOMPARE(parts.size(), 1);
    const qint64 partial = QFileInfo(QDir(dir).filePath(parts.first())).size();
    QVERIFY2(partial > 0 && partial < qint64(m_hub->model_bytes().size()), qPrintable(QString::number(partial)));
    QVERIFY(!QFile::exists(QDir(dir).filePath(kQ8)));

    m_hub->set_delay_ms(0);
    const int ranges = m_hub->range_requests();
    d->pauseButton()->click();  // Resume
    QVERIFY2(waitState(*d, State::done), qPrintable(d->statusLabel()->text()));
    QCOMPARE(m_hub->range_requests(), ranges + 1);  // from where it stopped
    QCOMPARE(readAll(QDir(dir).filePath(kQ8)), readAll(testing::stories()));
    QVERIFY(partFiles(dir).isEmpty());
    QCOMPARE(d->pauseButton()->text(), QStringLiteral("Pause"));
    QVERIFY(!d->pauseButton()->isEnabled());
  }

  void cancel_leaves_no_partial_file() {
    const QString dir = newModelDir();
    auto d = dialog(dir);
    QVERIFY(startSlowDownload(*d));
    d->cancelButton()->click();
    QVERIFY2(waitState(*d, State::idle, 5000), qPrintable(d->statusLabel()->text()));
    QVERIFY(d->statusLabel()->text().startsWith(QStringLiteral("Cancelled")));
    QVERIFY(partFiles(dir).isEmpty());
    QVERIFY(!QFile::exists(QDir(dir).filePath(kQ8)));
    QCOMPARE(d->progressBar()->value(), 0);

    // Cancel while paused: nothing runs, the dialog removes the partial file.
    d->downloadButton()->click();
    QVERIFY(QTest::qWaitFor([&] { return d->progressBar()->value() > 0; }, 10000));
    d->pauseButton()->click();
    QVERIFY(waitState(*d, State::paused, 5000));
    QCOMPARE(partFiles(dir).size(), 1);
    d->cancelButton()->click();
    QCOMPARE(d->downloadState(), State::idle);
    QVERIFY(partFiles(dir).isEmpty());
    QVERIFY(QDir(dir).entryList(QDir::Files).isEmpty());
  }

  void closing_mid_download_pauses_at_once() {
    const QString dir = newModelDir();
    auto d = dialog(dir);
    QVERIFY(startSlowDownload(*d));
    // Close: paused, the partial file kept.
    d->reject();
    QVERIFY(waitState(*d, State::paused, 5000));
    QCOMPARE(partFiles(dir).size(), 1);
    // Resumed, then the dialog destroyed mid-transfer: no wait on the rest.
    d->show();
    d->pauseButton()->click();
    QVERIFY(QTest::qWaitFor([&] { return d->downloadState() == State::running && d->progressBar()->value() > 0; }, 5000));
    // A destructor that waited for the rest would leave the whole file.
    d.reset();
    QCoreApplication::processEvents();  // answers queued for the dialog are dropped
    QCOMPARE(partFiles(dir).size(), 1);
    QVERIFY(!QFile::exists(QDir(dir).filePath(kQ8)));
    // A new dialog's Download picks the partial file up.
    m_hub->set_delay_ms(0);
    auto again = dialog(dir);
    QVERIFY(openRepo(*again, kStories));
    selectFile(*again, kQ8);
    const int ranges = m_hub->range_requests();
    again->downloadButton()->click();
    QVERIFY2(waitState(*again, State::done), qPrintable(again->statusLabel()->text()));
    QVERIFY(m_hub->range_requests() > ranges);
    QCOMPARE(readAll(QDir(dir).filePath(kQ8)), readAll(testing::stories()));

    // Closed while the fits read their headers from a slow CDN: not waited for.
    auto slow = dialog(newModelDir());
    QVERIFY(openRepo(*slow, kStories));
    // 2 s a 64 KiB chunk: waiting for a 1 MiB header read would take 30 s
    // or more, far from the 10 s allowed even under a sanitizer.
    m_hub->set_delay_ms(2000);
    slow->contextSpin()->setValue(2048);
    QTest::qWait(600);  // the new estimates have started
    QElapsedTimer t;
    t.start();
    slow.reset();
    const qint64 ms = t.elapsed();
    m_hub->set_delay_ms(0);
    QVERIFY2(ms < 10000, qPrintable(QStringLiteral("the destructor took %1 ms").arg(ms)));
  }

  void gated_without_a_token_says_how() {
    const QString dir = newModelDir();
    auto d = dialog(dir);
    QVERIFY(d->tokenLabel()->text().startsWith(QStringLiteral("No token")));
    QVERIFY(openRepo(*d, kGated));
    QVERIFY2(d->repoNote()->text().contains(QStringLiteral("Gated")) &&
                 d->repoNote()->text().contains(QStringLiteral("Token…")),
             qPrintable(d->repoNote()->text()));
    QVERIFY(fitsDone(*d));
    QTableWidgetItem* fit = d->filesTable()->item(0, GetModelsDialog::FitsColumn);
    QVERIFY2(fit->text().startsWith(QStringLiteral("unknown (")), qPrintable(fit->text()));
    QVERIFY2(fit->toolTip().contains(QStringLiteral("needs a Hugging Face token")), qPrintable(fit->toolTip()));
    selectFile(*d, QStringLiteral("gated-Q4_K_M.gguf"));
    d->downloadButton()->click();
    QVERIFY(QTest::qWaitFor([&] { return d->statusLabel()->text().contains(QStringLiteral("401")); }, 10000));
    QCOMPARE(d->downloadState(), State::idle);
    QVERIFY2(d->statusLabel()->text().contains(QStringLiteral("Token…")), qPrintable(d->statusLabel()->text()));
    QVERIFY(!QFile::exists(QDir(dir).filePath(QStringLiteral("gated-Q4_K_M.gguf"))));

    // Token…: kept in memory here (the test's store has no secret store).
    d->tokenButton()->click();
    auto* tokenDialog = d->findChild<HubTokenDialog*>();
    QVERIFY(tokenDialog && tokenDialog->isVisible());
    QCOMPARE(tokenDialog->tokenEdit()->echoMode(), QLineEdit::Password);
    QVERIFY(!tokenDialog->saveButton()->isEnabled());
    QTest::keyClicks(tokenDialog->tokenEdit(), QString::fromLatin1(FakeHub::kToken));
    tokenDialog->saveButton()->click();
    QVERIFY2(d->tokenLabel()->text().startsWith(QStringLiteral("No secret store on this desktop: the token is kept until "
                                                               "PhaseLab closes; set HF_TOKEN to keep it")),
             qPrintable(d->tokenLabel()->text()));
    QCOMPARE(d->hubOptions().token, std::string(FakeHub::kToken));
    // The repository is read again with the token; now it downloads.
    QVERIFY(QTest::qWaitFor([&] { return d->filesTable()->rowCount() == 1; }, 10000));
    QVERIFY(!d->repoNote()->text().contains(QStringLiteral("No token is set")));
    selectFile(*d, QStringLiteral("gated-Q4_K_M.gguf"));
    d->downloadButton()->click();
    QVERIFY2(waitState(*d, State::done), qPrintable(d->statusLabel()->text()));
    QVERIFY(QFile::exists(QDir(dir).filePath(QStringLiteral("gated-Q4_K_M.gguf"))));
    QCOMPARE(m_hub->cdn_requests_with_authorization(), 0);  // the token stays with the API

    // A wrong token: 403, said.
    hub::HubOptions wrong = fakeOptions();
    wrong.token = "hf_wrong";
    auto other = dialog(newModelDir());
    other->setHubOptions(wrong);
    QVERIFY(openRepo(*other, kGated));
    selectFile(*other, QStringLiteral("gated-Q4_K_M.gguf"));
    other->downloadButton()->click();
    QVERIFY2(QTest::qWaitFor([&] { return other->statusLabel()->text().contains(QStringLiteral("403")); }, 10000),
             qPrintable(other->statusLabel()->text()));
  }

  void an_unreachable_endpoint_says_offline() {
    const int port = closedPort();
    QVERIFY(port > 0);
    auto d = dialog(newModelDir());
    hub::HubOptions o = fakeOptions();
    o.endpoint = "http://127.0.0.1:" + std::to_string(port);
    o.max_retries = 0;
    d->setHubOptions(o);
    d->searchEdit()->setText(QStringLiteral("gemma"));
    d->searchButton()->click();
    QVERIFY(QTest::qWaitFor([&] { return d->resultsMessage()->text().contains(QStringLiteral("cannot reach")); }, 15000));
    QVERIFY(d->isResultsMessageShown());
    QVERIFY2(d->resultsMessage()->text().contains(QStringLiteral("offline")), qPrintable(d->resultsMessage()->text()));
    QVERIFY(d->statusLabel()->text().contains(QStringLiteral("cannot reach")));
    QCOMPARE(d->resultsTable()->rowCount(), 0);
    // Still usable: the next search goes out again.
    QVERIFY(d->searchButton()->isEnabled());
    d->setHubOptions(fakeOptions());
    QVERIFY(searchFor(*d, QStringLiteral("stories")));
  }

  void stale_answers_are_dropped() {
    auto d = dialog(newModelDir());
    d->searchEdit()->setText(QStringLiteral("phaselab-test"));
    d->search();
    d->searchEdit()->setText(QStringLiteral("split"));
    d->search();
    QVERIFY(QTest::qWaitFor([&] { return d->resultsTable()->rowCount() > 0; }, 10000));
    QTest::qWait(300);  // the first search's answer, if it comes last, changes nothing
    QCOMPARE(d->resultsTable()->rowCount(), 1);
    QCOMPARE(d->resultsTable()->item(0, 0)->text(), kSplit);

    // Another repository selected before the first one's files came.
    QVERIFY(searchFor(*d, QStringLiteral("phaselab-test")));
    d->resultsTable()->selectRow(rowOf(d->resultsTable(), kStories));
    d->resultsTable()->selectRow(rowOf(d->resultsTable(), kSplit));
    QVERIFY(QTest::qWaitFor([&] { return d->filesTable()->rowCount() > 0; }, 10000));
    QTest::qWait(300);
    QCOMPARE(d->filesTable()->rowCount(), 1);
    QVERIFY(d->filesTable()->item(0, 0)->text().startsWith(QStringLiteral("split-Q8_0")));
  }

  void token_store_environment_and_session() {
    // HF_TOKEN wins over a stored token, and says so.
    HubTokenStore tokens(nullptr, kTokenService);
    tokens.setSecretStoreEnabled(false);
    tokens.save(QStringLiteral("hf_saved"));
    QCOMPARE(tokens.source(), HubTokenStore::Source::memory);
    QCOMPARE(tokens.token(), QStringLiteral("hf_saved"));
    qputenv("HF_TOKEN", "hf_from_env");
    QCOMPARE(tokens.source(), HubTokenStore::Source::environment);
    QCOMPARE(tokens.token(), QStringLiteral("hf_from_env"));
    QVERIFY(tokens.statusText().contains(QStringLiteral("using HF_TOKEN from the environment")));
    auto d = dialog(newModelDir());
    QVERIFY(d->tokenLabel()->text().contains(QStringLiteral("using HF_TOKEN from the environment")));
    d.reset();
    qunsetenv("HF_TOKEN");
    // A later store (a dialog opened again) still has the session's token.
    HubTokenStore later(nullptr, kTokenService);
    QCOMPARE(later.token(), QStringLiteral("hf_saved"));
    tokens.save(QString());
    QCOMPARE(later.token(), QString());

    // The desktop's secret store, under a service of the test's own: stored
    // there, or (no secret service, as on a headless machine) kept for the
    // session with the note that says so. Either way it answers.
    HubTokenStore real(nullptr, QStringLiteral("PhaseLabTest-%1").arg(QCoreApplication::applicationPid()));
    real.load();
    QVERIFY(QTest::qWaitFor([&] { return !real.isBusy(); }, 30000));
    real.save(QStringLiteral("hf_probe"));
    QVERIFY(QTest::qWaitFor([&] { return !real.isBusy(); }, 30000));
    QCOMPARE(real.token(), QStringLiteral("hf_probe"));
    QVERIFY(real.source() == HubTokenStore::Source::secretStore || real.source() == HubTokenStore::Source::memory);
    if (real.source() == HubTokenStore::Source::memory)
      QVERIFY(real.statusText().startsWith(QStringLiteral("No secret store on this desktop")));
    qInfo("secret store: %s", qPrintable(real.statusText()));
    real.save(QString());
    QVERIFY(QTest::qWaitFor([&] { return !real.isBusy(); }, 30000));
    QCOMPARE(real.token(), QString());
  }

  // Nothing clipped in the dialog at the size it opens with on an 800x600
  // and a 1280x800 screen, mid-download (the longest status line).
  void fits_800x600_and_1280x800() {
    for (const QSize screen : {QSize(800, 600), QSize(1280, 800)}) {
      const QString where = QStringLiteral("%1x%2").arg(screen.width()).arg(screen.height());
      auto d = dialog(newModelDir());
      // What the constructor does with the screen's available size.
      const QSize size(std::min(900, screen.width() - 40), std::min(640, screen.height() - 80));
      const QSize min = d->minimumSizeHint();
      QVERIFY2(min.width() <= size.width() && min.height() <= size.height(),
               qPrintable(where + QStringLiteral(": minimum %1x%2").arg(min.width()).arg(min.height())));
      d->resize(size);
      QVERIFY(QTest::qWaitForWindowExposed(d.get()));
      QVERIFY(startSlowDownload(*d));
      QVERIFY(QTest::qWaitFor([&] { return d->statusLabel()->text().contains(QStringLiteral("MiB/s")); }, 5000));
      QApplication::processEvents();
      QCOMPARE(d->size(), size);
      const QRect inside = d->rect();
      for (QWidget* w : d->findChildren<QWidget*>()) {
        // The controls (not their own parts: a line edit's clear button).
        const bool control = qobject_cast<QPushButton*>(w) || qobject_cast<QComboBox*>(w) ||
                             qobject_cast<QSpinBox*>(w) || w == d->searchEdit();
        if (!w->isVisible() || w->isWindow() || !control) continue;
        const QRect r(w->mapTo(d.get(), QPoint(0, 0)), w->size());
        QVERIFY2(inside.contains(r) && r.width() >= w->minimumSizeHint().width(),
                 qPrintable(where + QStringLiteral(": %1 '%2' at %3,%4 %5x%6 (needs %7)")
                                        .arg(QString::fromLatin1(w->metaObject()->className()), w->objectName())
                                        .arg(r.x()).arg(r.y()).arg(r.width()).arg(r.height())
                                        .arg(w->minimumSizeHint().width())));
      }
      for (QLabel* l : {d->statusLabel(), d->licenceLabel(), d->repoNote(), d->tokenLabel()}) {
        QVERIFY2(l->height() >= l->heightForWidth(l->width()),
                 qPrintable(where + QStringLiteral(": '%1' is %2 px high, needs %3")
                                        .arg(l->text()).arg(l->height()).arg(l->heightForWidth(l->width()))));
      }
      for (QTableWidget* t : {d->resultsTable(), d->filesTable()}) {
        int columns = 0;
        for (int c = 0; c < t->columnCount(); c++) columns += t->horizontalHeader()->sectionSize(c);
        QVERIFY2(columns <= t->viewport()->width(),
                 qPrintable(where + QStringLiteral(": %1's columns are %2 px in %3")
                                        .arg(t->objectName()).arg(columns).arg(t->viewport()->width())));
        // Room for a few rows.
        QVERIFY2(t->viewport()->height() >= 3 * t->verticalHeader()->defaultSectionSize(),
                 qPrintable(where + QStringLiteral(": %1 shows %2 px").arg(t->objectName()).arg(t->viewport()->height())));
      }
      // The file name column keeps room for a name.
      QVERIFY(d->filesTable()->horizontalHeader()->sectionSize(GetModelsDialog::FileNameColumn) >= 150);
      d->pauseButton()->click();
      QVERIFY(waitState(*d, State::paused, 5000));
    }
  }

  void main_window_opens_the_dialog() {
    MainWindow w(testing::windowOptions(m_dir.filePath(QStringLiteral("main.sqlite"))));
    w.show();
    auto* a = w.findChild<QAction*>(QStringLiteral("getModelsAction"));
    QVERIFY(a);
    QCOMPARE(a->shortcut(), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_G));
    QCOMPARE(a->text(), QStringLiteral("&Get Models…"));
    a->trigger();
    auto* d = w.findChild<GetModelsDialog*>();
    QVERIFY(d && d->isVisible());
    a->trigger();
    QCOMPARE(w.findChildren<GetModelsDialog*>().size(), 1);  // the same one, raised
    // Load: the main window loads the model.
    QSignalSpy ready(&w, &MainWindow::modelReady);
    emit d->modelDownloaded(testing::stories());
    QVERIFY(ready.wait(20000));
    QVERIFY(w.engine()->hasModel());
    // Closed: gone (made again next time).
    d->close();
    QTRY_VERIFY(w.findChild<GetModelsDialog*>() == nullptr);
  }

  void model_manager_opens_it() {
    const QString dir = newModelDir();
    QDir().mkpath(dir);
    ModelManager mm(dir, ModelInfo{}, false);
    mm.show();
    auto* button = mm.findChild<QPushButton*>(QStringLiteral("getModelsButton"));
    QVERIFY(button);
    QString shownFor;
    QTimer::singleShot(200, &mm, [&] {
      auto* g = qobject_cast<GetModelsDialog*>(QApplication::activeModalWidget());
      if (!g) return;
      shownFor = g->windowTitle();
      g->reject();
    });
    button->click();  // modal until the timer closes it
    QCOMPARE(shownFor, QStringLiteral("Get Models"));
    QVERIFY(mm.isVisible());  // back in the Models dialog, which reads the folder again
  }
};

QTEST_MAIN(TestGuiGetModels)
#include "test_gui_get_models.moc"
