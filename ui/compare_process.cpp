#include "compare_process.h"

#include <sys/prctl.h>

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>
#include <QRegularExpression>
#include <QStandardPaths>
#include <QTimer>
#include <csignal>

namespace phaselab::ui {

namespace {

constexpr int kKillGraceMs = 5000;  // after SIGTERM, before SIGKILL
constexpr int kDiagnosticLines = 8;

QString qs(const std::string& s) { return QString::fromStdString(s); }

// The variants as `-m A -m B --quant T1,T2` would make them: models first,
// then quantizations of the first, one backend / KV / speculative setting.
bool plainFlagsFit(const std::vector<CompareVariant>& vs) {
  if (vs.empty() || vs.front().quantize_to) return false;
  const CompareVariant& first = vs.front();
  bool quantSeen = false;
  for (const CompareVariant& v : vs) {
    if (!v.name.empty() || !v.prune.empty() || v.draft || v.backend != first.backend || v.kv_cache != first.kv_cache ||
        v.speculative != first.speculative || v.file.find(',') != std::string::npos)
      return false;
    if (v.quantize_to) {
      quantSeen = true;
      if (v.file != first.file) return false;
    } else if (quantSeen) {
      return false;  // a model after a quantization: -m/--quant would reorder them
    }
  }
  return true;
}

}  // namespace

CompareProcess::CompareProcess(QObject* parent) : QObject(parent) {
  m_killTimer = new QTimer(this);
  m_killTimer->setSingleShot(true);
  connect(m_killTimer, &QTimer::timeout, this, [this] {
    if (isRunning()) m_process.kill();
  });
  connect(&m_process, &QProcess::readyReadStandardError, this, &CompareProcess::readProgress);
  connect(&m_process, &QProcess::finished, this, &CompareProcess::onFinished);
  connect(&m_process, &QProcess::errorOccurred, this, &CompareProcess::onError);
  // The child goes when this process goes, instead of measuring for no one.
  m_process.setChildProcessModifier([] { ::prctl(PR_SET_PDEATHSIG, SIGTERM); });
}

CompareProcess::~CompareProcess() {
  if (!isRunning()) return;
  m_process.disconnect(this);  // no signals into a window being destroyed
  m_process.terminate();
  if (!m_process.waitForFinished(3000)) {
    m_process.kill();
    m_process.waitForFinished(2000);
  }
}

QString CompareProcess::findCli() {
  const QString name = QStringLiteral("phaselab-cli");
  const QDir here(QCoreApplication::applicationDirPath());
  for (const QString& candidate : {here.filePath(name), here.filePath(QStringLiteral("../") + name)}) {
    const QFileInfo f(candidate);
    if (f.isFile() && f.isExecutable()) return f.canonicalFilePath();
  }
  return QStandardPaths::findExecutable(name);
}

QStringList CompareProcess::arguments(const CompareRequest& r) {
  QStringList a{QStringLiteral("compare")};
  if (plainFlagsFit(r.variants)) {
    QStringList quants;
    for (const CompareVariant& v : r.variants) {
      if (v.quantize_to) quants << qs(std::string(file_type_name(*v.quantize_to)));
      else a << QStringLiteral("-m") << qs(v.file);
    }
    if (!quants.isEmpty()) a << QStringLiteral("--quant") << quants.join(QLatin1Char(','));
    const CompareVariant& first = r.variants.front();
    a << QStringLiteral("--backend") << qs(first.backend);
    if (!first.kv_cache) a << QStringLiteral("--no-kv-cache");
    if (first.speculative != to_string(SpeculativeMode::off)) a << QStringLiteral("--spec") << qs(first.speculative);
  } else {
    a << QStringLiteral("--variants-json") << qs(compare_variants_json(r.variants));
  }
  a << QStringLiteral("-f") << r.textPath << QStringLiteral("--chunks") << QString::number(r.chunks)
    << QStringLiteral("-p") << QString::number(r.nPrompt) << QStringLiteral("-n") << QString::number(r.nGen)
    << QStringLiteral("-r") << QString::number(r.repetitions);
  if (r.threads > 0) a << QStringLiteral("-t") << QString::number(r.threads);
  a << QStringLiteral("--json") << QStringLiteral("--progress-json");
  return a;
}

QString CompareProcess::commandLine(const QString& program, const QStringList& args) {
  static const QRegularExpression plain(QStringLiteral("^[A-Za-z0-9_./,=:+-]+$"));
  QStringList out;
  for (const QString& a : QStringList{program} + args) {
    if (plain.match(a).hasMatch()) out << a;
    else out << QLatin1Char('\'') + QString(a).replace(QLatin1Char('\''), QStringLiteral("'\\''")) + QLatin1Char('\'');
  }
  return out.join(QLatin1Char(' '));
}

bool CompareProcess::start(const QString& cli, const CompareRequest& request, QString* error) {
  if (isRunning()) {
    if (error) *error = tr("A comparison is already running.");
    return false;
  }
  if (cli.isEmpty()) {
    if (error) *error = tr("phaselab-cli was not found beside phaselab or on PATH. Compare measures each run in a "
                           "phaselab-cli process of its own, so that its peak memory is its own: install phaselab-cli "
                           "next to phaselab.");
    return false;
  }
  m_program = cli;
  m_args = arguments(request);
  m_pid = 0;
  m_stderrBuffer.clear();
  m_diagnostics.clear();
  m_cancelRequested = false;
  m_reported = false;
  m_process.setProgram(cli);
  m_process.setArguments(m_args);
  m_starting = true;  // a failed start is this call's error, not a finished() later
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

void CompareProcess::cancel() {
  if (!isRunning()) return;
  m_cancelRequested = true;
  m_process.terminate();
  m_killTimer->start(kKillGraceMs);
}

void CompareProcess::readProgress() {
  m_stderrBuffer += m_process.readAllStandardError();
  qsizetype nl;
  while ((nl = m_stderrBuffer.indexOf('\n')) >= 0) {
    const QByteArray line = m_stderrBuffer.left(nl).trimmed();
    m_stderrBuffer.remove(0, nl + 1);
    if (!line.isEmpty()) handleLine(line);
  }
}

void CompareProcess::handleLine(const QByteArray& line) {
  if (line.startsWith('{')) {
    const QJsonObject o = QJsonDocument::fromJson(line).object();
    if (o.contains(QStringLiteral("row"))) {
      const QByteArray row = QJsonDocument(o.value(QStringLiteral("row")).toObject()).toJson(QJsonDocument::Compact);
      if (auto r = compare_row_from_json(row.toStdString())) emit rowMeasured(*r);
      return;
    }
    if (o.contains(QStringLiteral("progress"))) {
      const QJsonObject p = o.value(QStringLiteral("progress")).toObject();
      CompareProgress cp;
      cp.variant = p.value(QStringLiteral("variant")).toInt();
      cp.n_variants = p.value(QStringLiteral("n_variants")).toInt();
      cp.stage = p.value(QStringLiteral("stage")).toString().toStdString();
      cp.fraction = p.value(QStringLiteral("fraction")).toDouble();
      cp.message = p.value(QStringLiteral("message")).toString().toStdString();
      emit progress(cp);
      return;
    }
  }
  m_diagnostics << QString::fromUtf8(line);
  while (m_diagnostics.size() > kDiagnosticLines) m_diagnostics.removeFirst();
}

QString CompareProcess::failureMessage(int exitCode, QProcess::ExitStatus status) const {
  // The CLI's own error line says what was wrong; the rest is context.
  for (qsizetype i = m_diagnostics.size() - 1; i >= 0; i--) {
    static const QString prefix = QStringLiteral("phaselab-cli: error: ");
    if (m_diagnostics[i].startsWith(prefix)) return m_diagnostics[i].mid(prefix.size());
  }
  const QString tail = m_diagnostics.isEmpty() ? QString() : QStringLiteral(": ") + m_diagnostics.last();
  if (status == QProcess::CrashExit) return tr("phaselab-cli compare stopped unexpectedly (crashed)%1").arg(tail);
  return tr("phaselab-cli compare exited with code %1%2").arg(exitCode).arg(tail);
}

void CompareProcess::onFinished(int exitCode, QProcess::ExitStatus status) {
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
  auto rows = compare_rows_from_json(m_process.readAllStandardOutput().toStdString());
  if (!rows) {
    emit finished({}, tr("phaselab-cli compare printed no rows: %1").arg(qs(rows.status().message())), false);
    return;
  }
  emit finished(*rows, QString(), false);
}

void CompareProcess::onError(QProcess::ProcessError e) {
  if (m_starting || e != QProcess::FailedToStart || m_reported) return;  // the others end in finished()
  m_reported = true;
  emit finished({}, tr("Cannot start %1: %2").arg(m_program, m_process.errorString()), false);
}

}  // namespace phaselab::ui
