// The desktop application's command line: every option in one place, read
// into plain values and checked before the window opens. A bad value is an
// error with its reason (exit 2), never silently 0 or 1, as in phaselab-cli.
#pragma once

#include <QCommandLineOption>
#include <QString>
#include <QStringList>
#include <optional>

class QCommandLineParser;

// Every option of the window: the window and the display-free --help /
// --version share them.
struct GuiOptionSpec {
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
  const QCommandLineOption prune{QStringLiteral("prune"), QStringLiteral("With --compare: also these layer drops of the first model (layers:A-B, or layers:nN measured)."), QStringLiteral("S1,S2")};
  const QCommandLineOption drafts{QStringLiteral("drafts"), QStringLiteral("With --compare: also measure every variant after the first as its speculative draft.")};
  const QCommandLineOption compareTab{QStringLiteral("compare-tab"), QStringLiteral("With --compare: the results tab to show (Table, Speed, Speed vs quality, Memory, Drafts)."), QStringLiteral("NAME")};
  const QCommandLineOption text{QStringLiteral("text"), QStringLiteral("With --compare: the evaluation text (default: the bundled one)."), QStringLiteral("FILE")};
  const QCommandLineOption chunks{QStringLiteral("chunks"), QStringLiteral("With --compare: perplexity chunks of 512 tokens (default 8)."), QStringLiteral("N")};
  const QCommandLineOption batchSweep{QStringLiteral("batch-sweep"), QStringLiteral("Open the Compare window's Batch sweep tab with the model (--model, FILE or the last one) and run it at these batch sizes; with --screenshot, of that window."), QStringLiteral("1,2,4,...")};
  const QCommandLineOption db{QStringLiteral("db"), QStringLiteral("Conversation database (default: $PHASELAB_DB or the data folder)."), QStringLiteral("FILE")};

  void addTo(QCommandLineParser& p) const;
};

// What the command line asks for, checked. An optional is unset where its
// option was not given.
struct GuiArgs {
  QString modelPath;                  // --model FILE or the positional FILE; empty: none named
  std::optional<QString> prompt;      // sent once the model is loaded
  std::optional<QString> screenshot;  // PATH.png
  bool quit = false;
  std::optional<int> nPredict;
  std::optional<double> temperature;
  std::optional<quint64> seed;
  bool noKvCache = false;
  bool ignoreEos = false;
  std::optional<int> threads;
  bool notebook = false;
  std::optional<QString> compare;  // the models, comma-separated
  QString quant;                   // with --compare: quantization types, comma-separated
  QString prune;                   // with --compare: layer drops (prune.h spellings), comma-separated
  bool drafts = false;             // with --compare: the variants after the first are its drafts
  QString compareTab;              // with --compare: the results tab shown ("" the table)
  std::optional<QString> textFile;  // with --compare
  int chunks = 8;                   // with --compare
  std::optional<QString> batchSweep;  // the batch sizes, checked by BatchSweepPanel::parseSizes
  QString dbPath;                     // empty: the default database

  // A script's run: it prompts, takes a picture, quits, compares or sweeps.
  bool unattended() const { return prompt || screenshot || quit || compare || batchSweep; }
};

// --help and --version print and exit without a display (QApplication aborts
// when it cannot open one).
bool asksOnlyForHelpOrVersion(int argc, char** argv);

// Reads arguments (QCoreApplication::arguments(): the program's name first)
// into *out. False when a value is bad or options clash: the reason is
// printed and the program exits 2. Unknown options and --help end the
// program inside, as QCommandLineParser::process does.
bool parseGuiArgs(const QStringList& arguments, GuiArgs* out);
