// The Hugging Face client (engine/hub) against FakeHub on loopback: search,
// file lists (split files grouped, hostile paths skipped), the memory
// estimate from a range-read header, and downloads that resume, verify,
// refuse and explain. No test reaches the internet.
#include <QtTest>

#include <arpa/inet.h>
#include <csignal>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include <httplib.h>

#include <thread>

#include "hub/fake_hub.h"
#include "phaselab/gguf.h"
#include "phaselab/hub.h"

using namespace phaselab;
using phaselab::test::FakeHub;
namespace fs = std::filesystem;

namespace {

const std::string kModel = PHASELAB_TEST_DATA "/stories260K.gguf";
const std::string kStories = "phaselab-test/stories260K-GGUF";

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A loopback port nothing listens on: bound, noted, closed.
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    qFatal("cannot bind a loopback port");
  ::close(fd);
  return ntohs(a.sin_port);
}

// Partial files left in a folder.
int part_files(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".part") n++;
  return n;
}

}  // namespace

class TestHub : public QObject {
  Q_OBJECT

  std::unique_ptr<FakeHub> hub_;
  QTemporaryDir dir_;

  hub::HubOptions options() const {
    hub::HubOptions o;
    o.endpoint = hub_->endpoint();
    o.stall_timeout_s = 1;
    o.connect_timeout_s = 2;
    o.max_retry_wait_s = 1;
    return o;
  }
  std::string fresh_dir(const char* name) {
    const std::string d = dir_.path().toStdString() + "/" + name;
    fs::create_directories(d);
    return d;
  }
  hub::RepoInfo info_of(const std::string& repo, const hub::HubOptions& o) {
    auto info = hub::repo_info(o, repo);
    if (!info) qFatal("repo_info(%s): %s", repo.c_str(), info.status().message().c_str());
    return *info;
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    hub_ = std::make_unique<FakeHub>(kModel);
  }
  void cleanup() {
    hub_->set_delay_ms(0);
    hub_->truncate_next(0);
    hub_->stall_next(0, 0);
    hub_->rate_limit_next(0);
  }

  void search_lists_gguf_repositories_with_their_numbers() {
    auto r = hub::search_models(options(), "stories", hub::SortBy::downloads, 10);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QCOMPARE(r->size(), size_t(1));
    QCOMPARE((*r)[0].id, kStories);
    QCOMPARE((*r)[0].downloads, int64_t(12345));
    QCOMPARE((*r)[0].likes, int64_t(67));
    QCOMPARE((*r)[0].license, std::string("mit"));
    QCOMPARE((*r)[0].last_modified, std::string("2026-11-20T08:30:00.000Z"));

    auto all = hub::search_models(options(), "GGUF", hub::SortBy::likes, 50);
    QVERIFY(all.is_ok());
    QVERIFY(all->size() >= 5);
    for (size_t i = 1; i < all->size(); i++) QVERIFY((*all)[i - 1].likes >= (*all)[i].likes);
    bool gated = false;
    for (const auto& m : *all) gated = gated || (m.id == "phaselab-test/gated-GGUF" && m.gated == "manual");
    QVERIFY(gated);

    QVERIFY(!hub::search_models(options(), "x", hub::SortBy::downloads, 0).is_ok());
  }

  void repository_lists_models_and_skips_hostile_paths() {
    auto info = info_of(kStories, options());
    QCOMPARE(info.license, std::string("mit"));
    QCOMPARE(info.gated, std::string());
    QCOMPARE(info.commit.size(), size_t(40));
    QCOMPARE(info.models.size(), size_t(2));  // README.md and ../evil.gguf etc. are not models
    QCOMPARE(info.models[0].name, std::string("stories260K-F32.gguf"));
    QCOMPARE(info.models[0].quant, std::string("F32"));
    QCOMPARE(info.models[1].quant, std::string("Q8_0"));
    QCOMPARE(info.models[1].total_size(), uint64_t(hub_->model_bytes().size()));
    QCOMPARE(info.models[1].parts[0].sha256,
             FakeHub::sha256_hex(hub_->model_bytes().data(), hub_->model_bytes().size()));

    auto split = info_of("phaselab-test/split-GGUF", options());
    QCOMPARE(split.models.size(), size_t(1));
    QCOMPARE(split.models[0].parts.size(), size_t(2));
    QCOMPARE(split.models[0].quant, std::string("Q8_0"));
    QCOMPARE(split.models[0].label(), std::string("split-Q8_0-00001-of-00002.gguf (2 parts)"));
    QCOMPARE(split.models[0].total_size(), uint64_t(hub_->model_bytes().size()));

    auto missing = hub::repo_info(options(), "phaselab-test/missing-GGUF");
    QVERIFY(!missing.is_ok());
    QVERIFY2(contains(missing.status().message(), "not found"), missing.status().message().c_str());
    QVERIFY(contains(missing.status().message(), "Repository not found"));
    QVERIFY(!hub::repo_info(options(), "../etc").is_ok());
  }

  void pull_specs_and_choices() {
    auto s = hub::parse_pull_spec("owner/name:Q4_K_M");
    QVERIFY(s.is_ok());
    QCOMPARE(s->repo, std::string("owner/name"));
    QCOMPARE(s->selector, std::string("Q4_K_M"));
    s = hub::parse_pull_spec("https://huggingface.co/owner/name/blob/main/sub/file.gguf");
    QVERIFY(s.is_ok());
    QCOMPARE(s->repo, std::string("owner/name"));
    QCOMPARE(s->selector, std::string("sub/file.gguf"));
    for (const char* bad : {"", "name", "a/b/c", "../x", "a/..", "own er/x", "a/b\n"})
      QVERIFY2(!hub::parse_pull_spec(bad).is_ok(), bad);

    auto info = info_of(kStories, options());
    auto none = hub::choose_model(info, "");  // two models, no Q4_K_M: the error lists them
    QVERIFY(!none.is_ok());
    QVERIFY(contains(none.status().message(), "stories260K-F32.gguf"));
    QVERIFY(contains(none.status().message(), "stories260K-Q8_0.gguf"));
    auto q8 = hub::choose_model(info, "q8_0");
    QVERIFY(q8.is_ok());
    QCOMPARE(q8->name, std::string("stories260K-Q8_0.gguf"));
    auto byname = hub::choose_model(info, "stories260K-F32.gguf");
    QVERIFY(byname.is_ok());
    QCOMPARE(byname->quant, std::string("F32"));
    QVERIFY(!hub::choose_model(info, "Q2_K").is_ok());
    auto gated = info_of("phaselab-test/gated-GGUF", options());
    QVERIFY(hub::choose_model(gated, "").is_ok());  // the only one
  }

  void header_only_gguf_is_checked_against_the_whole_size() {
    const auto bytes = read_all(kModel);
    auto whole = GgufFile::from_bytes(bytes);
    QVERIFY(whole.is_ok());
    const size_t header = (*whole)->data_offset();
    auto h = GgufFile::header_from_bytes({bytes.begin(), bytes.begin() + header}, bytes.size());
    QVERIFY2(h.is_ok(), h.status().message().c_str());
    QCOMPARE((*h)->tensors().size(), (*whole)->tensors().size());
    for (const auto& t : (*h)->tensors()) QVERIFY(t.data == nullptr);
    // Too few bytes for the header, or a file too short for its tensors.
    QVERIFY(!GgufFile::header_from_bytes({bytes.begin(), bytes.begin() + header / 2}, bytes.size()).is_ok());
    QVERIFY(!GgufFile::header_from_bytes({bytes.begin(), bytes.begin() + header}, bytes.size() - 100).is_ok());
  }

  void fit_is_estimated_from_the_header() {
    auto info = info_of(kStories, options());
    const int before = hub_->range_requests();
    auto fit = hub::estimate_fit(options(), info, info.models[1], 256);
    QVERIFY2(fit.is_ok(), fit.status().message().c_str());
    QVERIFY(hub_->range_requests() > before);
    QCOMPARE(fit->architecture, std::string("llama"));
    QVERIFY(fit->supported);
    QCOMPARE(fit->n_ctx, 256);
    QVERIFY(fit->need.kv > 0);
    QVERIFY(fit->need.weights > 0 && fit->need.weights <= hub_->model_bytes().size());
    QVERIFY(fit->need.work > 0);
    auto big = hub::estimate_fit(options(), info, info.models[1], 512);
    QVERIFY(big.is_ok());
    QVERIFY(big->need.kv > fit->need.kv);

    auto moe = info_of("phaselab-test/moe-GGUF", options());
    auto m = hub::estimate_fit(options(), moe, moe.models[0], 4096);
    QVERIFY(m.is_ok());
    QCOMPARE(m->architecture, std::string("deepseek2"));
    QVERIFY(!m->supported);
    QVERIFY2(contains(m->note, "deepseek2") && contains(m->note, "not supported"), m->note.c_str());
  }

  void download_verifies_notes_its_source_and_keeps_the_token_home() {
    auto o = options();
    o.token = "hf_someone";  // an open repository: the API may see it, the CDN must not
    auto info = info_of(kStories, o);
    const std::string dir = fresh_dir("plain");
    std::vector<hub::DownloadProgress> seen;
    const int cdn_auth = hub_->cdn_requests_with_authorization();
    auto r = hub::download_model(o, info, info.models[1], dir, [&](const hub::DownloadProgress& p) { seen.push_back(p); });
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QCOMPARE(r->paths.size(), size_t(1));
    QCOMPARE(r->paths[0], dir + "/stories260K-Q8_0.gguf");
    QVERIFY(read_all(r->paths[0]) == hub_->model_bytes());
    QCOMPARE(hub_->cdn_requests_with_authorization(), cdn_auth);
    QCOMPARE(part_files(dir), 0);
    QVERIFY(!seen.empty());
    QCOMPARE(seen.back().stage, std::string("done"));
    QCOMPARE(seen.back().done, uint64_t(hub_->model_bytes().size()));

    std::ifstream note(r->paths[0] + ".source.json");
    auto j = nlohmann::json::parse(note);
    QCOMPARE(j["repo"].get<std::string>(), kStories);
    QCOMPARE(j["path"].get<std::string>(), std::string("stories260K-Q8_0.gguf"));
    QCOMPARE(j["sha256"].get<std::string>(), info.models[1].parts[0].sha256);
    QCOMPARE(j["license"].get<std::string>(), std::string("mit"));
    QVERIFY(contains(j["url"].get<std::string>(), hub_->endpoint() + "/" + kStories + "/blob/"));

    // Again: the same file is already there.
    const int cdn = hub_->cdn_requests();
    auto again = hub::download_model(o, info, info.models[1], dir);
    QVERIFY(again.is_ok());
    QVERIFY(again->already_present);
    QCOMPARE(hub_->cdn_requests(), cdn);

    // Another file under that name is not overwritten.
    const std::string other = fresh_dir("other");
    { std::ofstream(other + "/stories260K-Q8_0.gguf") << "mine"; }
    auto clash = hub::download_model(o, info, info.models[1], other);
    QVERIFY(!clash.is_ok());
    QVERIFY(contains(clash.status().message(), "already in the model folder"));
    QCOMPARE(read_all(other + "/stories260K-Q8_0.gguf").size(), size_t(4));
  }

  void split_model_downloads_every_part() {
    auto info = info_of("phaselab-test/split-GGUF", options());
    const std::string dir = fresh_dir("split");
    auto r = hub::download_model(options(), info, info.models[0], dir);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QCOMPARE(r->paths.size(), size_t(2));
    auto a = read_all(r->paths[0]), b = read_all(r->paths[1]);
    a.insert(a.end(), b.begin(), b.end());
    QVERIFY(a == hub_->model_bytes());
  }

  void truncated_and_stalled_transfers_resume_with_ranges() {
    auto info = info_of(kStories, options());
    const std::string dir = fresh_dir("truncated");
    int ranges = hub_->range_requests();
    hub_->truncate_next(1);
    auto r = hub::download_model(options(), info, info.models[1], dir);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QVERIFY(read_all(r->paths[0]) == hub_->model_bytes());
    QVERIFY(hub_->range_requests() > ranges);

    const std::string dir2 = fresh_dir("stalled");
    ranges = hub_->range_requests();
    hub_->stall_next(1, 2500);  // longer than the client's 1 s stall timeout
    std::vector<std::string> stages;
    auto s = hub::download_model(options(), info, info.models[0], dir2,
                                 [&](const hub::DownloadProgress& p) { stages.push_back(p.stage); });
    QVERIFY2(s.is_ok(), s.status().message().c_str());
    QVERIFY(read_all(s->paths[0]) == hub_->model_bytes());
    QVERIFY(hub_->range_requests() > ranges);
    bool resumed = false;
    for (const auto& st : stages) resumed = resumed || contains(st, "resuming");
    QVERIFY(resumed);
  }

  void pause_keeps_the_part_and_resume_finishes_it() {
    auto info = info_of(kStories, options());
    const std::string dir = fresh_dir("pause");
    hub_->set_delay_ms(30);
    hub::DownloadControl control;
    auto r = hub::download_model(
        options(), info, info.models[1], dir,
        [&](const hub::DownloadProgress& p) {
          if (p.done > 0 && p.stage == "downloading") control.pause();
        },
        &control);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QVERIFY(r->paused);
    QVERIFY(r->paths.empty());
    QCOMPARE(part_files(dir), 1);
    QVERIFY(!fs::exists(dir + "/stories260K-Q8_0.gguf"));

    hub_->set_delay_ms(0);
    control.reset();
    const int ranges = hub_->range_requests();
    auto done = hub::download_model(options(), info, info.models[1], dir, {}, &control);
    QVERIFY2(done.is_ok(), done.status().message().c_str());
    QVERIFY(!done->paused);
    QVERIFY(read_all(done->paths[0]) == hub_->model_bytes());
    QVERIFY(hub_->range_requests() > ranges);
    QVERIFY(done->bytes_transferred < hub_->model_bytes().size());
    QCOMPARE(part_files(dir), 0);
  }

  void cancel_leaves_nothing() {
    auto info = info_of(kStories, options());
    const std::string dir = fresh_dir("cancel");
    hub_->set_delay_ms(30);
    hub::DownloadControl control;
    auto r = hub::download_model(
        options(), info, info.models[1], dir,
        [&](const hub::DownloadProgress& p) {
          if (p.done > 0) control.cancel();
        },
        &control);
    QVERIFY(r.is_ok());
    QVERIFY(r->cancelled);
    QCOMPARE(part_files(dir), 0);
    QVERIFY(fs::is_empty(dir));
  }

  // A split model's parts stay partial files until every one is verified:
  // a pause in the second part leaves no model file under its own name, and
  // Cancel removes the first part's verified bytes too.
  void split_parts_appear_together_and_cancel_removes_them_all() {
    auto info = info_of("phaselab-test/split-GGUF", options());
    const std::string dir = fresh_dir("split-pause");
    hub_->set_delay_ms(20);
    hub::DownloadControl control;
    auto r = hub::download_model(
        options(), info, info.models[0], dir,
        [&](const hub::DownloadProgress& p) {
          if (p.part == 2 && p.stage == "downloading" && p.done > info.models[0].parts[0].size) control.pause();
        },
        &control);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QVERIFY(r->paused);
    QCOMPARE(part_files(dir), 2);  // the first part verified, the second partial
    for (const auto& e : fs::directory_iterator(dir)) QVERIFY2(e.path().extension() == ".part", e.path().c_str());

    control.reset();
    control.cancel();
    control.pause();  // a pause after a cancel does not undo it
    QVERIFY(control.cancelled());
    control.reset();
    auto c = hub::download_model(
        options(), info, info.models[0], dir,
        [&](const hub::DownloadProgress& p) {
          if (p.part == 2) control.cancel();
        },
        &control);
    QVERIFY(c.is_ok());
    QVERIFY(c->cancelled);
    QVERIFY(fs::is_empty(dir));
  }

  // Two downloads of one model at once (two windows, or the window and the
  // CLI): the second is refused while the first holds the partial file.
  void a_second_download_of_the_same_model_is_refused() {
    auto info = info_of(kStories, options());
    const std::string dir = fresh_dir("twice");
    hub_->set_delay_ms(50);
    hub::DownloadControl control;
    std::atomic<bool> started{false};
    Result<hub::DownloadResult> first = hub::DownloadResult{};
    std::thread t([&] {
      first = hub::download_model(
          options(), info, info.models[1], dir,
          [&](const hub::DownloadProgress& p) {
            if (p.done > 0) started = true;
          },
          &control);
    });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto second = hub::download_model(options(), info, info.models[1], dir);
    control.pause();
    t.join();
    QVERIFY(!second.is_ok());
    QVERIFY2(contains(second.status().message(), "being downloaded already"), second.status().message().c_str());
    QVERIFY(first.is_ok() && first->paused);
    hub_->set_delay_ms(0);
    auto done = hub::download_model(options(), info, info.models[1], dir);
    QVERIFY2(done.is_ok(), done.status().message().c_str());
    QVERIFY(read_all(done->paths[0]) == hub_->model_bytes());
  }

  void wrong_checksum_and_oversize_are_refused() {
    auto bad = info_of("phaselab-test/bad-checksum-GGUF", options());
    const std::string dir = fresh_dir("bad");
    auto r = hub::download_model(options(), bad, bad.models[0], dir);
    QVERIFY(!r.is_ok());
    QVERIFY2(contains(r.status().message(), "checksum"), r.status().message().c_str());
    QVERIFY(fs::is_empty(dir));

    auto over = info_of("phaselab-test/oversize-GGUF", options());
    auto o = hub::download_model(options(), over, over.models[0], dir);
    QVERIFY(!o.is_ok());
    QVERIFY2(contains(o.status().message(), "more than"), o.status().message().c_str());
    QVERIFY(fs::is_empty(dir));
  }

  void gated_repository_needs_the_token() {
    auto o = options();
    auto info = info_of("phaselab-test/gated-GGUF", o);
    QCOMPARE(info.gated, std::string("manual"));
    QCOMPARE(info.license, std::string("gemma"));
    const std::string dir = fresh_dir("gated");
    auto r = hub::download_model(o, info, info.models[0], dir);
    QVERIFY(!r.is_ok());
    QVERIFY2(contains(r.status().message(), "401") && contains(r.status().message(), "HF_TOKEN"),
             r.status().message().c_str());
    QVERIFY(fs::is_empty(dir));  // no empty partial file left by a refusal
    o.token = "hf_wrong";
    r = hub::download_model(o, info, info.models[0], dir);
    QVERIFY(!r.is_ok());
    QVERIFY2(contains(r.status().message(), "403") && contains(r.status().message(), "accept the model's terms"),
             r.status().message().c_str());
    o.token = FakeHub::kToken;
    const int cdn_auth = hub_->cdn_requests_with_authorization();
    r = hub::download_model(o, info, info.models[0], dir);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QVERIFY(read_all(r->paths[0]) == hub_->model_bytes());
    QCOMPARE(hub_->cdn_requests_with_authorization(), cdn_auth);  // not forwarded on the redirect
  }

  void rate_limits_are_retried_or_explained() {
    auto info = info_of(kStories, options());
    hub_->rate_limit_next(2, 0);
    const std::string dir = fresh_dir("rate");
    auto r = hub::download_model(options(), info, info.models[1], dir);
    QVERIFY2(r.is_ok(), r.status().message().c_str());

    hub_->rate_limit_next(100, 120);  // longer than max_retry_wait_s: reported, not waited for
    const std::string dir2 = fresh_dir("rate2");
    QElapsedTimer t;
    t.start();
    auto e = hub::download_model(options(), info, info.models[1], dir2);
    QVERIFY(!e.is_ok());
    QVERIFY2(contains(e.status().message(), "429") && contains(e.status().message(), "wait 120 s"),
             e.status().message().c_str());
    QVERIFY(t.elapsed() < 10000);
  }

  void offline_and_hostile_servers_get_clear_errors() {
    auto o = options();
    o.endpoint = "http://127.0.0.1:" + std::to_string(closed_port());
    o.max_retries = 0;
    auto r = hub::search_models(o, "x");
    QVERIFY(!r.is_ok());
    QVERIFY2(contains(r.status().message(), "cannot reach 127.0.0.1") && contains(r.status().message(), "offline"),
             r.status().message().c_str());

    auto big = options();
    big.max_json_bytes = 100;
    auto b = hub::search_models(big, "");
    QVERIFY(!b.is_ok());
    QVERIFY2(contains(b.status().message(), "more than"), b.status().message().c_str());

    auto bad = options();
    bad.endpoint = "ftp://example.org";
    QVERIFY(!hub::search_models(bad, "x").is_ok());
  }

  // HTTPS is verified: a server with a certificate no CA signed is refused
  // (a machine-in-the-middle), with a message that says so.
  void https_with_an_untrusted_certificate_is_refused() {
    const QString d = QString::fromStdString(fresh_dir("tls"));
    QProcess gen;
    gen.start("openssl", {"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d + "/key.pem", "-out",
                          d + "/cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1"});
    QVERIFY2(gen.waitForFinished(60000) && gen.exitCode() == 0, gen.readAllStandardError().constData());
    httplib::SSLServer server((d + "/cert.pem").toUtf8().constData(), (d + "/key.pem").toUtf8().constData());
    QVERIFY(server.is_valid());
    int hits = 0;
    server.Get("/api/models", [&](const httplib::Request&, httplib::Response& res) {
      hits++;
      res.set_content("[]", "application/json");
    });
    const int port = server.bind_to_any_port("127.0.0.1");
    std::thread t([&] { server.listen_after_bind(); });
    while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto o = options();
    o.endpoint = "https://127.0.0.1:" + std::to_string(port);
    o.max_retries = 0;
    auto r = hub::search_models(o, "x");
    server.stop();
    t.join();
    QVERIFY(!r.is_ok());
    QVERIFY2(contains(r.status().message(), "certificate"), r.status().message().c_str());
    QCOMPARE(hits, 0);
  }

  // ---- phaselab-cli pull, the same client as a command ----

 private:
  struct Run {
    int code;
    QString out, err;
  };
  Run pull(const QStringList& args, const QString& token = {}, int interrupt_after_ms = 0) {
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("HF_ENDPOINT", QString::fromStdString(hub_->endpoint()));
    env.remove("HF_TOKEN");
    if (!token.isEmpty()) env.insert("HF_TOKEN", token);
    p.setProcessEnvironment(env);
    p.start(PHASELAB_CLI_PATH, QStringList{"pull"} + args);
    if (!p.waitForStarted()) qFatal("cannot start phaselab-cli");
    QByteArray err;
    if (interrupt_after_ms > 0) {  // once the transfer has started
      p.setReadChannel(QProcess::StandardError);
      QElapsedTimer t;
      t.start();
      while (!err.contains("downloading") && t.elapsed() < 30000 && p.state() == QProcess::Running) {
        p.waitForReadyRead(50);
        err += p.readAllStandardError();
      }
      QTest::qWait(interrupt_after_ms);
      ::kill(static_cast<pid_t>(p.processId()), SIGINT);
    }
    p.waitForFinished(60000);
    err += p.readAllStandardError();
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, QString::fromUtf8(p.readAllStandardOutput()),
            QString::fromUtf8(err)};
  }

 private slots:
  void cli_searches_lists_and_downloads() {
    auto s = pull({"--search", "stories"});
    QCOMPARE(s.code, 0);
    QVERIFY2(s.out.contains("phaselab-test/stories260K-GGUF") && s.out.contains("12345") && s.out.contains("mit"),
             qPrintable(s.out));

    auto l = pull({"phaselab-test/stories260K-GGUF", "--list", "--ctx", "256"});
    QCOMPARE(l.code, 0);
    QVERIFY2(l.out.contains("stories260K-Q8_0.gguf") && l.out.contains("Q8_0") && l.out.contains("fits"),
             qPrintable(l.out));
    auto moe = pull({"phaselab-test/moe-GGUF", "--list"});
    QCOMPARE(moe.code, 0);
    QVERIFY2(moe.out.contains("cannot run deepseek2"), qPrintable(moe.out));

    auto amb = pull({"phaselab-test/stories260K-GGUF"});
    QCOMPARE(amb.code, 2);
    QVERIFY2(amb.err.contains("stories260K-F32.gguf") && amb.err.contains(":QUANT"), qPrintable(amb.err));
    QCOMPARE(pull({"not a repo"}).code, 2);

    const QString dir = QString::fromStdString(fresh_dir("cli"));
    auto d = pull({"phaselab-test/stories260K-GGUF:Q8_0", "--dir", dir, "--ctx", "256"});
    QVERIFY2(d.code == 0, qPrintable(d.err));
    QVERIFY2(d.err.contains("memory: fits"), qPrintable(d.err));
    QVERIFY(d.out.contains("saved"));
    QVERIFY(read_all((dir + "/stories260K-Q8_0.gguf").toStdString()) == hub_->model_bytes());
    auto again = pull({"phaselab-test/stories260K-GGUF:Q8_0", "--dir", dir, "--json"});
    QCOMPARE(again.code, 0);
    QVERIFY(nlohmann::json::parse(again.out.toStdString())["already_present"].get<bool>());
  }

  void cli_gated_interrupted_and_offline() {
    const QString dir = QString::fromStdString(fresh_dir("cli-gated"));
    auto g = pull({"phaselab-test/gated-GGUF", "--dir", dir});
    QCOMPARE(g.code, 1);
    QVERIFY2(g.err.contains("HF_TOKEN"), qPrintable(g.err));
    auto ok = pull({"phaselab-test/gated-GGUF", "--dir", dir}, FakeHub::kToken);
    QVERIFY2(ok.code == 0, qPrintable(ok.err));

    // Ctrl+C keeps the partial file; the same command resumes it.
    const QString dir2 = QString::fromStdString(fresh_dir("cli-interrupt"));
    hub_->set_delay_ms(200);
    auto i = pull({"phaselab-test/stories260K-GGUF:F32", "--dir", dir2}, {}, 300);
    QCOMPARE(i.code, 130);
    QVERIFY2(i.err.contains("run the same command again to resume"), qPrintable(i.err));
    QCOMPARE(part_files(dir2.toStdString()), 1);
    hub_->set_delay_ms(0);
    auto r = pull({"phaselab-test/stories260K-GGUF:F32", "--dir", dir2});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    QVERIFY2(r.err.contains("resuming at"), qPrintable(r.err));
    QCOMPARE(part_files(dir2.toStdString()), 0);

    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("HF_ENDPOINT", QString("http://127.0.0.1:%1").arg(closed_port()));
    p.setProcessEnvironment(env);
    p.start(PHASELAB_CLI_PATH, {"pull", "--search", "gemma"});
    p.waitForFinished(60000);
    QCOMPARE(p.exitCode(), 1);
    const QString err = QString::fromUtf8(p.readAllStandardError());
    QVERIFY2(err.contains("cannot reach") && err.contains("offline"), qPrintable(err));
  }
};

QTEST_GUILESS_MAIN(TestHub)
#include "test_hub.moc"
