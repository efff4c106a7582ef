// ServingProcess: one serving benchmark in a child process,
// `phaselab-cli bench --serving ... --json --progress-json`, for the Serving
// lab window.
//
// Why a child, as Compare does (compare_process.h): the runs take the
// machine's cores for tens of seconds (disaggregated pins its workers to
// cores), which the desktop's chat engine must not share; and the window's
// figures are then exactly what the CLI prints for the same arguments.
//
// The child reports on stderr, one JSON line each: {"progress": ...}, a
// final {"done": true}, or {"error": "..."} before a non-zero exit; its
// stdout is the result (serving_result.h). Cancel sends SIGTERM (the CLI
// stops at once), then SIGKILL after a grace period; the child also gets
// SIGTERM if this process dies (PR_SET_PDEATHSIG).
#pragma once

#include <QObject>
#include <QProcess>
#include <QStringList>

#include "serving_result.h"

class QTimer;

namespace phaselab::ui {

// The lab's inputs: what the CLI measures.
struct ServingRequest {
  QString model;            // a GGUF file
  int threads = 0;          // 0: the CLI's default (one per physical core)
  QStringList policies;     // "prefill-first", "chunked:256", "disaggregated:1+1"
  int streams = 4;          // chat streams decoding all along
  int longPrompt = 2000;    // tokens of each long-document prompt
  double longRate = 0;      // long requests per second (Poisson); 0: long_count of them at long start
  int longCount = 1;
  double durationS = 0;     // 0: until the long requests are answered
  double ttftTargetMs = 5000, itlTargetMs = 250;  // goodput's targets
  bool baseline = true;     // a first run without long prompts (the ITL to compare with)
};

class ServingProcess : public QObject {
  Q_OBJECT
 public:
  explicit ServingProcess(QObject* parent = nullptr);
  ~ServingProcess() override;  // stops a running child and waits for it

  // The arguments after the program (what a person would type).
  static QStringList arguments(const ServingRequest& request);

  // false (and *error) when a run is in progress or cli is empty.
  bool start(const QString& cli, const ServingRequest& request, QString* error);
  void cancel();
  bool isRunning() const { return m_process.state() != QProcess::NotRunning; }
  qint64 processId() const { return m_pid; }
  QString program() const { return m_program; }
  QStringList lastArguments() const { return m_args; }

 signals:
  void progress(const phaselab::ui::ServingProgress& p);
  // result: the child's stdout parsed (empty rows on error or cancel).
  void finished(const phaselab::ui::ServingResult& result, const QString& error, bool cancelled);

 private:
  void readProgress();
  void handleLine(const QByteArray& line);
  void onFinished(int exitCode, QProcess::ExitStatus status);
  void onError(QProcess::ProcessError e);
  QString failureMessage(int exitCode, QProcess::ExitStatus status) const;

  QProcess m_process;
  QTimer* m_killTimer = nullptr;
  QString m_program;
  QStringList m_args;
  qint64 m_pid = 0;
  QByteArray m_stderrBuffer;   // a partial line
  QStringList m_diagnostics;   // stderr lines that are not JSON, the last few
  QString m_childError;        // the child's {"error": ...}
  bool m_cancelRequested = false;
  bool m_starting = false;
  bool m_reported = false;
};

}  // namespace phaselab::ui
