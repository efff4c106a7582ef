#include "model_fetcher.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QProcessEnvironment>
#include <csignal>
#include <unistd.h>

#include "phaselab/log.h"

namespace phaselab::ui {

ModelFetcher::ModelFetcher(QObject* parent) : QObject(parent) {
  connect(&m_process, &QProcess::readyReadStandardError, this, &ModelFetcher::readStderr);
  connect(&m_process, &QProcess::finished, this, &ModelFetcher::onFinished);
  connect(&m_process, &QProcess::errorOccurred, this, [this](QProcess::ProcessError e) {
    if (e == QProcess::FailedToStart)
      emit failed(tr("The download helper could not be started (%1).").arg(m_process.errorString()));
  });
  // The script runs in its own process group, so that Cancel reaches pip too.
  m_process.setChildProcessModifier([] { ::setpgid(0, 0); });
}

ModelFetcher::~ModelFetcher() {
  if (isRunning()) {
    cancel();
    m_process.waitForFinished(3000);
  }
}

QString ModelFetcher::scriptPath() {
  const QString env = qEnvironmentVariable("PHASELAB_FETCH_MODEL");
  if (!env.isEmpty()) return env;
  // bin/ -> libexec/ once installed or unpacked; app/gui/ -> libexec/ in the build tree.
  QDir dir(QCoreApplication::applicationDirPath());
  for (int up = 0; up < 3; ++up) {
    const QString candidate = dir.filePath(QStringLiteral("libexec/phaselab/phaselab-fetch-model"));
    if (QFileInfo(candidate).isExecutable()) return QFileInfo(candidate).absoluteFilePath();
    const QString sibling = dir.filePath(QStringLiteral("../libexec/phaselab/phaselab-fetch-model"));
    if (QFileInfo(sibling).isExecutable()) return QFileInfo(sibling).absoluteFilePath();
    if (!dir.cdUp()) break;
  }
  return {};
}

QString ModelFetcher::defaultModelFileName() { return QStringLiteral("gemma-3-270m-q4_k_m.gguf"); }

QString ModelFetcher::defaultModelPath() {
  return QDir(QString::fromStdString(user_model_dir())).filePath(defaultModelFileName());
}

void ModelFetcher::start() {
  if (isRunning()) return;
  const QString script = scriptPath();
  if (script.isEmpty()) {
    emit failed(tr("The download helper (libexec/phaselab/phaselab-fetch-model) is not installed with this "
                   "copy of PhaseLab. Run scripts/fetch-model.sh from the source tree, or open a model file."));
    return;
  }
  m_cancelled = false;
  m_lastError.clear();
  m_pending.clear();
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert(QStringLiteral("PHASELAB_MODEL_DIR"), QString::fromStdString(user_model_dir()));
  m_process.setProcessEnvironment(env);
  m_process.setProgram(script);
  m_process.setArguments({QStringLiteral("--progress")});
  emit statusChanged(tr("Starting the download…"));
  m_process.start();
}

void ModelFetcher::cancel() {
  if (!isRunning()) return;
  m_cancelled = true;
  const qint64 pid = m_process.processId();
  if (pid > 0) ::kill(-static_cast<pid_t>(pid), SIGTERM);  // the script's whole group
  else m_process.terminate();
}

void ModelFetcher::readStderr() {
  m_pending += m_process.readAllStandardError();
  int nl;
  while ((nl = m_pending.indexOf('\n')) >= 0) {
    const QString line = QString::fromUtf8(m_pending.left(nl)).trimmed();
    m_pending.remove(0, nl + 1);
    if (line.startsWith(QLatin1String("PROGRESS "))) {
      const QStringList f = line.split(QLatin1Char(' '), Qt::SkipEmptyParts);
      if (f.size() == 3) emit progress(f[1].toLongLong(), f[2].toLongLong());
      continue;
    }
    QString text = line;
    if (text.startsWith(QLatin1String("fetch-model: "))) text = text.mid(13);
    if (text.isEmpty()) continue;
    if (text.startsWith(QLatin1String("error: "))) {
      text = text.mid(7);
      m_lastError = m_lastError.isEmpty() ? text : m_lastError + QLatin1Char(' ') + text;
    } else if (!m_lastError.isEmpty()) {
      m_lastError += QLatin1Char(' ') + text;  // the hint after an error line
    }
    emit statusChanged(text);
  }
}

void ModelFetcher::onFinished(int exitCode, QProcess::ExitStatus status) {
  readStderr();
  const QString out = QString::fromUtf8(m_process.readAllStandardOutput()).trimmed();
  if (m_cancelled) {
    emit cancelled();
    return;
  }
  const QString path = out.section(QLatin1Char('\n'), -1);
  if (status == QProcess::NormalExit && exitCode == 0 && QFileInfo(path).isFile()) {
    emit finished(path);
    return;
  }
  emit failed(m_lastError.isEmpty() ? tr("The download stopped (exit code %1).").arg(exitCode) : m_lastError);
}

}  // namespace phaselab::ui
