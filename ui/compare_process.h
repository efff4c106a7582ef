// CompareProcess: one model comparison run in a child process,
// `phaselab-cli compare ... --json --progress-json`, for the Compare window.
//
// Why a child: the peak resident memory of a variant (the kernel's
// high-water mark, reset before each variant) is only the variant's in a
// process that holds nothing else; in the desktop process it would count Qt,
// the charts and the chat's own model. And the window's figures are then
// literally what `phaselab-cli compare` prints for the same arguments.
//
// The child reports on stderr, one JSON line each (compare_progress_json):
// progress, and each variant's row as soon as it is measured; its stdout is
// the final JSON array (compare_rows_json). Cancel sends SIGTERM (the CLI
// stops at its next step and removes a half-written quantization), then
// SIGKILL after a grace period; the child also gets SIGTERM if this process
// dies (PR_SET_PDEATHSIG).
#pragma once

#include <QObject>
#include <QProcess>
#include <QStringList>
#include <vector>

#include "phaselab/compare.h"

class QTimer;

namespace phaselab::ui {

// What the window asks to measure: the variants and the CLI options.
struct CompareRequest {
  std::vector<CompareVariant> variants;
  QString textPath;
  int chunks = 8;
  int threads = 0;  // 0: the CLI's default (one per physical core)
  int nPrompt = 512, nGen = 128, repetitions = 3;
};

class CompareProcess : public QObject {
  Q_OBJECT
 public:
  explicit CompareProcess(QObject* parent = nullptr);
  ~CompareProcess() override;  // stops a running child and waits for it

  // phaselab-cli beside this executable (installed: the same bin folder;
  // the build tree: build/app/phaselab-cli, one folder above build/app/gui),
  // else on PATH; empty when there is none.
  static QString findCli();

  // The arguments after the program: plain -m / --quant when the variants
  // allow it (what a person would type), else --variants-json.
  static QStringList arguments(const CompareRequest& request);
  // The command as one shell line, to show and to copy.
  static QString commandLine(const QString& program, const QStringList& args);

  // false (and *error) when a run is in progress or cli is empty.
  bool start(const QString& cli, const CompareRequest& request, QString* error);
  void cancel();
  bool isRunning() const { return m_process.state() != QProcess::NotRunning; }
  qint64 processId() const { return m_pid; }  // the last child's, 0 before the first
  QString program() const { return m_program; }
  QStringList lastArguments() const { return m_args; }

 signals:
  void progress(const phaselab::CompareProgress& p);
  void rowMeasured(const phaselab::CompareRow& row);
  // rows: the child's final JSON (empty on error or cancel).
  void finished(const std::vector<phaselab::CompareRow>& rows, const QString& error, bool cancelled);

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
  QByteArray m_stderrBuffer;       // a partial line
  QStringList m_diagnostics;       // stderr lines that are not JSON (errors, warnings), the last few
  bool m_cancelRequested = false;
  bool m_starting = false;         // inside start(): its errors are start()'s
  bool m_reported = false;         // finished() was emitted for this run
};

}  // namespace phaselab::ui
