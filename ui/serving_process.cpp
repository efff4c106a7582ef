#include "serving_process.h"

#include <sys/prctl.h>

#include <QTimer>
#include <csignal>

namespace phaselab::ui {

namespace {

constexpr int kKillGraceMs = 5000;  // after SIGTERM, before SIGKILL
constexpr int kDiagnosticLines = 8;

QString number(double x) { return QString::number(x, 'g', 10); }

}  // namespace

ServingProcess::ServingProcess(QObject* parent) : QObject(parent) {
  m_killTimer = new QTimer(this);
  m_killTimer->setSingleShot(true);
  connect(m_killTimer, &QTimer::timeout, this, [this] {
    if (isRunning()) m_process.kill();
  });
  connect(&m_process, &QProcess::readyReadStandardError, this, &ServingProcess::readProgress);
  connect(&m_process, &QProcess::finished, this, &ServingProcess::onFinished);
  connect(&m_process, &QProcess::errorOccurred, this, &ServingProcess::onError);
  m_process.setChildProcessModifier([] { ::prctl(PR_SET_PDEATHSIG, SIGTERM); });
}

ServingProcess::~ServingProcess() {
  if (!isRunning()) return;
  m_process.disconnect(this);
  m_process.terminate();
  if (!m_process.waitForFinished(3000)) {
    m_process.kill();
    m_process.waitForFinished(2000);
  }
}

// The workload flags of `bench --serving` (docs/serving.md).
QStringList ServingProcess::arguments(const ServingRequest& r) {
  QStringList a{QStringLiteral("bench"), QStringLiteral("--serving"), QStringLiteral("-m"), r.model};
  if (r.threads > 0) a << QStringLiteral("-t") << QString::number(r.threads);
  a << QStringLiteral("--policy") << r.policies.join(QLatin1Char(','));
  a << QStringLiteral("--streams") << QString::number(r.streams);
  a << QStringLiteral("--long-prompt") << QString::number(r.longPrompt);
  a << QStringLiteral("--long-count") << QString::number(r.longCount);
  if (r.longRate > 0) a << QStringLiteral("--long-rate") << number(r.longRate);
  if (r.durationS > 0) a << QStringLiteral("--duration") << number(r.durationS);
  a << QStringLiteral("--ttft-target") << number(r.ttftTargetMs);
  a << QStringLiteral("--itl-target") << number(r.itlTargetMs);
  if (!r.baseline) a << QStringLiteral("--no-baseline");  // the CLI runs the baseline unless told not to
  a << QStringLiteral("--json") << QStringLiteral("--progress-json");
  return a;
}

bool ServingProcess::start(const QString& cli, const ServingRequest& request, QString* error) {
  if (isRunning()) {
    if (error) *error = tr("A serving benchmark is already running.");
    return false;
  }
  if (cli.isEmpty()) {
    if (error) *error = tr("phaselab-cli was not found beside phaselab or on PATH. The Serving lab runs the "
                           "benchmark in a phaselab-cli process of its own: install phaselab-cli next to phaselab.");
    return false;
  }
  m_program = cli;
  m_args = arguments(request);
  m_pid = 0;
  m_stderrBuffer.clear();
  m_diagnostics.clear();
  m_childError.clear();
  m_cancelRequested = false;
  m_reported = false;
  m_process.setProgram(cli);
  m_process.setArguments(m_args);
  m_starting = true;
  m_process.start(QIODevice::ReadOnly);
  const bool started = m_process.waitForStarted(10000);
  m_starting = false;
  if (!started) {
    m_reported = true;
    if (error) *error = tr("Cannot start %1: %2").arg(cli, m_process.errorString());
    return false;
  }
  m_pid = m_process.processId();
  return true;
}

void ServingProcess::cancel() {
  if (!isRunning()) return;
  m_cancelRequested = true;
  m_process.terminate();
  m_killTimer->start(kKillGraceMs);
}

void ServingProcess::readProgress() {
  m_stderrBuffer += m_process.readAllStandardError();
  qsizetype nl;
  while ((nl = m_stderrBuffer.indexOf('\n')) >= 0) {
    const QByteArray line = m_stderrBuffer.left(nl).trimmed();
    m_stderrBuffer.remove(0, nl + 1);
    if (!line.isEmpty()) handleLine(line);
  }
}

void ServingProcess::handleLine(const QByteArray& line) {
  const ServingStderrLine l = parseServingStderrLine(line);
  switch (l.kind) {
    case ServingStderrLine::Progress: emit progress(l.progress); return;
    case ServingStderrLine::Done: return;
    case ServingStderrLine::Error: m_childError = l.error; return;
    case ServingStderrLine::Other: break;
  }
  m_diagnostics << QString::fromUtf8(line);
  while (m_diagnostics.size() > kDiagnosticLines) m_diagnostics.removeFirst();
}

QString ServingProcess::failureMessage(int exitCode, QProcess::ExitStatus status) const {
  if (!m_childError.isEmpty()) return m_childError;
  for (qsizetype i = m_diagnostics.size() - 1; i >= 0; i--) {
    static const QString prefix = QStringLiteral("phaselab-cli: error: ");
    if (m_diagnostics[i].startsWith(prefix)) return m_diagnostics[i].mid(prefix.size());
  }
  const QString tail = m_diagnostics.isEmpty() ? QString() : QStringLiteral(": ") + m_diagnostics.last();
  if (status == QProcess::CrashExit) return tr("phaselab-cli bench --serving stopped unexpectedly (crashed)%1").arg(tail);
  return tr("phaselab-cli bench --serving exited with code %1%2").arg(exitCode).arg(tail);
}

void ServingProcess::onFinished(int exitCode, QProcess::ExitStatus status) {
  m_killTimer->stop();
  readProgress();
  if (!m_stderrBuffer.trimmed().isEmpty()) handleLine(m_stderrBuffer.trimmed());
  m_stderrBuffer.clear();
  if (m_reported) return;
  m_reported = true;
  if (m_cancelRequested) {
    emit finished({}, QString(), true);
    return;
  }
  if (status != QProcess::NormalExit || exitCode != 0) {
    emit finished({}, failureMessage(exitCode, status), false);
    return;
  }
  QString error;
  const auto result = parseServingResult(m_process.readAllStandardOutput(), &error);
  if (!result) {
    emit finished({}, error, false);
    return;
  }
  emit finished(*result, QString(), false);
}

void ServingProcess::onError(QProcess::ProcessError e) {
  if (m_starting || e != QProcess::FailedToStart || m_reported) return;
  m_reported = true;
  emit finished({}, tr("Cannot start %1: %2").arg(m_program, m_process.errorString()), false);
}

}  // namespace phaselab::ui
