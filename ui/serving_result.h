// ServingResult: what `phaselab-cli bench --serving --json` prints (the
// contract in docs/serving.md), as plain structs for the Serving lab window.
// The parser takes text, not a process, so that a saved run, an exported
// file and the child's stdout are read by the same code (and tests feed it
// fixtures). The figures are the CLI's: nothing here recomputes a
// percentile; the window only lays out what the rows and timelines hold.
#pragma once

#include <QByteArray>
#include <QString>
#include <optional>
#include <vector>

namespace phaselab::ui {

// A distribution as the CLI summarizes it: n values, percentiles, max, mean.
struct ServingStats {
  int n = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};

// One request of a run: when it arrived and when each of its tokens came,
// in ms since the run started.
struct ServingRequestTrace {
  int stream = 0;     // the chat stream, or the long request's index
  bool isLong = false;  // "long": a long-document request; else a chat turn
  double arriveMs = 0;
  int nPrompt = 0;
  double firstTokenMs = 0;
  std::vector<double> tokenMs;  // [tokens]: every generated token's time
  bool ok = true;
};

// One run: a policy (or the baseline without long prompts) on one target.
struct ServingRow {
  QString policy;  // "prefill-first", "chunked:256", "disaggregated:1+1"
  QString label;   // what the table names it: the policy, or "baseline (no long prompt)"
  QString target;  // "in-process" or the URL it was sent to
  QString placement;  // where the workers ran (disaggregated), else empty
  int requests = 0, ok = 0;
  double durationS = 0;
  long long tokens = 0;
  double tokensPerS = 0;
  ServingStats ttftMs, ttftLongMs, itlMs, tpotMs;
  double maxStallMs = 0;  // the longest gap between two tokens of any chat stream
  double goodputRps = 0, goodputFraction = 0;  // requests meeting both targets
  int kvTransfers = 0;
  double kvTransferBytes = 0, kvTransferMs = 0;
  std::vector<ServingRequestTrace> timeline;  // in arrival order

  bool isBaseline() const;  // the row without long prompts
};

struct ServingWorkload {
  int streams = 0, chatPrompt = 0, chatAnswer = 0, longPrompt = 0, longAnswer = 0, longCount = 0;
  double longRate = 0, longStartS = 0, durationS = 0;
  int seed = 0;
  bool baseline = false;
};

struct ServingResult {
  QString model, backend;
  int threads = 0;
  ServingWorkload workload;
  double ttftTargetMs = 0, itlTargetMs = 0;
  std::vector<ServingRow> rows;  // run order
};

// The result in text (the CLI's stdout, a saved run, an exported file). On
// failure nothing and *error says what is wrong and what to do: invalid or
// cut-short JSON (with the offset), no rows, a row without its policy.
std::optional<ServingResult> parseServingResult(const QByteArray& json, QString* error);

// The result as the contract's JSON again (save, export): parseServingResult
// of it gives the same result.
QByteArray servingResultJson(const ServingResult& result);

// One line per row: the table's figures, for a spreadsheet.
QByteArray servingResultCsv(const ServingResult& result);

// A progress line of --progress-json (stderr).
struct ServingProgress {
  int run = 0, of = 0;  // run: 1-based
  QString label;
  double elapsedS = 0;
  int requestsDone = 0;
};

// What a stderr line of the child is.
struct ServingStderrLine {
  enum Kind { Other, Progress, Done, Error } kind = Other;
  ServingProgress progress;  // Progress
  QString error;             // Error: the CLI's message
};
ServingStderrLine parseServingStderrLine(const QByteArray& line);

// The largest gap (ms) between two consecutive tokens of one chat request,
// over all chat requests of the row; 0 without any. The CLI's max_stall_ms
// is the same figure; this one comes from the timeline the window draws.
double largestChatGapMs(const ServingRow& row);

}  // namespace phaselab::ui
