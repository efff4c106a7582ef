#include "serving_lab_window.h"

#include <QChart>
#include <QChartView>
#include <QCloseEvent>
#include <QComboBox>
#include <QDateTime>
#include <QDir>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineSeries>
#include <QProgressBar>
#include <QPushButton>
#include <QSaveFile>
#include <QScreen>
#include <QScrollArea>
#include <QSplitter>
#include <QTabWidget>
#include <QTableWidget>
#include <QVBoxLayout>
#include <algorithm>

#include "compare_charts.h"
#include "compare_process.h"
#include "conversation_store.h"
#include "phaselab/log.h"
#include "serving_charts.h"
#include "serving_inputs.h"
#include "serving_process.h"
#include "serving_timeline.h"

namespace phaselab::ui {

namespace {

enum Column {
  kColRun, kColTtft, kColLongTtft, kColItl, kColStall, kColTokensPerS, kColGoodput, kColKv, kColumns
};

QString ms(double v) { return QString::number(v, 'f', v < 100 ? 1 : 0); }
// "32.7 / 38.3": a p50 and a p99 in one cell, so that the table fits 800 pixels.
QString p50p99(const ServingStats& s) { return ms(s.p50) + QStringLiteral(" / ") + ms(s.p99); }

constexpr qint64 kMaxImportBytes = 256 << 20;

}  // namespace

ServingLabWindow::ServingLabWindow(ConversationStore* store, QWidget* parent) : QMainWindow(parent), m_store(store) {
  setWindowTitle(tr("Serving lab — PhaseLab"));
  setObjectName(QStringLiteral("servingLabWindow"));
  QSize size(1200, 800);
  if (const QScreen* s = screen()) size = size.boundedTo(s->availableGeometry().size() - QSize(16, 48));
  resize(size);
  m_process = new ServingProcess(this);
  connect(m_process, &ServingProcess::progress, this, &ServingLabWindow::onProgress);
  connect(m_process, &ServingProcess::finished, this, &ServingLabWindow::onDone);

  auto* central = new QWidget;
  auto* col = new QVBoxLayout(central);
  col->setContentsMargins(6, 6, 6, 6);
  col->addLayout(buildSavedRunsRow());
  auto* split = new QSplitter(Qt::Vertical);
  split->setChildrenCollapsible(false);
  split->addWidget(buildInputsPanel());
  split->addWidget(buildResultsPanel());
  split->setStretchFactor(1, 3);
  col->addWidget(split, 1);
  // Sized to fit 800x600; below that (or with a larger font) it scrolls
  // rather than cutting off its buttons.
  m_scroll = new QScrollArea;
  m_scroll->setWidgetResizable(true);
  m_scroll->setFrameShape(QFrame::NoFrame);
  m_scroll->setWidget(central);
  setCentralWidget(m_scroll);
  refreshSavedRuns();
}

ServingLabWindow::~ServingLabWindow() = default;

QLayout* ServingLabWindow::buildSavedRunsRow() {
  auto* row = new QHBoxLayout;
  row->addWidget(new QLabel(tr("Saved runs:")));
  m_saved = new QComboBox;
  m_saved->setObjectName(QStringLiteral("servingSavedRuns"));
  m_saved->setAccessibleName(tr("Saved runs"));
  m_saved->setMinimumContentsLength(16);
  m_saved->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  row->addWidget(m_saved, 1);
  auto* open = new QPushButton(tr("Open"));
  open->setAccessibleName(tr("Open the saved run"));
  open->setToolTip(tr("Its results, and its inputs, so that Run repeats it"));
  connect(open, &QPushButton::clicked, this, [this] {
    if (m_saved->currentData().isValid()) openSavedRun(m_saved->currentData().toLongLong());
  });
  auto* import = new QPushButton(tr("&Open results…"));
  import->setToolTip(tr("A result exported from here, or printed by phaselab-cli bench --serving --json"));
  connect(import, &QPushButton::clicked, this, [this] {
    const QString p = QFileDialog::getOpenFileName(this, tr("Open serving results"), QDir::homePath(), tr("JSON (*.json);;All files (*)"));
    if (!p.isEmpty()) importResults(p);
  });
  auto* csv = new QPushButton(tr("Export CSV…"));
  connect(csv, &QPushButton::clicked, this, [this] {
    const QString p = QFileDialog::getSaveFileName(this, tr("Export CSV"), QDir::home().filePath(QStringLiteral("serving.csv")), tr("CSV (*.csv)"));
    if (!p.isEmpty()) exportCsv(p);
  });
  auto* json = new QPushButton(tr("Export JSON…"));
  connect(json, &QPushButton::clicked, this, [this] {
    const QString p = QFileDialog::getSaveFileName(this, tr("Export JSON"), QDir::home().filePath(QStringLiteral("serving.json")), tr("JSON (*.json)"));
    if (!p.isEmpty()) exportJson(p);
  });
  row->addWidget(open);
  row->addWidget(import);
  row->addSpacing(8);
  row->addWidget(csv);
  row->addWidget(json);
  return row;
}

QWidget* ServingLabWindow::buildInputsPanel() {
  auto* panel = new QWidget;
  auto* col = new QVBoxLayout(panel);
  col->setContentsMargins(0, 0, 0, 0);
  col->setSpacing(4);
  m_inputs = new ServingInputs;
  col->addWidget(m_inputs);
  auto* runRow = new QHBoxLayout;
  m_run = new QPushButton(tr("Run"));
  m_run->setObjectName(QStringLiteral("servingRun"));
  m_run->setToolTip(tr("Runs the policies one after another in a phaselab-cli process"));
  connect(m_run, &QPushButton::clicked, this, &ServingLabWindow::startRun);
  m_cancel = new QPushButton(tr("Cancel"));
  m_cancel->setEnabled(false);
  connect(m_cancel, &QPushButton::clicked, this, &ServingLabWindow::cancelRun);
  m_progress = new QProgressBar;
  m_progress->setRange(0, 1000);
  m_progress->setValue(0);
  m_progress->setTextVisible(false);
  runRow->addWidget(m_run);
  runRow->addWidget(m_cancel);
  runRow->addWidget(m_progress, 1);
  col->addLayout(runRow);
  m_status = new QLabel;
  m_status->setWordWrap(true);
  m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
  col->addWidget(m_status);
  m_explanation = new QLabel(
      tr("<b>What this shows.</b> Prefill (reading a prompt) is compute-bound; decode (writing a token) is "
         "memory-bandwidth-bound. Under <i>prefill-first</i> a long prompt is prefilled whole while every chat stream "
         "waits: the stall is the gap in each chat lane under the orange band. <i>chunked:N</i> mixes at most N "
         "tokens into each pass, which bounds the stall (to one pass of N tokens: long on a CPU, short on a GPU) and "
         "pays for it with the long prompt's TTFT; <i>chunked:auto</i> sizes the chunks by time, so that a pass adds "
         "at most half a decode pass. <i>disaggregated:P+D</i> prefills on P cores of their own and decodes on D, so no decode waits, at the cost "
         "of moving the prompt's K/V between them and of the cores given to prefill. Goodput counts the requests that "
         "meet both targets: TTFT within its target and no gap between two tokens longer than the ITL target."));
  m_explanation->setWordWrap(true);
  m_explanation->setObjectName(QStringLiteral("servingExplanation"));
  col->addWidget(m_explanation);
  return panel;
}

QWidget* ServingLabWindow::buildResultsPanel() {
  m_tabs = new QTabWidget;
  m_tabs->addTab(buildTimelineTab(), tr("Timeline"));
  m_tabs->addTab(buildDistributionsTab(), tr("TTFT and ITL"));
  m_table = new QTableWidget(0, kColumns);
  m_table->setObjectName(QStringLiteral("servingTable"));
  m_table->setAccessibleName(tr("Serving results"));
  m_table->setHorizontalHeaderLabels({tr("Run"), tr("TTFT (ms)\np50 / p99"), tr("Long TTFT (ms)\np50 / p99"),
                                      tr("ITL (ms)\np50 / p99"), tr("Max stall\n(ms)"), tr("Tokens/s"), tr("Goodput"),
                                      tr("KV moved")});
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_table->horizontalHeader()->setStretchLastSection(true);
  m_table->verticalHeader()->setVisible(false);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_table->setMinimumHeight(90);
  auto* tablePage = new QWidget;
  auto* tableCol = new QVBoxLayout(tablePage);
  tableCol->setContentsMargins(4, 4, 4, 4);
  m_runInfo = new QLabel;
  m_runInfo->setWordWrap(true);
  tableCol->addWidget(m_runInfo);
  tableCol->addWidget(m_table, 1);
  m_tabs->addTab(tablePage, tr("Table"));
  m_tabs->setMinimumHeight(220);
  return m_tabs;
}

QWidget* ServingLabWindow::buildTimelineTab() {
  auto* page = new QWidget;
  auto* col = new QVBoxLayout(page);
  col->setContentsMargins(4, 4, 4, 4);
  col->setSpacing(3);
  auto* top = new QHBoxLayout;
  top->addWidget(new QLabel(tr("Run:")));
  m_policy = new QComboBox;
  m_policy->setAccessibleName(tr("Run shown in the timeline"));
  m_policy->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  connect(m_policy, &QComboBox::currentIndexChanged, this, &ServingLabWindow::showTimeline);
  top->addWidget(m_policy);
  auto* legend = new QLabel(tr("a tick per token · <span style='color:#e68c1e'>■</span> long prompt's prefill "
                               "(arrival → first token) · <span style='color:#c81e32'>■</span> a chat stream's longest gap · "
                               "<span style='color:#286edc'>▮</span> a request arrives"));
  legend->setWordWrap(true);
  top->addWidget(legend, 1);
  col->addLayout(top);
  m_timeline = new ServingTimelineWidget;
  auto* scroll = new QScrollArea;
  scroll->setWidgetResizable(true);
  scroll->setWidget(m_timeline);
  col->addWidget(scroll, 1);
  return page;
}

QWidget* ServingLabWindow::buildDistributionsTab() {
  auto* page = new QWidget;
  auto* col = new QVBoxLayout(page);
  col->setContentsMargins(4, 4, 4, 4);
  col->setSpacing(2);
  // One legend for both charts (theirs elided the runs' names at 800 pixels).
  m_cdfLegend = new QLabel;
  m_cdfLegend->setWordWrap(true);
  col->addWidget(m_cdfLegend);
  auto* split = new QSplitter(Qt::Horizontal);
  split->setChildrenCollapsible(false);
  m_ttftChart = new QChart;
  m_itlChart = new QChart;
  split->addWidget(compareChartView(m_ttftChart, tr("Time to first token, every request")));
  split->addWidget(compareChartView(m_itlChart, tr("Gaps between tokens, chat streams")));
  col->addWidget(split, 1);
  return page;
}

bool ServingLabWindow::isRunning() const { return m_process->isRunning(); }
qint64 ServingLabWindow::childProcessId() const { return m_process->processId(); }
QString ServingLabWindow::childCommand() const {
  return m_process->program().isEmpty() ? QString()
                                        : CompareProcess::commandLine(m_process->program(), m_process->lastArguments());
}

void ServingLabWindow::showError(const QString& message) {
  m_lastError = message;
  m_status->setText(QStringLiteral("<span style='color:#b00020'>%1</span>").arg(message.toHtmlEscaped()));
  spdlog::warn("serving lab: {}", message.toStdString());
}

void ServingLabWindow::setRunning(bool running) {
  m_run->setEnabled(!running);
  m_cancel->setEnabled(running);
  m_inputs->setEnabled(!running);
}

bool ServingLabWindow::startRun() {
  if (isRunning()) return false;
  m_lastError.clear();
  if (const QString why = m_inputs->validate(); !why.isEmpty()) {
    showError(why);
    emit runFinished(false, why);
    return false;
  }
  QString error;
  const QString cli = m_cliPath.isEmpty() ? CompareProcess::findCli() : m_cliPath;
  if (!m_process->start(cli, m_inputs->request(), &error)) {
    showError(error);
    emit runFinished(false, error);
    return false;
  }
  clearResult();  // what is shown is this run's from here on
  setRunning(true);
  m_progress->setValue(0);
  m_status->setText(tr("Starting phaselab-cli (pid %1)…").arg(m_process->processId()));
  m_status->setToolTip(childCommand());
  return true;
}

void ServingLabWindow::cancelRun() {
  if (!isRunning()) return;
  m_process->cancel();
  m_status->setText(tr("Cancelling…"));
}

void ServingLabWindow::onProgress(const ServingProgress& p) {
  if (p.of > 0) m_progress->setValue(std::clamp((p.run - 1) * 1000 / p.of, 0, 1000));
  m_status->setText(tr("Run %1 of %2 — %3: %4 requests answered, %5 s (phaselab-cli, pid %6)")
                        .arg(p.run)
                        .arg(p.of)
                        .arg(p.label)
                        .arg(p.requestsDone)
                        .arg(p.elapsedS, 0, 'f', 1)
                        .arg(m_process->processId()));
}

void ServingLabWindow::onDone(const ServingResult& result, const QString& error, bool cancelled) {
  setRunning(false);
  if (cancelled) {
    m_progress->setValue(0);
    m_status->setText(tr("Cancelled: nothing saved."));
    emit runFinished(false, tr("cancelled"));
    return;
  }
  if (!error.isEmpty()) {
    showError(error);
    emit runFinished(false, error);
    return;
  }
  m_progress->setValue(1000);
  showResult(result);
  const QString title = tr("%1, %2 runs, %3")
                            .arg(result.model)
                            .arg(result.rows.size())
                            .arg(QDateTime::currentDateTime().toString(QStringLiteral("yyyy-MM-dd HH:mm")));
  if (saveResult(result, title) == 0)
    showError(tr("The run finished but could not be saved: %1").arg(m_store ? m_store->lastError() : QString()));
  else
    m_status->setText(tr("Done: %1 runs measured by phaselab-cli and saved.").arg(result.rows.size()));
  emit runFinished(true, QString());
}

void ServingLabWindow::clearResult() {
  m_result.reset();
  m_policy->clear();
  m_timeline->clear();
  m_table->setRowCount(0);
  m_runInfo->clear();
  clearChart(m_ttftChart);
  clearChart(m_itlChart);
  m_cdfLegend->clear();
}

void ServingLabWindow::showResult(const ServingResult& result) {
  clearResult();
  m_result = result;
  {
    const QSignalBlocker block(m_policy);
    m_policy->addItem(tr("every run"));
    for (const ServingRow& r : result.rows) m_policy->addItem(r.label);
  }
  m_policy->setCurrentIndex(0);
  showTimeline(0);
  fillTable();
  fillCharts();
}

// Item 0 of the selector: every run, one above the other; then each run alone.
void ServingLabWindow::showTimeline(int index) {
  if (!m_result || index < 0 || index > static_cast<int>(m_result->rows.size())) {
    m_timeline->clear();
    return;
  }
  // One time axis for every run, so that their gaps compare by eye.
  double span = 0;
  for (const ServingRow& r : m_result->rows) span = std::max(span, timelineModel(r).endMs);
  if (index > 0) {
    m_timeline->setRow(m_result->rows[static_cast<size_t>(index - 1)], span);
    return;
  }
  std::vector<std::pair<QString, const ServingRow*>> rows;
  for (const ServingRow& r : m_result->rows) rows.emplace_back(r.label, &r);
  m_timeline->setRows(rows, span);
}

void ServingLabWindow::fillTable() {
  m_table->setRowCount(0);
  if (!m_result) return;
  const ServingResult& res = *m_result;
  for (const ServingRow& r : res.rows) {
    const int i = m_table->rowCount();
    m_table->insertRow(i);
    auto cell = [&](int c, const QString& text, const QString& tip = {}) {
      auto* item = new QTableWidgetItem(text);
      if (c > 0) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
      if (!tip.isEmpty()) item->setToolTip(tip);
      m_table->setItem(i, c, item);
    };
    cell(kColRun, r.label, tr("%1 on %2%3").arg(r.policy, r.target, r.placement.isEmpty() ? QString() : QStringLiteral(", ") + r.placement));
    cell(kColTtft, p50p99(r.ttftMs), tr("of %n request(s), chat and long", nullptr, r.ttftMs.n));
    cell(kColLongTtft, r.ttftLongMs.n > 0 ? p50p99(r.ttftLongMs) : tr("—"),
         tr("of the %n long request(s)", nullptr, r.ttftLongMs.n));
    cell(kColItl, p50p99(r.itlMs), tr("of %n gap(s) between two tokens of a chat stream", nullptr, r.itlMs.n));
    cell(kColStall, ms(r.maxStallMs), tr("the longest gap between two tokens of any chat stream"));
    cell(kColTokensPerS, QString::number(r.tokensPerS, 'f', 1),
         tr("%1 tokens generated in %2 s, all requests").arg(r.tokens).arg(r.durationS, 0, 'f', 1));
    cell(kColGoodput, tr("%1/s (%2%)").arg(r.goodputRps, 0, 'f', 2).arg(100 * r.goodputFraction, 0, 'f', 0),
         tr("requests with TTFT ≤ %1 ms and every gap ≤ %2 ms, per second of the run (and as a share of the %3 requests)")
             .arg(res.ttftTargetMs)
             .arg(res.itlTargetMs)
             .arg(r.requests));
    cell(kColKv,
         r.kvTransfers > 0 ? tr("%1 MiB, %2 ms").arg(r.kvTransferBytes / (1024.0 * 1024.0), 0, 'f', 1).arg(r.kvTransferMs, 0, 'f', 1)
                           : tr("—"),
         tr("%n K/V hand-over(s) from the prefill worker to the decode worker", nullptr, r.kvTransfers));
  }
  const ServingWorkload& w = res.workload;
  m_runInfo->setText(tr("%1 on %2, %3 threads · %4 chat streams (%5-token prompts, %6-token answers) · %7 long "
                        "prompt(s) of %8 tokens · targets: TTFT %9 ms, ITL %10 ms")
                         .arg(res.model, res.backend)
                         .arg(res.threads)
                         .arg(w.streams)
                         .arg(w.chatPrompt)
                         .arg(w.chatAnswer)
                         .arg(w.longCount)
                         .arg(w.longPrompt)
                         .arg(res.ttftTargetMs)
                         .arg(res.itlTargetMs));
}

void ServingLabWindow::fillCharts() {
  QList<QPair<QString, std::vector<double>>> ttft, itl;
  if (m_result)
    for (const ServingRow& r : m_result->rows) {
      ttft.append({r.label, ttftsMs(r)});
      itl.append({r.label, chatGapsMs(r)});
    }
  fillCdf(m_ttftChart, ttft, tr("TTFT (ms)"));
  fillCdf(m_itlChart, itl, tr("gap (ms)"));
  // Both charts give the runs the same colors, in run order.
  QStringList entries;
  for (QAbstractSeries* s : m_itlChart->series()) {
    m_itlChart->legend()->hide();
    m_ttftChart->legend()->hide();
    if (auto* line = qobject_cast<QLineSeries*>(s))
      entries << QStringLiteral("<span style='color:%1'>■</span>&nbsp;%2").arg(line->color().name(), line->name().toHtmlEscaped());
  }
  m_cdfLegend->setText(entries.isEmpty() ? QString()
                                         : entries.join(QStringLiteral(" &nbsp; ")) +
                                               tr(" &nbsp;·&nbsp; each line: the share of values ≤ x"));
}

ServingRequest ServingLabWindow::requestFromResult(const ServingResult& r) {
  ServingRequest q;
  q.model = r.model;
  q.threads = r.threads;
  q.streams = r.workload.streams;
  q.longPrompt = r.workload.longPrompt;
  q.longCount = r.workload.longCount;
  q.longRate = r.workload.longRate;
  q.durationS = r.workload.durationS;
  q.ttftTargetMs = r.ttftTargetMs;
  q.itlTargetMs = r.itlTargetMs;
  q.baseline = r.workload.baseline;
  for (const ServingRow& row : r.rows)
    if (!row.isBaseline() && !q.policies.contains(row.policy)) q.policies << row.policy;
  return q;
}

QByteArray ServingLabWindow::optionsJson() const {
  const ServingRequest r = m_inputs->request();
  return QJsonDocument(QJsonObject{{"model", r.model},
                                   {"threads", r.threads},
                                   {"policies", QJsonArray::fromStringList(r.policies)},
                                   {"streams", r.streams},
                                   {"long_prompt", r.longPrompt},
                                   {"long_count", r.longCount},
                                   {"long_rate", r.longRate},
                                   {"duration_s", r.durationS},
                                   {"ttft_target_ms", r.ttftTargetMs},
                                   {"itl_target_ms", r.itlTargetMs},
                                   {"baseline", r.baseline},
                                   {"command", childCommand()}})
      .toJson(QJsonDocument::Compact);
}

void ServingLabWindow::restoreOptions(const QByteArray& options) {
  const QJsonObject o = QJsonDocument::fromJson(options).object();
  ServingRequest r = m_inputs->request();
  r.model = o.value(QStringLiteral("model")).toString(r.model);
  r.threads = o.value(QStringLiteral("threads")).toInt(r.threads);
  if (o.contains(QStringLiteral("policies"))) {
    r.policies.clear();
    for (const QJsonValue& v : o.value(QStringLiteral("policies")).toArray()) r.policies << v.toString();
  }
  r.streams = o.value(QStringLiteral("streams")).toInt(r.streams);
  r.longPrompt = o.value(QStringLiteral("long_prompt")).toInt(r.longPrompt);
  r.longCount = o.value(QStringLiteral("long_count")).toInt(r.longCount);
  r.longRate = o.value(QStringLiteral("long_rate")).toDouble(r.longRate);
  r.durationS = o.value(QStringLiteral("duration_s")).toDouble(r.durationS);
  r.ttftTargetMs = o.value(QStringLiteral("ttft_target_ms")).toDouble(r.ttftTargetMs);
  r.itlTargetMs = o.value(QStringLiteral("itl_target_ms")).toDouble(r.itlTargetMs);
  r.baseline = o.value(QStringLiteral("baseline")).toBool(r.baseline);
  m_inputs->setRequest(r);
}

qint64 ServingLabWindow::saveResult(const ServingResult& result, const QString& title) {
  if (!m_store || !m_store->isOpen()) return 0;
  const qint64 id = m_store->saveServingRun(title, optionsJson(), servingResultJson(result));
  refreshSavedRuns();
  return id;
}

void ServingLabWindow::refreshSavedRuns() {
  m_saved->clear();
  if (!m_store || !m_store->isOpen()) return;
  for (const ServingRunRecord& r : m_store->servingRuns()) m_saved->addItem(r.title, r.id);
}

bool ServingLabWindow::openSavedRun(qint64 id) {
  if (!m_store) return false;
  if (isRunning()) {
    showError(tr("A run is in progress: open the saved run when it has finished or been cancelled."));
    return false;
  }
  for (const ServingRunRecord& r : m_store->servingRuns()) {
    if (r.id != id) continue;
    QString error;
    const auto result = parseServingResult(r.rows, &error);
    if (!result) {
      showError(tr("The saved run %1 cannot be read: %2").arg(r.title, error));
      return false;
    }
    showResult(*result);
    restoreOptions(r.options);
    m_status->setText(tr("Saved run: %1 (Run measures it again)").arg(r.title));
    m_status->setToolTip(QJsonDocument::fromJson(r.options).object().value(QStringLiteral("command")).toString());
    return true;
  }
  showError(tr("No saved run %1").arg(id));
  return false;
}

bool ServingLabWindow::importResults(const QString& path) {
  if (isRunning()) {
    showError(tr("A run is in progress: open results when it has finished or been cancelled."));
    return false;
  }
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) {
    showError(tr("Cannot read %1: %2").arg(path, f.errorString()));
    return false;
  }
  if (f.size() > kMaxImportBytes) {
    showError(tr("%1 is larger than 256 MiB: it is not a serving result.").arg(path));
    return false;
  }
  QString error;
  const auto result = parseServingResult(f.readAll(), &error);
  if (!result) {
    showError(tr("%1: %2").arg(QFileInfo(path).fileName(), error));
    return false;
  }
  showResult(*result);
  // The inputs it was measured with, the model where a file of that name is beside it.
  ServingRequest r = requestFromResult(*result);
  const QString beside = QFileInfo(path).dir().filePath(r.model);
  const QString inModels = QDir(QString::fromStdString(user_model_dir())).filePath(r.model);
  r.model = QFileInfo(beside).isFile() ? beside : QFileInfo(inModels).isFile() ? inModels : m_inputs->model();
  m_inputs->setRequest(r);
  const QString title = tr("%1, opened %2").arg(QFileInfo(path).fileName(), QDateTime::currentDateTime().toString(QStringLiteral("yyyy-MM-dd HH:mm")));
  if (saveResult(*result, title) == 0 && m_store && m_store->isOpen())
    showError(tr("The results were opened but could not be saved: %1").arg(m_store->lastError()));
  else
    m_status->setText(tr("Opened %1: %2 runs.").arg(path).arg(result->rows.size()));
  return true;
}

bool ServingLabWindow::writeFile(const QString& path, const QByteArray& data) {
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly) || f.write(data) != data.size() || !f.commit()) {
    showError(tr("Could not write %1: %2").arg(path, f.errorString()));
    return false;
  }
  m_status->setText(tr("Exported to %1").arg(path));
  return true;
}

bool ServingLabWindow::exportCsv(const QString& path) {
  if (!m_result) {
    showError(tr("Nothing to export: run the benchmark or open a saved run first."));
    return false;
  }
  return writeFile(path, servingResultCsv(*m_result));
}

bool ServingLabWindow::exportJson(const QString& path) {
  if (!m_result) {
    showError(tr("Nothing to export: run the benchmark or open a saved run first."));
    return false;
  }
  return writeFile(path, servingResultJson(*m_result));
}

void ServingLabWindow::closeEvent(QCloseEvent* e) {
  cancelRun();
  QMainWindow::closeEvent(e);
}

}  // namespace phaselab::ui
