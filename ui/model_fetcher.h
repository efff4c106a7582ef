// ModelFetcher: downloads the default model from the application by running
// the project's own download script (scripts/fetch-model.sh, installed as
// libexec/phaselab/phaselab-fetch-model): the same source, the same checksum
// and the same model folder as README's set-up. The script reports progress
// on stderr ("PROGRESS <done> <total>"); Cancel stops it and everything it
// started, and it leaves nothing partial behind.
#pragma once

#include <QObject>
#include <QProcess>
#include <QString>

namespace phaselab::ui {

class ModelFetcher : public QObject {
  Q_OBJECT
 public:
  explicit ModelFetcher(QObject* parent = nullptr);
  ~ModelFetcher() override;

  // The download script: $PHASELAB_FETCH_MODEL when set, else
  // libexec/phaselab/phaselab-fetch-model next to the executable's bin/ (an
  // install, an unpacked archive, the build tree). Empty when none is found.
  static QString scriptPath();
  // The default model's file name, and where it lands (the model folder).
  static QString defaultModelFileName();
  static QString defaultModelPath();

  bool isRunning() const { return m_process.state() != QProcess::NotRunning; }
  void start();
  void cancel();

 signals:
  void progress(qint64 done, qint64 total);
  void statusChanged(const QString& text);  // the script's own lines, for the status label
  void finished(const QString& modelPath);
  void failed(const QString& error);
  void cancelled();

 private:
  void readStderr();
  void onFinished(int exitCode, QProcess::ExitStatus status);

  QProcess m_process;
  QByteArray m_pending;  // stderr bytes after the last newline
  QString m_lastError;
  bool m_cancelled = false;
};

}  // namespace phaselab::ui
