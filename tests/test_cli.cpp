// The phaselab-cli contract other tools build on: output formats and exit
// codes (0 success, 2 bad input with a one-line error on stderr).
#include <QCryptographicHash>
#include <QElapsedTimer>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>

#include "phaselab/backend.h"
#include "tiny_model.h"

using namespace phaselab::testing;

namespace {

struct Run {
  int code = -1;
  QString out, err;
};

Run cli(const QStringList& args, const QByteArray& stdin_data = {}, const QProcessEnvironment& env = QProcessEnvironment::systemEnvironment()) {
  QProcess p;
  p.setProcessEnvironment(env);
  p.start(PHASELAB_CLI_PATH, args);
  if (!p.waitForStarted()) qFatal("cannot start phaselab-cli");
  if (!stdin_data.isEmpty()) p.write(stdin_data);
  p.closeWriteChannel();
  if (!p.waitForFinished(600000)) qFatal("phaselab-cli did not finish");
  return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, QString::fromUtf8(p.readAllStandardOutput()),
          QString::fromUtf8(p.readAllStandardError())};
}

QString stories() { return QString::fromStdString(test_data("stories260K.gguf")); }

// Starts `serve` on stories260K on a free port (plus extra arguments) and
// returns the URL it prints, or "" when it printed none within 30 s.
QString start_server(QProcess& srv, const QStringList& extra = {}) {
  srv.start(PHASELAB_CLI_PATH, QStringList{"serve", "-m", stories(), "--port", "0", "-t", "2"} + extra);
  if (!srv.waitForStarted()) return {};
  QString url;
  for (int i = 0; i < 300 && url.isEmpty(); i++) {
    srv.waitForReadyRead(100);
    url = QString::fromUtf8(srv.readLine()).trimmed();
  }
  return url;
}

// For inputs that used to hang: a run that does not finish in `ms` is killed
// and reported as code -2.
Run cli_within(const QStringList& args, int ms, const QByteArray& stdin_data = {}) {
  QProcess p;
  p.start(PHASELAB_CLI_PATH, args);
  if (!p.waitForStarted()) qFatal("cannot start phaselab-cli");
  if (!stdin_data.isEmpty()) p.write(stdin_data);
  p.closeWriteChannel();
  if (!p.waitForFinished(ms)) {
    p.kill();
    p.waitForFinished();
    return {-2, {}, QStringLiteral("(killed after %1 ms)").arg(ms)};
  }
  return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, QString::fromUtf8(p.readAllStandardOutput()),
          QString::fromUtf8(p.readAllStandardError())};
}

void expect_bad_input(const Run& r) {
  QCOMPARE(r.code, 2);
  QVERIFY2(r.err.trimmed().count('\n') == 0 && r.err.contains("error"), qPrintable(r.err));
}

void write_file(const QString& path, const QByteArray& data) {
  QFile f(path);
  if (!f.open(QIODevice::WriteOnly | QIODevice::Truncate)) qFatal("cannot write %s", qPrintable(path));
  f.write(data);
}

QByteArray read_file(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

// `count` distinct story prompts, one JSON object a line, with "n" varied
// from n_min to n_min + n_span - 1.
QByteArray story_lines(int count, int n_min, int n_span) {
  const QStringList starts = {"Once upon a time", "The cat", "Lily wanted to", "One day, a big",
                              "Tom and his dog",  "The sun was", "A little bird", "Mom said"};
  QByteArray lines;
  for (int i = 0; i < count; i++)
    lines += QJsonDocument(QJsonObject{{"prompt", QString("%1 %2").arg(starts[i % starts.size()]).arg(i)},
                                       {"n", n_min + (i * 37) % n_span}})
                 .toJson(QJsonDocument::Compact) +
             "\n";
  return lines;
}

// A batch output by "index", each line whole JSON answered once; what is
// wrong instead goes to *problem.
QMap<int, QJsonObject> records_by_index(const QByteArray& out, QString* problem) {
  QMap<int, QJsonObject> by_index;
  if (!out.isEmpty() && !out.endsWith('\n')) *problem = "a torn last line";
  for (const QByteArray& line : out.split('\n')) {
    if (line.isEmpty()) continue;
    QJsonParseError e;
    const QJsonObject o = QJsonDocument::fromJson(line, &e).object();
    if (e.error != QJsonParseError::NoError || !o.contains("index")) *problem = "not a record: " + QString(line);
    else if (by_index.contains(o["index"].toInt())) *problem = QString("index %1 twice").arg(o["index"].toInt());
    by_index[o["index"].toInt()] = o;
  }
  return by_index;
}

}  // namespace

class TestCli : public QObject {
  Q_OBJECT
 private slots:
  void version_and_help() {
    for (const char* flag : {"--version", "-V"}) {
      const Run v = cli({flag});
      QCOMPARE(v.code, 0);
      QVERIFY2(v.out.startsWith("phaselab-cli ") && v.out.count('.') >= 2, qPrintable(v.out));
    }
    const Run h = cli({"--help"});
    QCOMPARE(h.code, 0);
    QVERIFY(h.out.contains("usage: phaselab-cli COMMAND"));
    QVERIFY(h.out.contains("--version"));
    expect_bad_input(cli({"--versio"}));
  }

  void info_describes_stories260k() {
    const Run r = cli({"info", stories()});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("llama"));
    QVERIFY(r.out.contains("layers          5, n_embd 64, n_ff 172"));
    QVERIFY(r.out.contains("8 heads, 4 KV heads, head_dim 8"));
    QVERIFY(r.out.contains("512 tokens"));
    const Run j = cli({"info", stories(), "--json"});
    QCOMPARE(j.code, 0);
    const QJsonObject o = QJsonDocument::fromJson(j.out.toUtf8()).object();
    QCOMPARE(o["architecture"].toString(), QString("llama"));
    QCOMPARE(o["hparams"].toObject()["n_layer"].toInt(), 5);
    QCOMPARE(o["hparams"].toObject()["n_head_kv"].toInt(), 4);
    QCOMPARE(o["hparams"].toObject()["n_vocab"].toInt(), 512);
    QCOMPARE(o["tensor_types"].toObject()["F32"].toObject()["tensors"].toInt(), 48);
    QCOMPARE(o["vocab"].toObject()["model"].toString(), QString("llama"));
    QCOMPARE(o["chat_template"].toObject()["present"].toBool(), false);
  }

  void info_describes_the_default_model() {
    const std::string path = default_model_path();
    if (path.empty()) {
      if (std::getenv("CI")) QFAIL("default model missing");
      QSKIP("default model not fetched (run scripts/fetch-model.sh)");
    }
    const Run j = cli({"info", QString::fromStdString(path), "--json"});
    QCOMPARE(j.code, 0);
    const QJsonObject o = QJsonDocument::fromJson(j.out.toUtf8()).object();
    const QJsonObject h = o["hparams"].toObject();
    QCOMPARE(o["architecture"].toString(), QString("gemma3"));
    QCOMPARE(h["n_layer"].toInt(), 18);
    QCOMPARE(h["n_embd"].toInt(), 640);
    QCOMPARE(h["n_head"].toInt(), 4);
    QCOMPARE(h["n_head_kv"].toInt(), 1);
    QCOMPARE(h["head_dim"].toInt(), 256);
    QCOMPARE(h["n_ff"].toInt(), 2048);
    QCOMPARE(h["n_vocab"].toInt(), 262144);
    QCOMPARE(h["sliding_window"].toInt(), 512);
    QCOMPARE(h["n_swa_layers"].toInt(), 15);
    QCOMPARE(h["rope_base"].toDouble(), 1e6);
    QCOMPARE(h["rope_base_swa"].toDouble(), 1e4);
    QVERIFY(o["tensor_types"].toObject().contains("Q4_K"));
    QVERIFY(o["tensor_types"].toObject().contains("Q6_K"));
  }

  void info_on_a_corrupt_file_is_a_one_line_error() {
    const QString path = QDir::temp().filePath("phaselab_corrupt.gguf");
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f", 16);
    f.close();
    const Run r = cli({"info", path});
    expect_bad_input(r);
    QVERIFY(r.err.contains("phaselab_corrupt.gguf"));
    expect_bad_input(cli({"info", "/nonexistent.gguf"}));
  }

  void tokenize_prints_ids_on_one_line() {
    const Run r = cli({"tokenize", "-m", stories(), "Once upon a time"});
    QCOMPARE(r.code, 0);
    QCOMPARE(r.out, QString("1 403 407 261 378\n"));
    QCOMPARE(cli({"tokenize", "-m", stories(), "--no-bos", "Once upon a time"}).out, QString("403 407 261 378\n"));
    const Run p = cli({"tokenize", "-m", stories(), "--no-bos", "--pieces", "Once upon"});
    QCOMPARE(p.code, 0);
    QVERIFY2(p.out.contains("' Once'"), qPrintable(p.out));
    const QString file = QDir::temp().filePath("phaselab_prompt.txt");
    QFile f(file);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("Once upon a time");
    f.close();
    QCOMPARE(cli({"tokenize", "-m", stories(), "--file", file}).out, QString("1 403 407 261 378\n"));
  }

  void generate_json_has_the_contract_fields() {
    const Run r = cli({"generate", "-m", stories(), "-p", "Once upon a time", "-n", "16", "--temp", "0", "--json", "-q"});
    QCOMPARE(r.code, 0);
    const QJsonObject o = QJsonDocument::fromJson(r.out.toUtf8()).object();
    for (const char* key : {"prompt_tokens", "tokens", "text", "ttft_ms", "prefill_tps", "decode_tps", "tpot_ms",
                            "n_prompt", "n_generated", "stop_reason"})
      QVERIFY2(o.contains(key), key);
    QCOMPARE(o["n_prompt"].toInt(), 5);
    QCOMPARE(o["n_generated"].toInt(), 16);
    QCOMPARE(o["tokens"].toArray().size(), 16);
    QCOMPARE(o["stop_reason"].toString(), QString("length"));
    QVERIFY(o["text"].toString().startsWith(", there was a little girl named Lily."));
    QVERIFY(r.err.contains("decode"));  // the metrics line
    // Streaming mode writes the same text to stdout.
    const Run s = cli({"generate", "-m", stories(), "-p", "Once upon a time", "-n", "16", "--temp", "0", "--no-kv-cache"});
    QCOMPARE(s.code, 0);
    QCOMPARE(s.out.trimmed(), o["text"].toString().trimmed());
  }

  // --backend cuda end to end, on the CUDA emulator (tests/cuda_emu) where
  // no GPU is present: the same greedy tokens as the CPU backend, and bench
  // reports the CUDA backend rather than falling back.
  void cuda_backend_matches_the_cpu() {
#ifndef PHASELAB_CUDA_EMU_LIB
    QSKIP("built without CUDA: there is no CUDA backend to run");
#else
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("PHASELAB_CUDA_LIB", PHASELAB_CUDA_EMU_LIB);
    const QStringList args = {"generate", "-m", stories(), "-p", "Once upon a time", "-n", "24", "--temp", "0", "--json", "-q"};
    const Run c = cli(args);
    const Run g = cli(args + QStringList{"--backend", "cuda"}, {}, env);
    QCOMPARE(c.code, 0);
    QCOMPARE(g.code, 0);
    QVERIFY2(!g.err.contains("using the CPU backend"), qPrintable(g.err));
    const QJsonObject oc = QJsonDocument::fromJson(c.out.toUtf8()).object();
    const QJsonObject og = QJsonDocument::fromJson(g.out.toUtf8()).object();
    QCOMPARE(og["backend"].toString(), QString("cuda"));
    QCOMPARE(og["tokens"].toArray(), oc["tokens"].toArray());
    const Run b = cli({"bench", "-m", stories(), "--backend", "cuda", "-p", "32", "-n", "8", "-r", "1", "--json"}, {}, env);
    QCOMPARE(b.code, 0);
    QVERIFY2(b.out.contains("\"backend\": \"cuda\"") || b.out.contains("\"backend\":\"cuda\""), qPrintable(b.out));
    // PHASELAB_CUDA_PROFILE: a table per phase of where the time went.
    QProcessEnvironment penv = env;
    penv.insert("PHASELAB_CUDA_PROFILE", "1");
    const Run pr = cli({"bench", "-m", stories(), "--backend", "cuda", "-p", "32", "-n", "4", "-r", "1"}, {}, penv);
    QCOMPARE(pr.code, 0);
    for (const char* want : {"CUDA profile, decode", "CUDA profile, prefill", "| attention |", "| logits |"})
      QVERIFY2(pr.err.contains(want), qPrintable(pr.err));
#endif
  }

  void bad_parameters_exit_2_with_one_line() {
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "x", "--temp", "-1"}));
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "x", "--top-p", "7"}));
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "x", "-n", "zero"}));
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "x", "--bogus"}));
    expect_bad_input(cli({"generate", "-p", "x"}));
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "x", "--ctx-size", "100000"}));
    expect_bad_input(cli({"tokenize", "-m", stories()}));
    expect_bad_input(cli({"frobnicate"}));
  }

  void quantize_rewrites_the_matrices() {
    QTemporaryDir dir;
    const QString out = dir.filePath("phaselab_stories_q8.gguf");
    const Run q = cli({"quantize", stories(), out, "Q8_0"});
    QCOMPARE(q.code, 0);
    const Run j = cli({"info", out, "--json"});
    const QJsonObject types = QJsonDocument::fromJson(j.out.toUtf8()).object()["tensor_types"].toObject();
    QVERIFY(types.contains("Q8_0"));
    QVERIFY(types["F32"].toObject()["tensors"].toInt() < 48);  // norms stay F32
    const Run g = cli({"generate", "-m", out, "-p", "Once upon a time", "-n", "12", "--temp", "0"});
    QCOMPARE(g.code, 0);
    QVERIFY2(g.out.contains("Lily"), qPrintable(g.out));
    expect_bad_input(cli({"quantize", stories(), out, "Q9_9"}));
  }

  // prune: a measured drop (the run with the smallest distance, reported),
  // a file that loads and generates, and the input never overwritten.
  void prune_drops_the_measured_layers_and_protects_its_input() {
    QTemporaryDir dir;
    const QString out = dir.filePath("pruned.gguf");
    const Run r = cli({"prune", stories(), out, "--prune", "layers:n1", "--json", "-t", "1"});
    QCOMPARE(r.code, 0);
    const QJsonObject j = QJsonDocument::fromJson(r.out.toUtf8()).object();
    QCOMPARE(j["n_layer_in"].toInt(), 5);
    QCOMPARE(j["n_layer_out"].toInt(), 4);
    const QJsonArray d = j["angular_distances"].toArray();
    QCOMPARE(d.size(), 5);
    int best = 0;
    for (int i = 1; i < d.size(); i++)
      if (d[i].toDouble() < d[best].toDouble()) best = i;
    QCOMPARE(j["prune"].toString(), QStringLiteral("layers:%1").arg(best));
    const Run g = cli({"generate", "-m", out, "-p", "Once upon a time", "-n", "8", "--temp", "0"});
    QCOMPARE(g.code, 0);
    const Run self = cli({"prune", "--force", stories(), stories(), "--prune", "layers:1"});
    expect_bad_input(self);
    QVERIFY2(self.err.contains("input file"), qPrintable(self.err));
    const Run again = cli({"prune", stories(), out, "--prune", "layers:2"});
    expect_bad_input(again);
    QVERIFY2(again.err.contains("--force"), qPrintable(again.err));
    const Run outside = cli({"prune", stories(), dir.filePath("x.gguf"), "--prune", "layers:4-5"});
    expect_bad_input(outside);
    QVERIFY2(outside.err.contains("not in the model"), qPrintable(outside.err));
    // FFN width pruning: 75% of stories260K's 172 neurons, rounded down to 32s.
    const QString ffn = dir.filePath("ffn.gguf");
    const Run w = cli({"prune", stories(), ffn, "--prune", "ffn:75%", "--json", "-t", "1"});
    QCOMPARE(w.code, 0);
    const QJsonObject wj = QJsonDocument::fromJson(w.out.toUtf8()).object();
    QCOMPARE(wj["n_ff_in"].toInt(), 172);
    QCOMPARE(wj["n_ff_out"].toInt(), 128);
    QCOMPARE(wj["prune"].toString(), QStringLiteral("ffn:75%"));
    QCOMPARE(cli({"generate", "-m", ffn, "-p", "Once upon a time", "-n", "8", "--temp", "0"}).code, 0);
    const Run ffn_again = cli({"prune", stories(), ffn, "--prune", "ffn:50%"});
    expect_bad_input(ffn_again);
    QVERIFY2(ffn_again.err.contains("--force"), qPrintable(ffn_again.err));
    expect_bad_input(cli({"prune", stories(), dir.filePath("y.gguf"), "--prune", "ffn:100%"}));
    // Self-speculation's layer list through generate.
    const Run skip = cli({"generate", "-m", stories(), "-p", "x", "-n", "2", "--spec", "self", "--spec-skip", "9"});
    expect_bad_input(skip);
    QVERIFY2(skip.err.contains("--spec-skip"), qPrintable(skip.err));
    const Run spec = cli({"generate", "-m", stories(), "-p", "Once upon a time", "-n", "16", "--temp", "0", "--spec",
                          "self", "--spec-skip", "1"});
    QCOMPARE(spec.code, 0);
    const Run plain = cli({"generate", "-m", stories(), "-p", "Once upon a time", "-n", "16", "--temp", "0"});
    QCOMPARE(spec.out, plain.out);
  }

  // A twin has the original's tensors (names, types, shapes) and metadata,
  // with random values: it runs the same work.
  // quantize never destroys its input and never replaces a file silently.
  void quantize_protects_its_input_and_existing_files() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.gguf");
    QVERIFY(QFile::copy(stories(), in));
    QVERIFY(QFile::link(in, dir.filePath("symlink.gguf")));
    QVERIFY(::link(in.toLocal8Bit().constData(), dir.filePath("hardlink.gguf").toLocal8Bit().constData()) == 0);
    auto hash = [](const QString& path) {
      QFile f(path);
      f.open(QIODevice::ReadOnly);
      return QCryptographicHash::hash(f.readAll(), QCryptographicHash::Sha256);
    };
    const QByteArray before = hash(in);
    for (const char* out : {"in.gguf", "symlink.gguf", "hardlink.gguf"}) {
      const Run r = cli({"quantize", "--force", in, dir.filePath(out), "Q8_0"});
      expect_bad_input(r);
      QVERIFY2(r.err.contains("input file"), qPrintable(r.err));
      QCOMPARE(hash(in), before);
    }
    const QString out = dir.filePath("out.gguf");
    QCOMPARE(cli({"quantize", in, out, "Q8_0"}).code, 0);
    const Run again = cli({"quantize", in, out, "Q4_0"});
    expect_bad_input(again);
    QVERIFY2(again.err.contains("--force"), qPrintable(again.err));
    const QByteArray q8 = hash(out);
    QCOMPARE(cli({"quantize", "--force", in, out, "Q4_0"}).code, 0);
    QVERIFY(hash(out) != q8);
    QCOMPARE(cli({"info", out}).code, 0);
    // Only the finished files: no partial file left beside them.
    QVERIFY2(QDir(dir.path()).entryList({"*partial*"}).isEmpty(), qPrintable(QDir(dir.path()).entryList().join(' ')));
  }

  void twin_has_the_originals_shapes() {
    const QString spec = QDir::temp().filePath("phaselab_twin_spec.gguf");
    const QString twin = QDir::temp().filePath("phaselab_twin.gguf");
    QCOMPARE(cli({"twin", "export", stories(), spec}).code, 0);
    QVERIFY(QFileInfo(spec).size() < QFileInfo(stories()).size());
    QCOMPARE(cli({"twin", "build", spec, twin}).code, 0);
    const auto a = QJsonDocument::fromJson(cli({"info", stories(), "--json"}).out.toUtf8()).object();
    const auto b = QJsonDocument::fromJson(cli({"info", twin, "--json"}).out.toUtf8()).object();
    QCOMPARE(b["hparams"], a["hparams"]);
    QCOMPARE(b["tensor_types"], a["tensor_types"]);
    QCOMPARE(b["n_params"], a["n_params"]);
    QCOMPARE(cli({"generate", "-m", twin, "-p", "Once upon a time", "-n", "8", "--temp", "0"}).code, 0);
    expect_bad_input(cli({"twin", "build", stories(), twin}));  // not a spec
  }

  void speculative_options_report_their_metrics() {
    const Run r = cli({"generate", "-m", stories(), "-p", "Once upon a time, there was a little girl named Lily. Once upon a time",
                       "-n", "24", "--temp", "0", "--spec", "lookup", "--spec-k", "3", "--json", "-q"});
    QCOMPARE(r.code, 0);
    const QJsonObject o = QJsonDocument::fromJson(r.out.toUtf8()).object();
    QCOMPARE(o["spec"].toString(), QString("lookup"));
    QVERIFY(o["spec_drafted"].toInt() > 0);
    QVERIFY(o.contains("spec_acceptance") && o.contains("tokens_per_pass") && o.contains("kv_blocks"));
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "x", "--spec", "draft"}));  // no --draft
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "x", "--spec", "maybe"}));
  }

  // Files where a text file is expected: refused at once, with the reason.
  void text_files_must_be_regular_files() {
    QTemporaryDir dir;
    const QString fifo = dir.filePath("fifo");
    QVERIFY(::mkfifo(fifo.toLocal8Bit().constData(), 0600) == 0);
    for (const QStringList& cmd : {QStringList{"generate", "-m", stories(), "-n", "4", "--file"},
                                   QStringList{"tokenize", "-m", stories(), "--file"}}) {
      for (const QString& path : {fifo, dir.path(), QString("/dev/zero")}) {
        const Run r = cli_within(cmd + QStringList{path}, 20000);
        QVERIFY2(r.code != -2, qPrintable(cmd[0] + " --file " + path + " hung"));
        expect_bad_input(r);
        QVERIFY2(r.err.contains(path), qPrintable(r.err));
      }
    }
    // Past the size cap: refused, not read into memory.
    const QString big = dir.filePath("big.txt");
    {
      QFile f(big);
      QVERIFY(f.open(QIODevice::WriteOnly));
      QVERIFY(f.resize(65ll << 20));
    }
    const Run r = cli_within({"tokenize", "-m", stories(), "--file", big}, 20000);
    expect_bad_input(r);
    QVERIFY2(r.err.contains("MiB"), qPrintable(r.err));
  }

  void ambiguous_or_wrapped_arguments_are_refused() {
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "Hi", "--seed", "-5", "-n", "2"}));
    expect_bad_input(cli({"generate", "-m", stories(), "-p", "Hi", "--seed", "18446744073709551616", "-n", "2"}));
    QTemporaryDir dir;
    QFile f(dir.filePath("p.txt"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("Once upon a time");
    f.close();
    const Run both = cli({"generate", "-m", stories(), "-p", "Hi", "--file", f.fileName(), "-n", "2"});
    expect_bad_input(both);
    QVERIFY2(both.err.contains("not both"), qPrintable(both.err));
    // More threads than the machine has: it runs, and says it will be slower.
    const Run many = cli({"generate", "-m", stories(), "-p", "Hi", "-n", "2", "--temp", "0", "-t", "256"});
    QCOMPARE(many.code, 0);
    QVERIFY2(many.err.contains("slower"), qPrintable(many.err));
  }

  // A piece can be a NUL byte (byte-fallback token <0x00>): it is printed,
  // and so is everything after it.
  void tokenize_pieces_survive_a_nul_byte() {
    QTemporaryDir dir;
    QFile f(dir.filePath("nul.txt"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QByteArray("a\0zebra", 7));
    f.close();
    QProcess p;
    p.start(PHASELAB_CLI_PATH, {"tokenize", "-m", stories(), "--pieces", "--no-bos", "--file", f.fileName()});
    QVERIFY(p.waitForFinished(30000));
    QCOMPARE(p.exitCode(), 0);
    const QByteArray out = p.readAllStandardOutput();
    QVERIFY2(out.contains('\0'), out.toHex().constData());
    QVERIFY2(out.indexOf("'z'") > out.indexOf('\0') && out.endsWith("'a'\n"), out.constData());
    QVERIFY(out.endsWith('\n'));
  }

  // A chat longer than the context keeps going: the oldest turns are
  // dropped (and it says so), instead of every turn failing.
  void chat_drops_old_turns_to_fit_the_context() {
    QByteArray turns;
    for (int i = 0; i < 8; i++) turns += "Tell me a long story about a cat and a dog\n";
    // stories260K has no chat template: its turns follow the few-shot
    // preamble (~290 of its tokens), which every prompt keeps.
    const Run r = cli_within({"chat", "-m", stories(), "-c", "384", "-n", "12", "--temp", "0"}, 120000, turns);
    QCOMPARE(r.code, 0);
    QVERIFY2(!r.err.contains("error"), qPrintable(r.err));
    QVERIFY2(r.err.contains("dropped") && r.err.contains("/reset"), qPrintable(r.err));
    QCOMPARE(r.err.count("decode"), 8);  // every turn answered (one metrics line each)
  }

  void chat_runs_turns_from_stdin() {
    const Run r = cli({"chat", "-m", stories(), "--temp", "0", "-n", "12"}, "Once upon a time\nThe end\n/quit\n");
    QCOMPARE(r.code, 0);
    QCOMPARE(r.err.count("decode"), 2);  // one stats line per answer
    QVERIFY(r.err.contains("reused"));
  }

  // On the CPU, bench measures the machine first and shows decode against the
  // read bandwidth, prefill against the int8 peak; --no-peaks skips that.
  void bench_shows_phases_against_the_machine_peaks() {
    const Run b = cli({"bench", "-m", stories(), "-p", "32", "-n", "8", "-r", "1", "--json"});
    QCOMPARE(b.code, 0);
    const QJsonArray arr = QJsonDocument::fromJson(b.out.toUtf8()).array();
    QCOMPARE(arr.size(), 2);
    for (const auto& v : arr) {
      const QJsonObject o = v.toObject();
      QVERIFY2(o["machine_read_gbps"].toDouble() > 1, qPrintable(b.out));
      QVERIFY(o["machine_int8_gops"].toDouble() > 0);
      // The peaks are probed before and after the tests (the better of
      // each figure is divided by; whether the two differ is said).
      QVERIFY2(o["machine_peaks_changed"].isBool() && o["placement_changed"].isBool(), qPrintable(b.out));
      const bool decode = o["n_gen"].toInt() > 0;
      QVERIFY2((o["decode_bandwidth_fraction"].toDouble() > 0) == decode, qPrintable(b.out));
      QVERIFY2((o["prefill_compute_fraction"].toDouble() > 0) == !decode, qPrintable(b.out));
    }
    const Run t = cli({"bench", "-m", stories(), "-p", "32", "-n", "8", "-r", "1"});
    QCOMPARE(t.code, 0);
    // Decode against the read bandwidth; prefill against the int8 peak, or,
    // where 32 tokens per pass are below this machine's balance point (a CPU
    // with a high int8 peak for its bandwidth, e.g. Zen 5 with AVX-512 VNNI),
    // as memory-bound with the pass size where it turns compute-bound.
    QVERIFY2(t.out.contains("tg8: ") && t.out.contains("of the machine's read bandwidth"), qPrintable(t.out));
    QVERIFY2(t.out.contains("of the machine's int8 peak") ||
                 (t.out.contains("pp32: memory-bound") && t.out.contains("compute-bound from ~")),
             qPrintable(t.out));
    // With two threads or more: where their cores are, before and after the
    // tests (a figure each, or "not measured" when the probe's second thread
    // did not come), in the table's notes and in the JSON (-1: none).
    const Run two = cli({"bench", "-m", stories(), "-p", "16", "-n", "4", "-r", "1", "-t", "2", "--no-peaks"});
    QCOMPARE(two.code, 0);
    static const QRegularExpression trips(
        "threads: a cache line between the first two CPUs this process may use and back took (\\d+ ns|\\(not "
        "measured\\)) before the tests, (\\d+ ns|\\(not measured\\)) after");
    QVERIFY2(trips.match(two.out).hasMatch(), qPrintable(two.out));
    const Run one = cli({"bench", "-m", stories(), "-p", "16", "-n", "4", "-r", "1", "-t", "1", "--no-peaks", "--json"});
    QCOMPARE(one.code, 0);
    const QJsonObject o1 = QJsonDocument::fromJson(one.out.toUtf8()).array().first().toObject();
    QCOMPARE(o1["core_round_trip_ns_before"].toDouble(), -1.0);  // one thread: nothing between threads
    const Run n = cli({"bench", "-m", stories(), "-p", "0", "-n", "8", "-r", "1", "--no-peaks", "--json"});
    QCOMPARE(n.code, 0);
    const QJsonObject o = QJsonDocument::fromJson(n.out.toUtf8()).array().first().toObject();
    QCOMPARE(o["machine_read_gbps"].toDouble(), 0.0);
    QCOMPARE(o["decode_bandwidth_fraction"].toDouble(), 0.0);
  }

  // --cache-type: F16 (default) and BF16 take half the memory of F32; an
  // unknown type is refused.
  void cache_types_are_chosen_and_reported() {
    QMap<QString, double> mib;
    for (const char* t : {"f16", "bf16", "f32"}) {
      const Run b = cli({"bench", "-m", stories(), "-p", "8", "-n", "4", "-r", "1", "--no-peaks", "--json", "--cache-type", t});
      QCOMPARE(b.code, 0);
      const QJsonObject o = QJsonDocument::fromJson(b.out.toUtf8()).array().first().toObject();
      QCOMPARE(o["kv_type"].toString(), QString(t));
      mib[t] = o["kv_cache_mib"].toDouble();
    }
    QVERIFY(mib["f16"] > 0);
    QCOMPARE(mib["bf16"], mib["f16"]);
    QCOMPARE(mib["f32"], 2 * mib["f16"]);
    const Run g = cli({"generate", "-m", stories(), "-p", "Once upon a time", "-n", "8", "--temp", "0", "--cache-type", "bf16"});
    QCOMPARE(g.code, 0);
    expect_bad_input(cli({"bench", "-m", stories(), "--cache-type", "q4"}));
    // Q8_0 needs heads of whole 32-value blocks; stories260K's have 8 values.
    const Run q8 = cli({"bench", "-m", stories(), "-p", "8", "-n", "4", "--cache-type", "q8_0"});
    expect_bad_input(q8);
    QVERIFY2(q8.err.contains("--cache-type f16"), qPrintable(q8.err));
  }

  // bench --ab: each test twice, one row per state, measured alternating,
  // and a line with their ratio; a switch it does not know is bad input.
  void bench_ab_measures_a_switch_in_two_states() {
    const Run b = cli({"bench", "-m", stories(), "-p", "16", "-n", "8", "-r", "2", "--no-peaks", "--ab", "decode-rows", "--json"});
    QCOMPARE(b.code, 0);
    const QJsonArray arr = QJsonDocument::fromJson(b.out.toUtf8()).array();
    QCOMPARE(arr.size(), 4);
    QStringList tests, states;
    for (const auto& v : arr) {
      tests << v.toObject()["test"].toString();
      states << v.toObject()["ab_state"].toString();
      QCOMPARE(v.toObject()["samples"].toArray().size(), 2);
    }
    QCOMPARE(tests, (QStringList{"pp16 [decode rows off]", "pp16 [decode rows on]", "tg8 [decode rows off]", "tg8 [decode rows on]"}));
    QCOMPARE(states, (QStringList{"decode rows off", "decode rows on", "decode rows off", "decode rows on"}));
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.remove("PHASELAB_CPU_PREFETCH_BYTES");  // state a: this CPU's default distance
    env.remove("PHASELAB_CPU_PREFETCH_L2");     // and hint (the switches line)
    const Run t = cli({"bench", "-m", stories(), "-p", "0", "-n", "8", "-r", "2", "--no-peaks", "--ab", "prefetch=16384"}, {}, env);
    QCOMPARE(t.code, 0);
    const QString a = QString("prefetch %1").arg(phaselab::default_decode_prefetch_bytes());
    QVERIFY2(t.out.contains("A/B tg8: prefetch 16384 / " + a + " = ") && t.out.contains("alternating token by token"),
             qPrintable(t.out));
    const QString hint = phaselab::default_decode_prefetch_l2() ? "into L2" : "non-temporal";
    QVERIFY2(t.out.contains("decode prefetch " + QString::number(phaselab::default_decode_prefetch_bytes()) +
                            " bytes ahead " + hint),
             qPrintable(t.out));
    const Run h = cli({"bench", "-m", stories(), "-p", "0", "-n", "8", "-r", "2", "--no-peaks", "--ab", "prefetch-l2"}, {}, env);
    QCOMPARE(h.code, 0);
    QVERIFY2(h.out.contains("A/B tg8: prefetch into L2 / prefetch non-temporal = "), qPrintable(h.out));
    env.remove("PHASELAB_CPU_STREAM_PREFETCH_BYTES");
    env.remove("PHASELAB_CPU_STREAM_WAYS");    // the switches line checked below
    env.remove("PHASELAB_CPU_STREAM_CHUNKS");  // (and state a of the runs after)
    const Run s = cli({"bench", "-m", stories(), "-p", "0", "-n", "8", "-r", "2", "--no-peaks", "--ab", "stream-prefetch=2048"}, {}, env);
    QCOMPARE(s.code, 0);
    const QString sa = QString("stream prefetch %1").arg(phaselab::default_stream_prefetch_bytes());
    QVERIFY2(s.out.contains("A/B tg8: stream prefetch 2048 / " + sa + " = "), qPrintable(s.out));
    const QString ways = QString::number(phaselab::default_stream_ways());
    QVERIFY2(s.out.contains("(over 16 MiB: " + QString::number(phaselab::default_stream_prefetch_bytes()) + ", in " +
                            ways + (ways == "1" ? " way, " : " ways, ") + "8 chunks a thread)") &&
                 s.out.contains("_STREAM_WAYS, _STREAM_CHUNKS, _ROW_TILES"),
             qPrintable(s.out));
    const Run c = cli({"bench", "-m", stories(), "-p", "0", "-n", "8", "-r", "2", "--no-peaks", "--ab", "stream-chunks=1"}, {}, env);
    QCOMPARE(c.code, 0);
    QVERIFY2(c.out.contains("A/B tg8: stream chunks 1 / stream chunks 8 = "), qPrintable(c.out));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "stream-chunks=0"}));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "stream-chunks=65"}));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "stream-chunks=many"}));
    const Run w = cli({"bench", "-m", stories(), "-p", "0", "-n", "8", "-r", "2", "--no-peaks", "--ab", "stream-ways=3"}, {}, env);
    QCOMPARE(w.code, 0);
    QVERIFY2(w.out.contains("A/B tg8: stream ways 3 / stream ways " + ways + " = "), qPrintable(w.out));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "stream-ways=0"}));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "stream-ways=9"}));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "stream-ways=four"}));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "turbo"}));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "prefetch=-4"}));
    expect_bad_input(cli({"bench", "-m", stories(), "--ab", "stream-prefetch=2MiB"}));
  }

  // bench -d: every test again after D tokens already in the cache, named
  // as llama-bench names them; the K/V a decoded token reads grows with D.
  void bench_depth_runs_each_test_after_a_filled_cache() {
    const Run b = cli({"bench", "-m", stories(), "-d", "0,40", "-p", "16", "-n", "8", "-r", "1", "--no-peaks", "--json"});
    QCOMPARE(b.code, 0);
    const QJsonArray arr = QJsonDocument::fromJson(b.out.toUtf8()).array();
    QStringList seen;
    double kv_at[2] = {0, 0};
    for (const auto& v : arr) {
      const QJsonObject o = v.toObject();
      seen << o["test"].toString();
      QVERIFY(o["tokens_per_s"].toDouble() > 0);
      if (o["n_gen"].toInt() > 0) kv_at[o["n_depth"].toInt() == 40] = o["kv_read_gb_per_token"].toDouble();
    }
    QCOMPARE(seen, QStringList({"pp16", "tg8", "pp16 @ d40", "tg8 @ d40"}));
    QVERIFY2(kv_at[0] > 0 && kv_at[1] > 4 * kv_at[0], qPrintable(b.out));
    const Run t = cli({"bench", "-m", stories(), "-d", "40", "-p", "0", "-n", "4", "-r", "1", "--no-peaks"});
    QCOMPARE(t.code, 0);
    QVERIFY2(t.out.contains("tg4 @ d40") && t.out.contains("weights and K/V"), qPrintable(t.out));
    expect_bad_input(cli({"bench", "-m", stories(), "-d", "x"}));
    expect_bad_input(cli({"bench", "-m", stories(), "-d", "-5"}));
  }

  void devices_lists_cores_cache_and_measured_peaks() {
    const Run d = cli({"devices", "--measure", "--json"});
    QCOMPARE(d.code, 0);
    const QJsonObject cpu = QJsonDocument::fromJson(d.out.toUtf8()).object()["cpu"].toObject();
    QVERIFY(cpu["physical_cores"].toInt() >= 1);
    QCOMPARE(cpu["default_threads"].toInt(), cpu["physical_cores"].toInt());
    QVERIFY2(cpu["peaks"].toObject()["read_gbps"].toDouble() > 1, qPrintable(d.out));
    const Run t = cli({"devices"});
    QCOMPARE(t.code, 0);
    QVERIFY2(t.out.contains("physical cores"), qPrintable(t.out));
  }

  // bench --batch: a pp and a tg row per batch size, aggregate tokens/s and
  // per-sequence TPOT.
  void bench_batch_has_a_row_per_batch_size() {
    const Run b = cli({"bench", "-m", stories(), "--batch", "1,4", "-p", "16", "-n", "8", "--no-peaks", "--json"});
    QCOMPARE(b.code, 0);
    const QJsonArray arr = QJsonDocument::fromJson(b.out.toUtf8()).array();
    QCOMPARE(arr.size(), 4);
    QStringList seen;
    for (const auto& v : arr) {
      const QJsonObject o = v.toObject();
      seen << QString("%1@%2").arg(o["test"].toString()).arg(o["batch"].toInt());
      QVERIFY(o["tokens_per_s"].toDouble() > 0);
      QVERIFY(o["batched_forward"].toBool());
      if (o["test"].toString().startsWith("tg")) QVERIFY(o["tpot_ms"].toDouble() > 0);
      // The machine around the sweep, as bench's rows say it (BenchProbes).
      QVERIFY2(o["placement_changed"].isBool() && o["machine_peaks_changed"].isBool() &&
                   o["core_round_trip_ns_before"].isDouble() && o["core_round_trip_ns_after"].isDouble(),
               qPrintable(b.out));
    }
    QCOMPARE(seen, QStringList({"pp16@1", "tg8@1", "pp16@4", "tg8@4"}));
    const Run t = cli({"bench", "-m", stories(), "--batch", "2", "-p", "8", "-n", "4", "--no-peaks"});
    QCOMPARE(t.code, 0);
    QVERIFY2(t.out.contains("| 2 |"), qPrintable(t.out));
    expect_bad_input(cli({"bench", "-m", stories(), "--batch", "1,x"}));
    expect_bad_input(cli({"bench", "-m", stories(), "--batch", "128", "-b", "64"}));
  }

  // batch: JSONL in, JSONL out, one record per line in the order they
  // finish; each greedy text is what generate gives alone; a bad line is
  // reported by number and the rest run; -o - gives the same records.
  void batch_answers_every_jsonl_line_by_index() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.jsonl"), out = dir.filePath("out.jsonl");
    const QStringList prompts = {"Once upon a time", "The cat", "Lily wanted to", "One day, a big"};
    QByteArray lines;
    for (int i = 0; i < prompts.size(); i++)
      lines += QJsonDocument(QJsonObject{{"prompt", prompts[i]}, {"n", 6 + 3 * i}}).toJson(QJsonDocument::Compact) + "\n";
    lines += "{\"prompt\": 5}\n";
    write_file(in, lines);
    const Run r = cli({"batch", "-m", stories(), "-i", in, "-o", out, "--temp", "0", "--parallel", "3", "--ignore-eos"});
    QCOMPARE(r.code, 2);  // one bad line
    QVERIFY2(r.err.contains("line 5") && r.err.contains("'prompt' must be a string"), qPrintable(r.err));
    QString problem;
    const QMap<int, QJsonObject> got = records_by_index(read_file(out), &problem);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QCOMPARE(got.keys(), QList<int>({0, 1, 2, 3, 4}));
    for (int i = 0; i < prompts.size(); i++) {
      const QJsonObject o = got[i];
      QCOMPARE(o["tokens"].toInt(), 6 + 3 * i);
      QCOMPARE(o["stop_reason"].toString(), QString("length"));
      QVERIFY(o["ttft_ms"].toDouble() > 0 && o["prompt_tokens"].toInt() > 0);
      const Run g = cli({"generate", "-m", stories(), "-p", prompts[i], "-n", QString::number(6 + 3 * i), "--temp", "0",
                         "--ignore-eos", "--json", "-q"});
      QCOMPARE(g.code, 0);
      QCOMPARE(o["text"].toString(), QJsonDocument::fromJson(g.out.toUtf8()).object()["text"].toString());
    }
    QVERIFY(got[4]["error"].toString().contains("must be a string"));
    QCOMPARE(got[4]["line"].toInt(), 5);
    const Run s = cli({"batch", "-m", stories(), "-i", in, "-o", "-", "--temp", "0", "--parallel", "3", "--ignore-eos"});
    QCOMPARE(s.code, 2);
    const QMap<int, QJsonObject> piped = records_by_index(s.out.toUtf8(), &problem);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QCOMPARE(piped.keys(), got.keys());
    for (int i = 0; i < prompts.size(); i++) QCOMPARE(piped[i]["text"], got[i]["text"]);
    expect_bad_input(cli({"batch", "-m", stories(), "-i", in}));
    expect_bad_input(cli({"batch", "-m", stories(), "-i", dir.filePath("missing.jsonl"), "-o", dir.filePath("o2.jsonl")}));
    expect_bad_input(cli({"batch", "-m", stories(), "-i", in, "-o", "-", "--resume"}));
    expect_bad_input(cli({"batch", "-m", stories(), "-i", in, "-o", out, "--resume", "--force"}));
  }

  // -o naming the input, by its path, a symlink or a hard link, would replace
  // the prompts with their answers: refused, the input left as it was.
  void batch_refuses_output_equal_to_input() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.jsonl");
    const QByteArray prompts = story_lines(3, 4, 3);
    write_file(in, prompts);
    QVERIFY(QFile::link(in, dir.filePath("symlink.jsonl")));
    QCOMPARE(::link(QFile::encodeName(in).constData(), QFile::encodeName(dir.filePath("hardlink.jsonl")).constData()), 0);
    for (const QString& out : {in, dir.filePath("symlink.jsonl"), dir.filePath("hardlink.jsonl"),
                               dir.filePath("./in.jsonl")})
      for (const QStringList& flags : {QStringList(), QStringList("--force"), QStringList("--resume")}) {
        const Run r = cli(QStringList({"batch", "-m", stories(), "-i", in, "-o", out, "--temp", "0"}) << flags);
        expect_bad_input(r);
        QVERIFY2(r.err.contains("input file itself"), qPrintable(r.err));
        QCOMPARE(read_file(in), prompts);
      }
  }

  // Without --resume or --force an output that holds something is kept: the
  // message names both ways on; --force then overwrites it.
  void batch_refuses_an_existing_output_without_resume_or_force() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.jsonl"), out = dir.filePath("out.jsonl");
    write_file(in, story_lines(3, 4, 3));
    write_file(out, "results of last week\n");
    const Run r = cli({"batch", "-m", stories(), "-i", in, "-o", out, "--temp", "0"});
    expect_bad_input(r);
    QVERIFY2(r.err.contains("--resume") && r.err.contains("--force"), qPrintable(r.err));
    QCOMPARE(read_file(out), QByteArray("results of last week\n"));
    const Run f = cli({"batch", "-m", stories(), "-i", in, "-o", out, "--temp", "0", "--force"});
    QCOMPARE(f.code, 0);
    QString problem;
    QCOMPARE(records_by_index(read_file(out), &problem).keys(), QList<int>({0, 1, 2}));
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    write_file(out, "");  // an empty output is a new one
    QCOMPARE(cli({"batch", "-m", stories(), "-i", in, "-o", out, "--temp", "0"}).code, 0);
  }

  // A run killed while writing leaves whole lines and perhaps a torn one:
  // --resume keeps the whole ones byte for byte, cuts the torn one off and
  // runs only what is missing; the texts are a clean run's.
  void batch_resume_keeps_finished_lines_and_drops_a_torn_one() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.jsonl"), clean = dir.filePath("clean.jsonl"), out = dir.filePath("out.jsonl");
    write_file(in, story_lines(8, 6, 9));
    const QStringList common = {"batch", "-m", stories(), "-i", in, "--temp", "0", "--ignore-eos", "--parallel", "3"};
    QCOMPARE(cli(QStringList(common) << "-o" << clean).code, 0);
    QString problem;
    const QMap<int, QJsonObject> want = records_by_index(read_file(clean), &problem);
    QCOMPARE(want.size(), 8);
    QByteArray kept;
    QByteArray torn;
    for (const QByteArray& line : read_file(clean).split('\n')) {
      if (line.isEmpty()) continue;
      const int index = QJsonDocument::fromJson(line).object()["index"].toInt();
      if (index == 1 || index == 4 || index == 5) kept += line + "\n";
      if (index == 6) torn = line.left(line.size() / 2);
    }
    write_file(out, kept + torn);
    const Run r = cli(QStringList(common) << "-o" << out << "--resume");
    QCOMPARE(r.code, 0);
    QVERIFY2(r.err.contains("torn") && r.err.contains("3 of 8"), qPrintable(r.err));
    const QByteArray after = read_file(out);
    QVERIFY(after.startsWith(kept));
    const QMap<int, QJsonObject> got = records_by_index(after, &problem);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QCOMPARE(got.keys(), want.keys());
    for (int i = 0; i < 8; i++) QCOMPARE(got[i]["text"], want[i]["text"]);
    // Nothing missing: nothing runs, nothing changes.
    QCOMPARE(cli(QStringList(common) << "-o" << out << "--resume").code, 0);
    QCOMPARE(read_file(out), after);
  }

  // An output whose records answer other lines (another input, an edited
  // one, or a file from before records carried the line's hash) is not
  // resumed: refused, and left as it was.
  void batch_resume_refuses_output_of_another_input() {
    QTemporaryDir dir;
    const QString a = dir.filePath("a.jsonl"), b = dir.filePath("b.jsonl"), out = dir.filePath("out.jsonl");
    const QByteArray lines = story_lines(4, 4, 3);
    write_file(a, lines);
    QByteArray edited = lines;
    edited.replace("The cat", "The dog");
    write_file(b, edited);
    QCOMPARE(cli({"batch", "-m", stories(), "-i", a, "-o", out, "--temp", "0"}).code, 0);
    const QByteArray answers = read_file(out);
    const Run r = cli({"batch", "-m", stories(), "-i", b, "-o", out, "--temp", "0", "--resume"});
    expect_bad_input(r);
    QVERIFY2(r.err.contains("another input") && r.err.contains("--force"), qPrintable(r.err));
    QCOMPARE(read_file(out), answers);
    write_file(b, story_lines(2, 4, 3));  // fewer lines: index 3 answers nothing
    const Run fewer = cli({"batch", "-m", stories(), "-i", b, "-o", out, "--temp", "0", "--resume"});
    expect_bad_input(fewer);
    QVERIFY2(fewer.err.contains("another input"), qPrintable(fewer.err));
    QCOMPARE(read_file(out), answers);
    const QByteArray old_style = "{\"index\":0,\"text\":\" there was\"}\n";
    write_file(out, old_style);
    const Run old = cli({"batch", "-m", stories(), "-i", a, "-o", out, "--temp", "0", "--resume"});
    expect_bad_input(old);
    QCOMPARE(read_file(out), old_style);
  }

  // A second run on one output would interleave with the first: while
  // another process holds the lock, batch refuses and writes nothing.
  void batch_locks_its_output() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.jsonl"), out = dir.filePath("out.jsonl");
    write_file(in, story_lines(3, 4, 3));
    const int fd = ::open(QFile::encodeName(out).constData(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    QVERIFY(fd >= 0);
    QCOMPARE(::flock(fd, LOCK_EX | LOCK_NB), 0);
    for (const QString& flag : {QString("--resume"), QString("--force")}) {
      const Run r = cli({"batch", "-m", stories(), "-i", in, "-o", out, "--temp", "0", flag});
      QVERIFY2(r.code != 0 && r.err.contains("locked"), qPrintable(r.err));
      QCOMPARE(read_file(out), QByteArray());
    }
    ::close(fd);
    QCOMPARE(cli({"batch", "-m", stories(), "-i", in, "-o", out, "--temp", "0", "--resume"}).code, 0);
  }

  // SIGKILL at any moment, then --resume (killed too, sometimes) until a run
  // finishes: every prompt answered exactly once, by a clean run's text.
  // The kill delays are drawn (seeded) over a clean run's duration, so that
  // they land at start-up, mid-run and after the end on any machine.
  void batch_killed_and_resumed_answers_every_prompt_once() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.jsonl"), clean = dir.filePath("clean.jsonl");
    write_file(in, story_lines(40, 100, 300));
    const QStringList common = {"batch", "-m", stories(), "-i", in, "--temp", "0", "--ignore-eos", "--parallel", "4",
                                "-t", "1"};
    QElapsedTimer timer;
    timer.start();
    QCOMPARE(cli(QStringList(common) << "-o" << clean).code, 0);
    const qint64 clean_ms = std::max<qint64>(timer.elapsed(), 20);
    QString problem;
    const QMap<int, QJsonObject> want = records_by_index(read_file(clean), &problem);
    QCOMPARE(want.size(), 40);
    std::mt19937 rng(20261204);
    std::uniform_real_distribution<double> fraction(0.0, 1.1);
    int interrupted = 0;  // trials whose first kill left some lines but not all
    for (int trial = 0; trial < 20; trial++) {
      const QString out = dir.filePath(QString("out%1.jsonl").arg(trial));
      const int kills = 1 + trial % 3;
      for (int k = 0; k < kills; k++) {
        QProcess p;
        p.start(PHASELAB_CLI_PATH, QStringList(common) << "-o" << out << "--resume");
        QVERIFY(p.waitForStarted());
        QTest::qWait(static_cast<int>(fraction(rng) * clean_ms));
        p.kill();
        p.waitForFinished(60000);  // false when it had finished already
        QCOMPARE(p.state(), QProcess::NotRunning);
        if (k == 0) {
          QString ignored;  // a killed run's output is checked once resumed
          const int n = records_by_index(read_file(out), &ignored).size();
          if (n > 0 && n < 40) interrupted++;
        }
      }
      const Run r = cli(QStringList(common) << "-o" << out << "--resume");
      QVERIFY2(r.code == 0, qPrintable(QString("trial %1: %2").arg(trial).arg(r.err)));
      const QMap<int, QJsonObject> got = records_by_index(read_file(out), &problem);
      QVERIFY2(problem.isEmpty(), qPrintable(QString("trial %1: %2").arg(trial).arg(problem)));
      QCOMPARE(got.keys(), want.keys());
      for (int i = 0; i < 40; i++) QCOMPARE(got[i]["text"], want[i]["text"]);
    }
    qInfo("%d of 20 first kills landed mid-run (clean run: %lld ms)", interrupted, static_cast<long long>(clean_ms));
    QVERIFY2(interrupted >= 3, qPrintable(QString("only %1 of 20 kills landed mid-run").arg(interrupted)));
  }

  // A full disk: the write fails, the output keeps its whole lines only (cut
  // back to before the failed one), exit 1 with what to do; --resume then
  // completes it. RLIMIT_FSIZE stands in for the disk (batch ignores the
  // SIGXFSZ that would kill it), /dev/full for a device.
  void batch_reports_a_full_disk_and_keeps_whole_lines() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.jsonl"), out = dir.filePath("out.jsonl");
    write_file(in, story_lines(12, 20, 10));
    const QStringList common = {"batch", "-m", stories(), "-i", in, "--temp", "0", "--ignore-eos", "--parallel", "2"};
    constexpr rlim_t kLimit = 700;  // a few of the ~12 lines of 200-300 bytes
    QProcess p;
    p.setChildProcessModifier([] {
      const rlimit lim{kLimit, kLimit};
      ::setrlimit(RLIMIT_FSIZE, &lim);
    });
    p.start(PHASELAB_CLI_PATH, QStringList(common) << "-o" << out);
    QVERIFY(p.waitForFinished(60000));
    const QString err = QString::fromUtf8(p.readAllStandardError());
    QCOMPARE(p.exitStatus(), QProcess::NormalExit);
    QCOMPARE(p.exitCode(), 1);
    QVERIFY2(err.contains("disk space") && err.contains("--resume"), qPrintable(err));
    const QByteArray partial = read_file(out);
    QVERIFY(partial.size() <= static_cast<qint64>(kLimit) && partial.endsWith('\n'));
    QString problem;
    const int n_partial = records_by_index(partial, &problem).size();
    QVERIFY2(problem.isEmpty() && n_partial >= 1 && n_partial < 12, qPrintable(problem));
    const Run r = cli(QStringList(common) << "-o" << out << "--resume");
    QCOMPARE(r.code, 0);
    QVERIFY(read_file(out).startsWith(partial));
    QCOMPARE(records_by_index(read_file(out), &problem).size(), 12);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));

    const Run full = cli(QStringList(common) << "-o" << "/dev/full");
    QCOMPARE(full.code, 1);
    QVERIFY2(full.err.contains("disk space"), qPrintable(full.err));
  }

  // batch reads each line with the server's parser: what the server refuses
  // (an empty stop string, temperature above 2, a field it does not read)
  // is refused by name; "n" stays batch's token limit, for text and chats.
  void batch_checks_lines_as_the_server_does() {
    QTemporaryDir dir;
    const QString in = dir.filePath("in.jsonl"), out = dir.filePath("out.jsonl");
    {
      QFile f(in);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(R"({"prompt": "Once", "stop": ""})" "\n"
              R"({"prompt": "Once", "temperature": 3})" "\n"
              R"({"prompt": "Once", "frobnicate": 1})" "\n"
              R"({"prompt": "Once", "n": 3, "seed": 1})" "\n"
              R"({"messages": [{"role": "user", "content": "hi"}], "n": 2})" "\n");
    }
    const Run r = cli({"batch", "-m", stories(), "-i", in, "-o", out, "--ignore-eos"});
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("line 1: 'stop'"), qPrintable(r.err));
    QVERIFY2(r.err.contains("line 2: 'temperature'"), qPrintable(r.err));
    QVERIFY2(r.err.contains("line 3: 'frobnicate'"), qPrintable(r.err));
    // (Records come in the order the answers end: found by index.)
    QString problem;
    const QMap<int, QJsonObject> got = records_by_index(read_file(out), &problem);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QCOMPARE(got.keys(), QList<int>({0, 1, 2, 3, 4}));
    QCOMPARE(got[3]["tokens"].toInt(), 3);
    QCOMPARE(got[4]["tokens"].toInt(), 2);
  }

  // bench --serving: one JSON object with a row per run (the baseline first),
  // progress lines on stderr ending with {"done": true}; every request ok.
  void bench_serving_json_has_the_rows() {
    const Run r = cli({"bench", "--serving", "-m", stories(), "-t", "1", "--streams", "2", "--chat-prompt", "8",
                       "--chat-answer", "8", "--long-prompt", "100", "--long-answer", "4", "--long-start", "0.01",
                       "--policy", "prefill-first,chunked:32", "--json", "--progress-json"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QJsonObject j = QJsonDocument::fromJson(r.out.toUtf8()).object();
    QCOMPARE(j["workload"].toObject()["streams"].toInt(), 2);
    const QJsonArray rows = j["rows"].toArray();
    QCOMPARE(rows.size(), 3);
    QVERIFY(rows[0].toObject()["label"].toString().startsWith("baseline"));
    QCOMPARE(rows[1].toObject()["policy"].toString(), QString("prefill-first"));
    QCOMPARE(rows[2].toObject()["policy"].toString(), QString("chunked:32"));
    for (const auto& row : rows) {
      const QJsonObject o = row.toObject();
      QVERIFY(o["requests"].toInt() >= 2);
      QCOMPARE(o["ok"].toInt(), o["requests"].toInt());
      QCOMPARE(o["timeline"].toArray().size(), o["requests"].toInt());
    }
    const QStringList lines = r.err.trimmed().split('\n');
    QVERIFY(lines.size() >= 2);
    QCOMPARE(QJsonDocument::fromJson(lines.last().toUtf8()).object()["done"].toBool(), true);
    QCOMPARE(QJsonDocument::fromJson(lines.first().toUtf8()).object()["progress"].toObject()["of"].toInt(), 3);
    // Without --json: the table, one line per run.
    const Run t = cli({"bench", "--serving", "-m", stories(), "-t", "1", "--streams", "1", "--chat-answer", "4",
                       "--long-prompt", "50", "--long-answer", "2", "--long-start", "0", "--policy", "chunked:16",
                       "--no-baseline"});
    QVERIFY2(t.code == 0, qPrintable(t.err));
    QVERIFY2(t.out.contains("| chunked:16 |") && t.out.contains("machine:"), qPrintable(t.out));
    // Bad input: a one-line error, exit code 2.
    expect_bad_input(cli({"bench", "--serving", "-m", stories(), "--policy", "fastest"}));
    expect_bad_input(cli({"bench", "--serving", "-m", stories(), "--streams", "0", "--long-count", "0"}));
    const Run pj = cli({"bench", "--serving", "-m", stories(), "--long-rate", "-1", "--progress-json"});
    QCOMPARE(pj.code, 2);
    QVERIFY2(QJsonDocument::fromJson(pj.err.split('\n').first().toUtf8()).object().contains("error"), qPrintable(pj.err));
  }

  // serve --policy names its policy; bench --serving --url sends the same
  // workload to it (a PhaseLab server on a free port).
  void bench_serving_against_serve_with_a_policy() {
    QProcess srv;
    const QString url = start_server(srv, {"--policy", "disaggregated:1+1"});
    QVERIFY2(url.startsWith("http://127.0.0.1:"), qPrintable(url));
    const Run r = cli({"bench", "--serving", "--url", url, "-m", stories(), "--streams", "2", "--chat-prompt", "8",
                       "--chat-answer", "8", "--long-prompt", "100", "--long-answer", "4", "--long-start", "0.01",
                       "--json"});
    srv.terminate();
    QVERIFY(srv.waitForFinished(30000));
    const QString banner = QString::fromUtf8(srv.readAllStandardError());
    QVERIFY2(banner.contains("policy disaggregated:1+1"), qPrintable(banner));
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QJsonArray rows = QJsonDocument::fromJson(r.out.toUtf8()).object()["rows"].toArray();
    QCOMPARE(rows.size(), 2);  // the baseline and the URL
    QCOMPARE(rows[1].toObject()["target"].toString(), url);
    for (const auto& row : rows) {
      const QJsonObject o = row.toObject();
      QVERIFY(o["requests"].toInt() >= 2);
      QCOMPARE(o["ok"].toInt(), o["requests"].toInt());
      QCOMPARE(o["tokens"].toInt(), [&] {  // every answer whole: ignore_eos reached the server
        int n = 0;
        for (const auto& e : o["timeline"].toArray())
          n += e.toObject()["kind"].toString() == "chat" ? 8 : 4;
        return n;
      }());
    }
  }

  // loadtest samples as an OpenAI client when asked (temperature, top_p),
  // every answer max_tokens long with --ignore-eos; bad values are refused
  // before any connection.
  void loadtest_samples_and_runs_every_answer_to_its_length() {
    expect_bad_input(cli({"loadtest", "--url", "http://127.0.0.1:1/v1", "--temperature", "3"}));
    expect_bad_input(cli({"loadtest", "--url", "http://127.0.0.1:1/v1", "--temperature", "1", "--top-p", "1.5"}));
    expect_bad_input(cli({"loadtest", "--url", "http://127.0.0.1:1/v1", "--temperature", "1", "--top-p", "0"}));
    expect_bad_input(cli({"loadtest", "--url", "http://127.0.0.1:1/v1", "--top-p", "0.9"}));  // greedy would ignore it
    QProcess srv;
    const QString url = start_server(srv);
    QVERIFY2(url.startsWith("http://127.0.0.1:"), qPrintable(url));
    const Run r = cli({"loadtest", "--url", url, "--completions", "--clients", "3", "--requests", "2", "-n", "12",
                       "--ignore-eos", "--temperature", "1", "--top-p", "0.95", "--json"});
    srv.terminate();
    QVERIFY(srv.waitForFinished(30000));
    QVERIFY2(r.code == 0, qPrintable(r.err + r.out));
    const QJsonObject o = QJsonDocument::fromJson(r.out.toUtf8()).object();
    QCOMPARE(o["ok"].toInt(), 6);
    QCOMPARE(o["errors"].toInt(), 0);
    QCOMPARE(o["generated_tokens"].toInt(), 6 * 12);
    QCOMPARE(o["temperature"].toDouble(), 1.0);
    QCOMPARE(o["top_p"].toDouble(), 0.95);
    QVERIFY(o["ignore_eos"].toBool());
  }
};

QTEST_GUILESS_MAIN(TestCli)
#include "test_cli.moc"
