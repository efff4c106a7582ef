#include "gui_options.h"

#include <QCommandLineParser>
#include <QUrl>
#include <cstdio>
#include <string_view>

#include "batch_sweep_panel.h"

namespace {

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

std::optional<QString> valueIfSet(const QCommandLineParser& p, const QCommandLineOption& o) {
  if (!p.isSet(o)) return std::nullopt;
  return p.value(o);
}

// The model: --model FILE or the positional FILE (Exec=phaselab %f in the
// desktop file), which may arrive as a file:// URL.
bool readModel(const QCommandLineParser& p, const GuiOptionSpec& o, GuiArgs* out) {
  out->modelPath = p.value(o.model);
  const QStringList positional = p.positionalArguments();
  if (positional.size() > 1 || (!positional.isEmpty() && p.isSet(o.model))) {
    std::fprintf(stderr, "phaselab: give one model, either as FILE or with --model (run phaselab --help)\n");
    return false;
  }
  if (!positional.isEmpty()) {
    const QUrl url(positional.front());
    out->modelPath = url.isLocalFile() ? url.toLocalFile() : positional.front();
  }
  return true;
}

// --compare's companions and --batch-sweep, which runs alone.
bool readCompareAndSweep(const QCommandLineParser& p, const GuiOptionSpec& o, GuiArgs* out) {
  if (p.isSet(o.chunks)) {
    bool ok = false;
    out->chunks = p.value(o.chunks).toInt(&ok);
    if (!ok || out->chunks < 1 || out->chunks > 10000) {
      std::fprintf(stderr, "phaselab: --chunks must be a whole number from 1 to 10000\n");
      return false;
    }
  }
  if ((p.isSet(o.quant) || p.isSet(o.prune) || p.isSet(o.text) || p.isSet(o.chunks) || p.isSet(o.drafts) ||
       p.isSet(o.compareTab)) &&
      !p.isSet(o.compare)) {
    std::fprintf(stderr,
                 "phaselab: --quant, --prune, --drafts, --compare-tab, --text and --chunks go with --compare (run "
                 "phaselab --help)\n");
    return false;
  }
  if (p.isSet(o.batchSweep)) {
    QString error;
    if (!phaselab::ui::BatchSweepPanel::parseSizes(p.value(o.batchSweep), &error)) {
      std::fprintf(stderr, "phaselab: --batch-sweep: %s\n", qPrintable(error));
      return false;
    }
    if (p.isSet(o.compare) || p.isSet(o.prompt)) {
      std::fprintf(stderr, "phaselab: --batch-sweep runs alone, without --compare or --prompt (run phaselab --help)\n");
      return false;
    }
  }
  out->compare = valueIfSet(p, o.compare);
  out->quant = p.value(o.quant);
  out->prune = p.value(o.prune);
  out->drafts = p.isSet(o.drafts);
  out->compareTab = p.value(o.compareTab);
  out->textFile = valueIfSet(p, o.text);
  out->batchSweep = valueIfSet(p, o.batchSweep);
  return true;
}

// The generation overrides for this run: every number checked before
// anything starts.
bool readGeneration(const QCommandLineParser& p, const GuiOptionSpec& o, GuiArgs* out) {
  qint64 value = 0;
  if (p.isSet(o.nPredict)) {
    if (!parseInt(p.value(o.nPredict), "-n", 1, 1 << 20, &value)) return false;
    out->nPredict = static_cast<int>(value);
  }
  if (p.isSet(o.threads)) {
    if (!parseInt(p.value(o.threads), "--threads", 1, 256, &value)) return false;
    out->threads = static_cast<int>(value);
  }
  if (p.isSet(o.temp)) {
    bool ok = false;
    const double t = p.value(o.temp).trimmed().toDouble(&ok);
    if (!ok || !(t >= 0 && t <= 100)) {
      std::fprintf(stderr, "phaselab: --temp must be a number from 0 to 100, not '%s'\n", qPrintable(p.value(o.temp)));
      return false;
    }
    out->temperature = t;
  }
  if (p.isSet(o.seed)) {
    bool ok = false;
    const QString text = p.value(o.seed).trimmed();
    const quint64 s = text.toULongLong(&ok);
    if (!ok || text.startsWith(QLatin1Char('-')) || text.startsWith(QLatin1Char('+'))) {
      std::fprintf(stderr, "phaselab: --seed must be a non-negative integer below 2^64, not '%s'\n", qPrintable(text));
      return false;
    }
    out->seed = s;
  }
  out->noKvCache = p.isSet(o.noKv);
  out->ignoreEos = p.isSet(o.ignoreEos);
  out->notebook = p.isSet(o.notebook);
  return true;
}

}  // namespace

void GuiOptionSpec::addTo(QCommandLineParser& p) const {
  p.setApplicationDescription(QStringLiteral("PhaseLab: run language models locally and see how inference works."));
  p.addHelpOption();
  p.addVersionOption();
  p.addOptions({model, prompt, shot, quit, nPredict, temp, seed, noKv, ignoreEos, threads, notebook, compare, quant, prune, drafts,
                compareTab, text, chunks, batchSweep, db});
  p.addPositionalArgument(QStringLiteral("FILE"),
                          QStringLiteral("GGUF model to open (what a file manager passes; same as --model)."),
                          QStringLiteral("[FILE.gguf]"));
}

bool asksOnlyForHelpOrVersion(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    const std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "-h" || a == "--help" || a == "-?" || a == "--help-all" || a == "-v" || a == "--version") return true;
  }
  return false;
}

bool parseGuiArgs(const QStringList& arguments, GuiArgs* out) {
  const GuiOptionSpec o;
  QCommandLineParser p;
  o.addTo(p);
  p.process(arguments);
  // The checks in the order their messages have always come in.
  if (!readModel(p, o, out) || !readCompareAndSweep(p, o, out) || !readGeneration(p, o, out)) return false;
  out->prompt = valueIfSet(p, o.prompt);
  out->screenshot = valueIfSet(p, o.shot);
  out->quit = p.isSet(o.quit);
  out->dbPath = p.value(o.db);
  return true;
}
