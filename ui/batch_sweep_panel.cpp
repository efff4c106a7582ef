#include "batch_sweep_panel.h"

#include <QApplication>
#include <QChart>
#include <QChartView>
#include <QComboBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QGraphicsSimpleTextItem>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLegendMarker>
#include <QLineEdit>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QPointer>
#include <QProgressBar>
#include <QPushButton>
#include <QSpinBox>
#include <QTableWidget>
#include <QThread>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>
#include <cmath>
#include <functional>

#include "chart_scale.h"
#include "compare_charts.h"
#include "phaselab/compare.h"
#include "phaselab/log.h"
#include "phaselab/machine.h"

namespace phaselab::ui {

namespace {

enum PointColumn { kColBatch, kColPrefill, kColDecode, kColTpot, kColWeightsGbps, kColSpeedup, kPointColumns };

constexpr int kMaxBatch = 4096;  // as phaselab-cli bench --batch
const QColor kRidgeColor(0xb0, 0x00, 0x20);

struct SweepJob {
  std::string model;
  BackendOptions backend;
  std::vector<int> sizes;  // ascending
  int nPrompt = 0, nGen = 0;
  std::optional<HardwarePeaks> windowPeaks;  // usable, with the sweep's thread count: not measured again
};

// The threads a probe with `threads` runs on (0: one per physical core).
int probeThreads(int threads) { return threads > 0 ? threads : physical_core_count(); }

// What the worker reports as it goes; each callback posts to the GUI thread.
struct SweepSink {
  std::function<void(const QString& text, double fraction)> stage;
  std::function<void(const SweepSetup&)> setup;
  std::function<void(const BatchBenchPoint&)> point;
};

// Runs on the worker thread: load, backend, peaks (CPU), a warm-up, then
// every size. Owns the model and backend, so they die with the run.
Status runSweep(const SweepJob& job, const std::atomic<bool>& cancel, const SweepSink& sink) {
  sink.stage(BatchSweepPanel::tr("Loading the model…"), 0);
  auto model = Model::load(job.model);
  if (!model) return model.status();
  // Passes as `bench --batch` takes them: the backend's default for this
  // model, or more where a decode pass takes a token of every sequence.
  BackendOptions bo = job.backend;
  set_default_passes(&bo, **model, job.backend.max_batch);
  auto be = make_backend(*model, bo);
  if (!be) return be.status();
  Backend& backend = *be->backend;
  const Model& m = **model;
  SweepSetup setup;
  setup.backend = QString::fromStdString(backend.name());
  setup.fallbackReason = QString::fromStdString(be->fallback_reason);
  setup.batchedForward = backend.batched_forward();
  if (setup.backend.startsWith(QLatin1String("cpu"))) {
    // One figure per window: the phase meter's, where it applies.
    setup.peaksFromWindow = job.windowPeaks.has_value();
    if (setup.peaksFromWindow) {
      setup.peaks = *job.windowPeaks;
    } else {
      sink.stage(BatchSweepPanel::tr("Measuring the machine's read bandwidth and compute peaks…"), 0);
      setup.peaks = HardwareProbe::measure(job.backend.n_threads);
      setup.peaksForWindow = probeThreads(job.backend.n_threads) == physical_core_count();
    }
    const HardwarePeaks& peaks = setup.peaks;
    setup.peaksNote = peaks.note;
    // Doubtful peaks are not divided by here either (as in the phase meter):
    // a roofline from them would look measured and be wrong.
    setup.peaksDoubtful = !peaks.usable();
    setup.roof = peaks.usable()
                     ? decode_roofline(m, backend.name(), peaks.memoryBandwidth, peaks.peakInt8Ops, peaks.peakFlops)
                     : decode_roofline(m, backend.name(), 0, 0, 0);
  } else {
    setup.roof.weight_bytes = static_cast<double>(m.active_weight_bytes());
  }
  sink.setup(setup);
  // Page faults and thread start-up belong to no batch size.
  sink.stage(BatchSweepPanel::tr("Warming up…"), 0);
  if (auto w = bench_batch(backend, m, job.sizes.front(), std::min(job.nPrompt, 16), 2, 42, &cancel); !w)
    return w.status();
  // The work of a size grows about with its batch: weigh the progress so.
  double total = 0, done = 0;
  for (int b : job.sizes) total += b;
  for (size_t i = 0; i < job.sizes.size(); i++) {
    const int b = job.sizes[i];
    sink.stage(BatchSweepPanel::tr("Batch %1 (%2 of %3 sizes)…").arg(b).arg(i + 1).arg(job.sizes.size()), done / total);
    auto p = bench_batch(backend, m, b, job.nPrompt, job.nGen, 42, &cancel);
    if (!p) return p.status();
    done += b;
    sink.point(*p);
  }
  return Status::ok();
}

QString shortNumber(double v) { return QString::number(v, 'f', v >= 100 ? 0 : 1); }

}  // namespace


BatchSweepPanel::BatchSweepPanel(QWidget* parent) : QWidget(parent) {
  setObjectName(QStringLiteral("batchSweep"));
  auto* col = new QVBoxLayout(this);

  auto* about = new QLabel(
      tr("Batching decodes B sequences in one pass: the pass reads the weights once for all of them, so the "
         "aggregate tokens/s rises with B until the pass becomes compute-bound, while each sequence waits "
         "longer for its next token (its TPOT grows)."));
  about->setWordWrap(true);
  about->setObjectName(QStringLiteral("batchSweepAbout"));
  col->addWidget(about);

  auto* grid = new QGridLayout;
  m_model = new QComboBox;
  m_model->setAccessibleName(tr("Model"));
  m_model->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  m_model->setMinimumContentsLength(20);
  m_chooseModel = new QPushButton(tr("Choose…"));
  m_chooseModel->setAccessibleName(tr("Choose the model"));
  connect(m_chooseModel, &QPushButton::clicked, this, &BatchSweepPanel::chooseModel);
  auto* modelRow = new QHBoxLayout;
  modelRow->addWidget(m_model, 1);
  modelRow->addWidget(m_chooseModel);
  grid->addWidget(new QLabel(tr("Model:")), 0, 0);
  grid->addLayout(modelRow, 0, 1, 1, 5);

  m_backend = new QComboBox;
  for (const std::string& k : backend_kinds()) m_backend->addItem(QString::fromStdString(k));
  m_backend->setAccessibleName(tr("Backend"));
  m_threads = new QSpinBox;
  m_threads->setRange(0, 256);
  m_threads->setSpecialValueText(tr("one per physical core"));
  m_threads->setAccessibleName(tr("Threads"));
  grid->addWidget(new QLabel(tr("Backend:")), 1, 0);
  grid->addWidget(m_backend, 1, 1, Qt::AlignLeft);
  grid->addWidget(new QLabel(tr("Threads:")), 1, 2);
  grid->addWidget(m_threads, 1, 3);

  m_sizes = new QLineEdit(QStringLiteral("1,2,4,8,16,32"));
  m_sizes->setObjectName(QStringLiteral("batchSizes"));
  m_sizes->setAccessibleName(tr("Batch sizes"));
  m_sizes->setToolTip(tr("Sequences decoded together, from 1 to %1, separated by commas").arg(kMaxBatch));
  m_nPrompt = new QSpinBox;
  m_nPrompt->setRange(1, 1 << 16);
  m_nPrompt->setValue(128);
  m_nPrompt->setAccessibleName(tr("Prompt tokens"));
  m_nPrompt->setToolTip(tr("Random prompt tokens per sequence, prefilled together"));
  m_nGen = new QSpinBox;
  m_nGen->setRange(1, 1 << 16);
  m_nGen->setValue(32);
  m_nGen->setAccessibleName(tr("Generated tokens"));
  m_nGen->setToolTip(tr("Decode passes, each taking one token of every sequence"));
  grid->addWidget(new QLabel(tr("Batch sizes:")), 2, 0);
  grid->addWidget(m_sizes, 2, 1);
  grid->addWidget(new QLabel(tr("Prompt tokens:")), 2, 2);
  grid->addWidget(m_nPrompt, 2, 3);
  grid->addWidget(new QLabel(tr("Generated:")), 2, 4);
  grid->addWidget(m_nGen, 2, 5);
  grid->setColumnStretch(1, 2);
  col->addLayout(grid);

  auto* runRow = new QHBoxLayout;
  m_run = new QPushButton(tr("Run Sweep"));
  m_run->setObjectName(QStringLiteral("runBatchSweep"));
  connect(m_run, &QPushButton::clicked, this, &BatchSweepPanel::start);
  m_cancel = new QPushButton(tr("Cancel"));
  m_cancel->setObjectName(QStringLiteral("cancelBatchSweep"));
  m_cancel->setEnabled(false);
  connect(m_cancel, &QPushButton::clicked, this, &BatchSweepPanel::cancel);
  m_progress = new QProgressBar;
  m_progress->setRange(0, 1000);
  m_progress->setTextVisible(false);
  m_progress->setAccessibleName(tr("Progress"));
  runRow->addWidget(m_run);
  runRow->addWidget(m_cancel);
  runRow->addWidget(m_progress, 1);
  col->addLayout(runRow);
  m_status = new QLabel(tr("Choose a model and batch sizes, then Run Sweep."));
  m_status->setObjectName(QStringLiteral("batchSweepStatus"));
  m_status->setWordWrap(true);
  col->addWidget(m_status);
  m_summary = new QLabel;
  m_summary->setObjectName(QStringLiteral("batchSweepSummary"));
  m_summary->setWordWrap(true);
  m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_summary->hide();
  col->addWidget(m_summary);

  m_table = new QTableWidget(0, kPointColumns);
  m_table->setObjectName(QStringLiteral("batchSweepTable"));
  m_table->setAccessibleName(tr("Batch sweep results"));
  // Two-line headers keep the table narrow enough to leave the chart room at 800x600.
  m_table->setHorizontalHeaderLabels({tr("Batch"), tr("Prefill\ntok/s"), tr("Decode\ntok/s"), tr("TPOT\nms"),
                                      tr("Weights\nGB/s"), tr("vs\nbatch 1")});
  const QStringList tips = {tr("Sequences decoded together"),
                            tr("Prompt tokens of all sequences per second"),
                            tr("Generated tokens of all sequences per second (aggregate)"),
                            tr("Time per output token of each sequence: one decode pass"),
                            tr("Weights read per second: decode passes per second times the weights' size"),
                            tr("Aggregate decode tokens/s against batch 1")};
  for (int c = 0; c < kPointColumns; c++) m_table->horizontalHeaderItem(c)->setToolTip(tips[c]);
  m_table->verticalHeader()->setVisible(false);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_table->verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 8);
  m_table->setSizeAdjustPolicy(QAbstractScrollArea::AdjustToContents);  // as wide as its columns
  m_table->setSizePolicy(QSizePolicy::Maximum, QSizePolicy::Expanding);

  m_chart = new QChart;
  m_chartView = compareChartView(m_chart, tr("Decode throughput and time per token against batch size"));
  m_chartView->setObjectName(QStringLiteral("batchSweepChart"));
  m_ridgeLabel = new QGraphicsSimpleTextItem(m_chart);
  m_ridgeLabel->setBrush(kRidgeColor);
  m_ridgeLabel->hide();
  connect(m_chart, &QChart::plotAreaChanged, this, &BatchSweepPanel::placeRidgeLabel);
  auto* results = new QHBoxLayout;
  results->addWidget(m_table);
  results->addWidget(m_chartView, 1);
  col->addLayout(results, 1);
}

BatchSweepPanel::~BatchSweepPanel() {
  if (m_thread) {
    m_cancelFlag->store(true);
    m_thread->wait();
  }
}

void BatchSweepPanel::setModels(const QStringList& paths) {
  const QString current = model();
  QStringList all = paths;
  for (const QString& p : m_chosen)
    if (!all.contains(p)) all << p;
  all.removeDuplicates();
  QSignalBlocker block(m_model);
  m_model->clear();
  for (const QString& p : all) {
    m_model->addItem(QFileInfo(p).fileName(), p);
    m_model->setItemData(m_model->count() - 1, p, Qt::ToolTipRole);
  }
  const int keep = m_model->findData(current);
  m_model->setCurrentIndex(keep >= 0 ? keep : 0);
}

void BatchSweepPanel::setModel(const QString& path) {
  int i = m_model->findData(path);
  if (i < 0) {
    m_chosen << path;
    m_model->addItem(QFileInfo(path).fileName(), path);
    i = m_model->count() - 1;
    m_model->setItemData(i, path, Qt::ToolTipRole);
  }
  m_model->setCurrentIndex(i);
}

QString BatchSweepPanel::model() const { return m_model->currentData().toString(); }
void BatchSweepPanel::setBackendKind(const QString& kind) { m_backend->setCurrentText(kind); }
void BatchSweepPanel::setThreads(int threads) { m_threads->setValue(threads); }

void BatchSweepPanel::setSweep(const QString& sizes, int nPrompt, int nGen) {
  m_sizes->setText(sizes);
  m_nPrompt->setValue(nPrompt);
  m_nGen->setValue(nGen);
}

void BatchSweepPanel::setBlockedReason(const QString& reason) {
  m_blockedReason = reason;
  m_run->setEnabled(!isRunning() && reason.isEmpty());
  m_run->setToolTip(reason);
}

void BatchSweepPanel::chooseModel() {
  const QString dir = model().isEmpty() ? QString::fromStdString(user_model_dir()) : QFileInfo(model()).path();
  const QString p = QFileDialog::getOpenFileName(this, tr("Model for the batch sweep"), dir,
                                                 tr("GGUF models (*.gguf);;All files (*)"));
  if (!p.isEmpty()) setModel(p);
}

std::optional<std::vector<int>> BatchSweepPanel::parseSizes(const QString& text, QString* error) {
  auto sizes = parse_batch_sizes(text.toStdString());
  if (!sizes) {
    if (error) {
      const QString m = QString::fromStdString(sizes.status().message());
      *error = m.left(1).toUpper() + m.mid(1) + QLatin1Char('.');
    }
    return std::nullopt;
  }
  return *sizes;
}

void BatchSweepPanel::showError(const QString& message) {
  m_lastError = message;
  m_status->setText(QStringLiteral("<span style='color:#b00020'>%1</span>").arg(message.toHtmlEscaped()));
  spdlog::warn("batch sweep: {}", message.toStdString());
}

void BatchSweepPanel::setRunning(bool running) {
  m_run->setEnabled(!running && m_blockedReason.isEmpty());
  m_cancel->setEnabled(running);
  for (QWidget* w : {static_cast<QWidget*>(m_model), static_cast<QWidget*>(m_chooseModel), static_cast<QWidget*>(m_backend),
                     static_cast<QWidget*>(m_threads), static_cast<QWidget*>(m_sizes), static_cast<QWidget*>(m_nPrompt),
                     static_cast<QWidget*>(m_nGen)})
    w->setEnabled(!running);
  emit runningChanged(running);
}

bool BatchSweepPanel::start() {
  if (m_thread) return false;
  m_lastError.clear();
  auto refuse = [this](const QString& message) {
    showError(message);
    emit finished(false, message);
    return false;
  };
  if (!m_blockedReason.isEmpty()) return refuse(m_blockedReason);
  QString error;
  const auto sizes = parseSizes(m_sizes->text(), &error);
  if (!sizes) return refuse(error);
  if (model().isEmpty()) return refuse(tr("No model: add one in the Models tab or Choose… one here."));
  if (!QFileInfo(model()).isFile()) return refuse(tr("No such model file %1: choose another.").arg(model()));
  auto kind = parse_backend_kind(m_backend->currentText().toStdString());  // the menu's, so known
  if (!kind) return refuse(QString::fromStdString(kind.status().message()));

  SweepJob job;
  job.model = model().toStdString();
  job.backend = backend_options_from_environment();
  job.backend.kind = *kind;
  job.backend.n_threads = m_threads->value();
  job.backend.max_batch = std::max(64, sizes->back());  // one decode pass takes a token of every sequence
  job.sizes = *sizes;
  job.nPrompt = m_nPrompt->value();
  job.nGen = m_nGen->value();
  // The window's peaks (those the phase meter divides by), where usable and
  // measured with as many threads as this sweep runs.
  const HardwarePeaks windowPeaks = HardwareProbe::cached();
  if (windowPeaks.usable() && windowPeaks.threads == probeThreads(job.backend.n_threads)) job.windowPeaks = windowPeaks;

  m_points.clear();
  m_setup = SweepSetup{};
  m_plannedSizes = static_cast<int>(sizes->size());
  m_plannedMax = sizes->back();
  showPoints();
  m_summary->hide();
  m_progress->setValue(0);
  m_status->setText(tr("Starting…"));
  setRunning(true);
  m_cancelFlag = std::make_shared<std::atomic<bool>>(false);
  // The worker posts plain values to the GUI thread, queued on qApp (it
  // outlives the panel); the QPointer drops what arrives after the panel is gone.
  QPointer<BatchSweepPanel> self(this);
  auto post = [self](auto fn) {
    QMetaObject::invokeMethod(qApp, [self, fn] { if (self) fn(self.data()); }, Qt::QueuedConnection);
  };
  SweepSink sink;
  sink.stage = [post](const QString& text, double f) { post([text, f](BatchSweepPanel* p) { p->onStage(text, f); }); };
  sink.setup = [post](const SweepSetup& s) { post([s](BatchSweepPanel* p) { p->onSetup(s); }); };
  sink.point = [post](const BatchBenchPoint& pt) { post([pt](BatchSweepPanel* p) { p->onPoint(pt); }); };
  auto flag = m_cancelFlag;
  m_thread = QThread::create([job, flag, sink, post] {
    const Status st = runSweep(job, *flag, sink);
    const bool cancelled = st.code() == StatusCode::cancelled;
    const QString error = st || cancelled ? QString() : QString::fromStdString(st.message());
    post([error, cancelled](BatchSweepPanel* p) { p->onDone(error, cancelled); });
  });
  connect(m_thread, &QThread::finished, m_thread, &QObject::deleteLater);
  m_thread->start(QThread::LowPriority);
  return true;
}

void BatchSweepPanel::cancel() {
  if (!m_thread) return;
  m_cancelFlag->store(true);
  m_status->setText(tr("Cancelling…"));
}

void BatchSweepPanel::onStage(const QString& text, double fraction) {
  if (m_cancelFlag && m_cancelFlag->load()) return;  // keep "Cancelling…"
  m_status->setText(text);
  m_progress->setValue(static_cast<int>(fraction * 1000));
}

void BatchSweepPanel::onSetup(const SweepSetup& setup) {
  m_setup = setup;
  showSummary();
  if (setup.peaksForWindow) emit machinePeaksMeasured(setup.peaks);
}

void BatchSweepPanel::onPoint(const BatchBenchPoint& p) {
  m_points.push_back(p);
  showPoints();
}

void BatchSweepPanel::onDone(const QString& error, bool cancelled) {
  if (m_thread) m_thread->wait();
  m_thread = nullptr;
  setRunning(false);
  if (cancelled) {
    m_status->setText(tr("Cancelled after %1 of %2 sizes.").arg(m_points.size()).arg(m_plannedSizes));
    m_progress->setValue(0);
    emit finished(false, tr("cancelled"));
    return;
  }
  if (!error.isEmpty()) {
    QString hint;
    if (error.contains(QLatin1String("context")))
      hint = tr(" Lower the prompt or generated tokens.");
    else if (m_backend->currentText().toStdString() == to_string(BackendKind::cuda))
      hint = tr(" Choose a CPU backend to measure without the GPU.");
    showError(tr("The sweep stopped: %1.%2").arg(error, hint));
    emit finished(false, m_lastError);
    return;
  }
  m_progress->setValue(1000);
  m_status->setText(tr("Done: %1 batch sizes measured on the %2 backend.").arg(m_points.size()).arg(m_setup.backend));
  emit finished(true, QString());
}

void BatchSweepPanel::showSummary() {
  const SweepSetup& s = m_setup;
  QStringList lines;
  if (!s.fallbackReason.isEmpty()) lines << tr("%1; using the CPU backend.").arg(s.fallbackReason);
  if (!s.batchedForward)
    lines << tr("The %1 backend runs a batch's sequences one after another (no shared pass yet): expect no gain "
                "from batching.")
                 .arg(s.backend);
  const DecodeRoof& r = s.roof;
  if (r.ridge_batch > 0) {
    lines << tr("%1 backend · machine: read %2 GB/s, %3 %4 %5 · weights %6 MiB, %7 G%8 per decoded token (output matrix included) · decode turns "
                "compute-bound near batch %9, where its ceiling is ≈ %10 tokens/s")
                 .arg(s.backend, shortNumber(r.read_bytes_per_s / 1e9), r.int8 ? tr("int8") : tr("FP32"),
                      shortNumber(r.ops_per_s / 1e9), r.int8 ? tr("GOP/s") : tr("GFLOP/s"),
                      shortNumber(r.weight_bytes / 1048576.0), QString::number(r.ops_per_token / 1e9, 'g', 3),
                      r.int8 ? tr("OP") : tr("FLOP"), QString::number(std::lround(r.ridge_batch)))
                 .arg(std::lround(r.compute_ceiling_tps()));
  } else if (s.peaksDoubtful) {
    lines << tr("%1 backend · no roofline: this machine's peaks looked doubtful when measured just now (%2); run the "
                "sweep again while nothing else runs.")
                 .arg(s.backend, s.peaksNote);
  } else {
    lines << tr("%1 backend · the roofline is drawn for CPU backends (their peaks are measured here).").arg(s.backend);
  }
  if (s.peaksFromWindow)
    lines << tr("Machine peaks: the window's, which the phase meter divides by (\"Measure again\" there measures "
                "them anew).");
  else if (s.peaksForWindow)
    lines << tr("Machine peaks: measured for this sweep, and now the window's: the phase meter divides by them too.");
  else if (s.peaks.valid())
    lines << (s.peaks.threads == 1 ? tr("Machine peaks: measured for this sweep with 1 thread")
                                   : tr("Machine peaks: measured for this sweep with %1 threads").arg(s.peaks.threads)) +
                 tr("; the phase meter's are measured with one per physical core.");
  if (!s.peaksNote.isEmpty() && !s.peaksDoubtful) lines << tr("Machine peaks: %1").arg(s.peaksNote);
  m_summary->setText(lines.join(QLatin1Char('\n')));
  m_summary->show();
  showChart();
}

void BatchSweepPanel::showPoints() {
  m_table->setRowCount(0);
  double base = 0;
  for (const BatchBenchPoint& p : m_points)
    if (p.batch == 1) base = p.tg_tps;
  for (const BatchBenchPoint& p : m_points) {
    const int i = m_table->rowCount();
    m_table->insertRow(i);
    auto cell = [&](int c, const QString& text) {
      auto* item = new QTableWidgetItem(text);
      item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
      m_table->setItem(i, c, item);
    };
    // Decode reads the weights once per pass: passes per second times the weights.
    const double gbps = m_setup.roof.weights_gbps(p.tpot_ms);
    cell(kColBatch, QString::number(p.batch));
    cell(kColPrefill, QString::number(p.pp_tps, 'f', 1));
    cell(kColDecode, QString::number(p.tg_tps, 'f', 1));
    cell(kColTpot, QString::number(p.tpot_ms, 'f', 2));
    cell(kColWeightsGbps, QString::number(gbps, 'f', 1));
    cell(kColSpeedup, base > 0 ? QStringLiteral("%1×").arg(p.tg_tps / base, 0, 'f', 2) : QString());
  }
  showChart();
}

// Aggregate decode tokens/s (left axis) and TPOT (right axis) on a log2
// batch axis; the roofline's ceiling dashed and its ridge as a vertical line.
void BatchSweepPanel::showChart() {
  clearChart(m_chart);
  m_ridgeLabel->hide();
  if (m_points.empty()) return;
  const DecodeRoof& roof = m_setup.roof;
  double maxTg = 0, maxTpot = 0;
  for (const BatchBenchPoint& p : m_points) maxTg = std::max(maxTg, p.tg_tps), maxTpot = std::max(maxTpot, p.tpot_ms);
  // The axis spans the sizes planned, so that it does not move as points arrive.
  const double minB = m_points.front().batch, maxB = std::max(m_points.back().batch, m_plannedMax);
  // A ridge far past the sizes measured would squeeze them into a corner: the summary names it instead.
  const bool ridgeShown = roof.ridge_batch > 0 && roof.ridge_batch >= 1 && roof.ridge_batch <= 8 * maxB;
  const double xLo = std::min(minB, ridgeShown ? roof.ridge_batch : minB) / 1.4;
  const double xHi = std::max(maxB, ridgeShown ? roof.ridge_batch : maxB) * 1.4;

  auto* x = new QLogValueAxis;
  x->setBase(2);
  x->setLabelFormat(QStringLiteral("%g"));
  x->setTitleText(tr("batch size (sequences per decode pass)"));
  x->setRange(xLo, xHi);
  auto* y = new QValueAxis;
  y->setTitleText(tr("tokens/s, all sequences"));
  auto* y2 = new QValueAxis;
  y2->setTitleText(tr("TPOT ms, each sequence"));
  y2->setGridLineVisible(false);
  m_chart->addAxis(x, Qt::AlignBottom);
  m_chart->addAxis(y, Qt::AlignLeft);
  m_chart->addAxis(y2, Qt::AlignRight);
  auto add = [&](QLineSeries* s, QValueAxis* axis) {
    m_chart->addSeries(s);
    s->attachAxis(x);
    s->attachAxis(axis);
  };

  auto* tg = new QLineSeries;
  tg->setName(tr("decode tok/s (all)"));
  auto* tpot = new QLineSeries;
  tpot->setName(tr("TPOT ms (each)"));
  for (const BatchBenchPoint& p : m_points) {
    tg->append(p.batch, p.tg_tps);
    tpot->append(p.batch, p.tpot_ms);
  }
  tg->setPointsVisible(true);
  tpot->setPointsVisible(true);
  add(tg, y);
  add(tpot, y2);

  double top = maxTg;
  if (roof.read_bytes_per_s > 0 && roof.weight_bytes > 0) {
    auto* ceiling = new QLineSeries;
    ceiling->setName(tr("bandwidth ceiling"));
    // Samples even on the log axis, plus the ridge itself so the knee is sharp.
    constexpr int kSamples = 48;
    for (int i = 0; i <= kSamples; i++) {
      const double b = xLo * std::pow(xHi / xLo, static_cast<double>(i) / kSamples);
      if (ridgeShown && i > 0 && b > roof.ridge_batch && ceiling->at(ceiling->count() - 1).x() < roof.ridge_batch)
        ceiling->append(roof.ridge_batch, roof.ceiling_tps(roof.ridge_batch));
      ceiling->append(b, roof.ceiling_tps(b));
    }
    add(ceiling, y);
    QPen pen = ceiling->pen();
    pen.setStyle(Qt::DashLine);
    ceiling->setPen(pen);
    // The measured points stay readable: the ceiling may leave the top of the plot.
    top = std::max(top, std::min(roof.ceiling_tps(xHi), 3 * maxTg));
  }
  const NiceScale ys = niceScale(0, top > 0 ? top * 1.1 : 1, 6);
  applyScale(y, ys);
  applyScale(y2, niceScale(0, maxTpot > 0 ? maxTpot * 1.15 : 1, 6));
  if (ridgeShown) {
    auto* ridge = new QLineSeries;
    ridge->setName(tr("compute-bound beyond ≈ %1").arg(std::lround(roof.ridge_batch)));
    ridge->append(roof.ridge_batch, ys.min);
    ridge->append(roof.ridge_batch, ys.max);
    add(ridge, y);
    ridge->setPen(QPen(kRidgeColor, 2, Qt::DotLine));
    // Named on the plot beside the line rather than in the legend.
    for (QLegendMarker* m : m_chart->legend()->markers(ridge)) m->setVisible(false);
    m_ridgeLabel->setText(ridge->name());
    m_ridgeLabel->show();
    placeRidgeLabel();
  }
  m_chart->legend()->setVisible(true);
}

// At the top of the plot on the compute-bound side of the line, or on the
// other side where the plot ends too soon.
void BatchSweepPanel::placeRidgeLabel() {
  if (!m_ridgeLabel->isVisible() || m_chart->series().isEmpty()) return;
  QAbstractSeries* ridge = m_chart->series().last();
  const QRectF plot = m_chart->plotArea();
  const double lineX = m_chart->mapToPosition(QPointF(m_setup.roof.ridge_batch, 0), ridge).x();
  const double w = m_ridgeLabel->boundingRect().width();
  const double x = lineX + 6 + w <= plot.right() ? lineX + 6 : lineX - 6 - w;
  m_ridgeLabel->setPos(x, plot.top() + 4);
}

QByteArray BatchSweepPanel::pointsJson() const {
  QJsonArray arr;
  for (const BatchBenchPoint& p : m_points)
    arr.append(QJsonObject{{"batch", p.batch},
                           {"n_prompt", p.n_prompt},
                           {"n_gen", p.n_gen},
                           {"prefill_ms", p.prefill_ms},
                           {"decode_ms", p.decode_ms},
                           {"pp_tps", p.pp_tps},
                           {"tg_tps", p.tg_tps},
                           {"tpot_ms", p.tpot_ms},
                           {"kv_mib", p.kv_mib},
                           {"backend", m_setup.backend},
                           {"decode_ridge_batch", m_setup.roof.ridge_batch}});
  return QJsonDocument(arr).toJson(QJsonDocument::Indented);
}

}  // namespace phaselab::ui
