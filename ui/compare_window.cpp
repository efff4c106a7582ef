#include "compare_window.h"

#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QCloseEvent>
#include <QComboBox>
#include <QInputDialog>
#include <QDateTime>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMessageBox>
#include <QProgressBar>
#include <QPushButton>
#include <QSaveFile>
#include <QScreen>
#include <QScrollArea>
#include <QSpinBox>
#include <QSplitter>
#include <QTabWidget>
#include <QTableWidget>
#include <QVBoxLayout>

#include "batch_sweep_panel.h"
#include "chart_scale.h"
#include "compare_charts.h"
#include "compare_process.h"
#include "conversation_store.h"
#include "phaselab/backend.h"
#include "phaselab/log.h"
#include "phaselab/prune.h"

namespace phaselab::ui {

namespace {

enum VariantColumn { kColName, kColSource, kColBackend, kColKv, kColSpec, kColDraft, kVariantColumns };

QString typeLabel(const CompareVariant& v) {
  QString s = v.quantize_to ? QString::fromLatin1(file_type_name(*v.quantize_to).data(),
                                                  static_cast<int>(file_type_name(*v.quantize_to).size()))
                            : QObject::tr("as is");
  if (!v.prune.empty() && v.prune.rfind("ffn:", 0) == 0) {
    const QString keep = QString::fromStdString(v.prune).mid(4);  // "ffn:" off
    s = v.quantize_to ? s + QObject::tr(", FFN %1").arg(keep) : QObject::tr("FFN %1").arg(keep);
  } else if (!v.prune.empty()) {
    const QString layers = QString::fromStdString(v.prune).mid(7);  // "layers:" off
    s = v.quantize_to ? s + QObject::tr(", pruned %1").arg(layers) : QObject::tr("pruned %1").arg(layers);
  }
  return s;
}

// "12.3 ± 0.4": a mean and its sample standard deviation, or the mean alone
// when there is no spread to show (one run, or a row saved without it).
QString meanSd(double mean, double sd, int repetitions, int decimals = 1) {
  if (repetitions < 2) return QString::number(mean, 'f', decimals);
  return QStringLiteral("%1 ± %2").arg(mean, 0, 'f', decimals).arg(sd, 0, 'f', decimals);
}

}  // namespace

CompareWindow::CompareWindow(ConversationStore* store, QWidget* parent) : QMainWindow(parent), m_store(store) {
  setWindowTitle(tr("Compare models — PhaseLab"));
  setObjectName(QStringLiteral("compareWindow"));
  setAttribute(Qt::WA_DeleteOnClose, false);
  // 1100x760 where the screen has room; on a smaller one (800x600) the
  // screen's available area less a window frame, so nothing starts off-screen.
  QSize size(1100, 760);
  if (const QScreen* s = screen()) size = size.boundedTo(s->availableGeometry().size() - QSize(16, 48));
  resize(size);
  m_process = new CompareProcess(this);
  connect(m_process, &CompareProcess::progress, this, &CompareWindow::onProgress);
  connect(m_process, &CompareProcess::rowMeasured, this, &CompareWindow::onRowMeasured);
  connect(m_process, &CompareProcess::finished, this, &CompareWindow::onDone);

  auto* central = new QWidget;
  auto* col = new QVBoxLayout(central);
  col->setContentsMargins(6, 6, 6, 6);
  col->addLayout(buildSavedRunsRow());
  // The variants and how they are measured above, the results below.
  auto* split = new QSplitter(Qt::Vertical);
  split->setChildrenCollapsible(false);
  split->addWidget(buildVariantsPanel());
  split->addWidget(buildResultTabs());
  split->setStretchFactor(1, 2);
  col->addWidget(split, 1);
  // Sized to fit 800x600; on a smaller screen (or a larger font) the page
  // scrolls instead of cutting off its buttons and legends.
  m_scroll = new QScrollArea;
  m_scroll->setObjectName(QStringLiteral("compareModelsScroll"));
  m_scroll->setWidgetResizable(true);
  m_scroll->setFrameShape(QFrame::NoFrame);
  m_scroll->setWidget(central);
  buildModes(m_scroll);
  refreshSavedRuns();
}

QHBoxLayout* CompareWindow::buildSavedRunsRow() {
  auto* savedRow = new QHBoxLayout;
  savedRow->addWidget(new QLabel(tr("Saved runs:")));
  m_saved = new QComboBox;
  m_saved->setObjectName(QStringLiteral("savedRuns"));
  m_saved->setAccessibleName(tr("Saved runs"));
  m_saved->setMinimumContentsLength(24);
  m_saved->setSizeAdjustPolicy(QComboBox::AdjustToMinimumContentsLengthWithIcon);
  savedRow->addWidget(m_saved, 1);
  auto* openSaved = new QPushButton(tr("Open"));
  openSaved->setAccessibleName(tr("Open the saved run"));
  openSaved->setToolTip(tr("Its results, and its variants and settings, so that Run repeats it"));
  savedRow->addWidget(openSaved);
  connect(openSaved, &QPushButton::clicked, this, [this] {
    if (m_saved->currentData().isValid()) openSavedRun(m_saved->currentData().toLongLong());
  });
  // Export CSV / JSON: here rather than in a toolbar, which took a row of
  // the 600 pixels an 800x600 screen has.
  auto* csv = new QPushButton(tr("Export CSV…"));
  connect(csv, &QPushButton::clicked, this, [this] {
    const QString p = QFileDialog::getSaveFileName(this, tr("Export CSV"), QDir::home().filePath(QStringLiteral("compare.csv")),
                                                   tr("CSV (*.csv)"));
    if (!p.isEmpty()) exportCsv(p);
  });
  auto* json = new QPushButton(tr("Export JSON…"));
  connect(json, &QPushButton::clicked, this, [this] {
    const QString p = QFileDialog::getSaveFileName(this, tr("Export JSON"), QDir::home().filePath(QStringLiteral("compare.json")),
                                                   tr("JSON (*.json)"));
    if (!p.isEmpty()) exportJson(p);
  });
  savedRow->addSpacing(12);
  savedRow->addWidget(csv);
  savedRow->addWidget(json);
  return savedRow;
}

// The variants table, its buttons, the measurement options, Run and the status.
QWidget* CompareWindow::buildVariantsPanel() {
  m_variants = new QTableWidget(0, kVariantColumns);
  m_variants->setObjectName(QStringLiteral("variantsTable"));
  m_variants->setAccessibleName(tr("Variants"));
  m_variants->setHorizontalHeaderLabels(
      {tr("Variant"), tr("Made as"), tr("Backend"), tr("KV cache"), tr("Speculative"), tr("Draft of first")});
  m_variants->horizontalHeaderItem(kColDraft)->setToolTip(
      tr("Also measure this variant as a speculative draft for the first: the first decodes plainly and with it "
         "drafting, and the acceptance and speed-up are shown beside its KL divergence"));
  m_variants->horizontalHeader()->setSectionResizeMode(kColName, QHeaderView::Stretch);
  m_variants->verticalHeader()->setVisible(false);
  m_variants->setSelectionBehavior(QAbstractItemView::SelectRows);
  m_variants->setMinimumHeight(80);
  // As tall as its rows (the splitter gives the rest to the results), not
  // a fixed 192 pixels of mostly empty table.
  m_variants->setSizeAdjustPolicy(QAbstractScrollArea::AdjustToContents);
  QHBoxLayout* variantButtons = buildVariantButtons();
  QFormLayout* form = buildMeasurementForm();
  QHBoxLayout* runRow = buildRunRow();

  auto* top = new QWidget;
  auto* topCol = new QVBoxLayout(top);
  topCol->setContentsMargins(0, 0, 0, 0);
  topCol->setSpacing(4);
  topCol->addWidget(m_variants, 1);
  topCol->addLayout(variantButtons);
  topCol->addLayout(form);
  topCol->addLayout(runRow);
  topCol->addWidget(m_status);
  return top;
}

QHBoxLayout* CompareWindow::buildVariantButtons() {
  auto* variantButtons = new QHBoxLayout;
  m_addModel = new QPushButton(tr("Add Model…"));
  m_addModel->setObjectName(QStringLiteral("addModel"));
  connect(m_addModel, &QPushButton::clicked, this, &CompareWindow::chooseModel);
  m_addQuant = new QPushButton(tr("Add Quantization"));
  m_addQuant->setObjectName(QStringLiteral("addQuantization"));
  m_addQuant->setToolTip(tr("A quantization of the first model, made once and kept in %1")
                             .arg(QString::fromStdString(default_compare_cache_dir())));
  auto* quantMenu = new QMenu(m_addQuant);
  for (FileType t : supported_file_types()) {
    const QString name = QString::fromLatin1(file_type_name(t).data(), static_cast<int>(file_type_name(t).size()));
    quantMenu->addAction(name, this, [this, name] { addQuantization(name); });
  }
  m_addQuant->setMenu(quantMenu);
  m_addPrune = new QPushButton(tr("Add Pruned"));
  m_addPrune->setObjectName(QStringLiteral("addPruned"));
  m_addPrune->setToolTip(tr("The first model with a run of layers dropped or its feed-forwards narrowed, made "
                            "once and kept beside the quantizations"));
  auto* pruneMenu = new QMenu(m_addPrune);
  for (int n : {1, 2, 3, 6})
    pruneMenu->addAction(tr("Drop %n layer(s) that change the least", nullptr, n), this,
                         [this, n] { addPruned(QStringLiteral("layers:n%1").arg(n)); });
  pruneMenu->addSeparator();
  for (int keep : {75, 50})
    pruneMenu->addAction(tr("Keep %1% of every FFN's neurons (the most important)").arg(keep), this,
                         [this, keep] { addPruned(QStringLiteral("ffn:%1%").arg(keep)); });
  pruneMenu->addSeparator();
  pruneMenu->addAction(tr("Drop layers…"), this, [this] {
    bool ok = false;
    const QString layers = QInputDialog::getText(this, tr("Drop layers"),
                                                 tr("Layers to drop, counted from 0 (e.g. 10-12):"), QLineEdit::Normal,
                                                 QString(), &ok);
    if (ok && !layers.trimmed().isEmpty()) addPruned(QStringLiteral("layers:") + layers.trimmed());
  });
  m_addPrune->setMenu(pruneMenu);
  m_remove = new QPushButton(tr("Remove"));
  connect(m_remove, &QPushButton::clicked, this, &CompareWindow::removeSelected);
  variantButtons->addWidget(m_addModel);
  variantButtons->addWidget(m_addQuant);
  variantButtons->addWidget(m_addPrune);
  variantButtons->addWidget(m_remove);
  variantButtons->addStretch(1);
  return variantButtons;
}

QFormLayout* CompareWindow::buildMeasurementForm() {
  auto* form = new QFormLayout;
  auto* textRow = new QHBoxLayout;
  m_text = new QLineEdit(QString::fromStdString(bundled_text_path("eval-en.txt")));
  m_text->setAccessibleName(tr("Evaluation text"));
  m_text->setPlaceholderText(tr("a UTF-8 text file"));
  auto* browse = new QPushButton(tr("Choose…"));
  browse->setAccessibleName(tr("Choose the evaluation text"));
  connect(browse, &QPushButton::clicked, this, &CompareWindow::chooseText);
  textRow->addWidget(m_text, 1);
  textRow->addWidget(browse);
  form->addRow(tr("Text (perplexity, KL):"), textRow);
  m_chunks = new QSpinBox;
  m_chunks->setRange(1, 10000);
  m_chunks->setValue(8);
  m_chunks->setAccessibleName(tr("Perplexity chunks"));
  m_chunks->setToolTip(tr("Chunks of 512 tokens scored (their second halves), as llama-perplexity does"));
  m_threads = new QSpinBox;
  m_threads->setRange(0, 256);
  m_threads->setSpecialValueText(tr("one per physical core"));
  m_threads->setAccessibleName(tr("Threads"));
  // Chunks and threads share a row: the window fits 800x600.
  auto* sizesRow = new QHBoxLayout;
  sizesRow->addWidget(m_chunks);
  sizesRow->addSpacing(12);
  sizesRow->addWidget(new QLabel(tr("Threads:")));
  sizesRow->addWidget(m_threads);
  sizesRow->addStretch(1);
  form->addRow(tr("Chunks of 512 tokens:"), sizesRow);
  form->setVerticalSpacing(4);
  return form;
}

// Run, Cancel and the progress bar; the status line under them.
QHBoxLayout* CompareWindow::buildRunRow() {
  auto* runRow = new QHBoxLayout;
  m_run = new QPushButton(tr("Run"));
  m_run->setObjectName(QStringLiteral("runCompare"));
  m_run->setDefault(true);
  connect(m_run, &QPushButton::clicked, this, &CompareWindow::startRun);
  m_cancel = new QPushButton(tr("Cancel"));
  m_cancel->setObjectName(QStringLiteral("cancelCompare"));
  m_cancel->setEnabled(false);
  connect(m_cancel, &QPushButton::clicked, this, &CompareWindow::cancelRun);
  m_progress = new QProgressBar;
  m_progress->setRange(0, 1000);
  m_progress->setValue(0);
  m_progress->setTextVisible(false);
  m_progress->setAccessibleName(tr("Progress"));
  m_status = new QLabel(tr("Add models and quantizations, then Run. Each run is measured by phaselab-cli "
                           "in a process of its own."));
  m_status->setObjectName(QStringLiteral("compareStatus"));
  m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_status->setMinimumWidth(1);  // a long message is cut, not widening the window
  runRow->addWidget(m_run);
  runRow->addWidget(m_cancel);
  runRow->addWidget(m_progress, 1);
  return runRow;
}

// The results: a table and the charts.
QTabWidget* CompareWindow::buildResultTabs() {
  m_tabs = new QTabWidget;
  m_tabs->setObjectName(QStringLiteral("compareTabs"));
  m_results = new QTableWidget(0, 13);
  m_results->setObjectName(QStringLiteral("compareResults"));
  m_results->setAccessibleName(tr("Results"));
  m_results->setHorizontalHeaderLabels({tr("Variant"), tr("Types"), tr("Size MiB"), tr("Prefill tok/s"),
                                        tr("Decode tok/s"), tr("TTFT ms"), tr("Peak RSS MiB"), tr("Perplexity"),
                                        tr("KL divergence"), tr("Top-1 agree"), tr("RMS Δp"), tr("Sampled accept"),
                                        tr("As draft")});
  m_results->horizontalHeaderItem(9)->setToolTip(
      tr("Positions of the text where the variant's most likely token is the first variant's: the share of tokens "
         "it would have drafted that greedy speculative decoding keeps"));
  m_results->horizontalHeaderItem(11)->setToolTip(
      tr("As a draft of the first variant sampling at temperature 1, the share of drafted tokens kept, "
         "sum of min(p, q) on the text (over the first's 32 most likely tokens: a lower bound)"));
  m_results->horizontalHeaderItem(12)->setToolTip(
      tr("Variants marked 'Draft of first': the first variant decoding with this one drafting against decoding "
         "plainly, measured one after the other; the acceptance and tokens per target pass while decoding"));
  const QString spread = tr("mean ± sample standard deviation of the runs after a warm-up (phaselab-cli compare -r)");
  for (int c : {3, 4, 5}) m_results->horizontalHeaderItem(c)->setToolTip(spread);
  m_results->horizontalHeaderItem(6)->setToolTip(
      tr("The kernel's high-water mark of the phaselab-cli process that measured the variant, reset before it: "
         "the variant's own, not this window's"));
  m_results->verticalHeader()->setVisible(false);
  m_results->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_results->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_tabs->addTab(m_results, tr("Table"));
  // Prefill and decode each on an axis of their own: decode's tens of
  // tokens/s were bars a few pixels tall under prefill's thousands.
  auto* speed = new QWidget;
  auto* speedRow = new QHBoxLayout(speed);
  speedRow->setContentsMargins(0, 0, 0, 0);
  m_prefillChart = new QChart;
  speedRow->addWidget(compareChartView(m_prefillChart, tr("Prefill tokens/s")));
  m_decodeChart = new QChart;
  speedRow->addWidget(compareChartView(m_decodeChart, tr("Decode tokens/s")));
  m_tabs->addTab(speed, tr("Speed"));
  m_qualityChart = new QChart;
  m_tabs->addTab(compareChartView(m_qualityChart, tr("Decode speed against KL divergence (point size: peak memory)")),
                 tr("Speed vs quality"));
  m_memoryChart = new QChart;
  m_tabs->addTab(compareChartView(m_memoryChart, tr("File size and peak memory (MiB)")), tr("Memory"));
  m_acceptanceChart = new QChart;
  m_tabs->addTab(compareChartView(m_acceptanceChart,
                                  tr("Drafts: acceptance against KL divergence from the first variant "
                                     "(● greedy, ■ sampled, on the text; ★ decoding)")),
                 tr("Drafts"));
  return m_tabs;
}

void CompareWindow::buildModes(QWidget* models) {
  // The two modes share the window; one runs at a time, as both measure speed.
  m_sweep = new BatchSweepPanel;
  connect(m_sweep, &BatchSweepPanel::finished, this, &CompareWindow::batchSweepFinished);
  connect(m_sweep, &BatchSweepPanel::runningChanged, this, [this](bool running) {
    m_run->setEnabled(!running && !isRunning());
    m_run->setToolTip(running ? tr("A batch sweep is running: wait for it or cancel it.") : QString());
  });
  m_modes = new QTabWidget;
  m_modes->setObjectName(QStringLiteral("compareModes"));
  m_modes->setDocumentMode(true);
  m_modes->addTab(models, tr("Models"));
  m_modes->addTab(m_sweep, tr("Batch sweep"));
  setCentralWidget(m_modes);
}

// A running child is stopped (and waited for) by CompareProcess's
// destructor, first, while this window can still take its signals.
CompareWindow::~CompareWindow() {
  delete m_process;
  m_process = nullptr;
}

// The model comparison's charts (the batch sweep's is batchSweep()->chartView()).
QList<QChartView*> CompareWindow::chartViews() const { return m_tabs->findChildren<QChartView*>(); }

// As tall as its rows, but in a short window (an 800x600 screen's) at most
// three rows tall, scrolling past them: five rows took the height the charts
// need (a Drafts chart 150 pixels high had no readable axis).
void CompareWindow::fitVariantsTable() {
  const int rows = m_variants->rowCount();
  const bool shortScreen = height() < 700;
  const int shown = shortScreen ? std::min(rows, 3) : rows;
  int h = m_variants->horizontalHeader()->sizeHint().height() + 2 * m_variants->frameWidth() + 4;
  for (int r = 0; r < shown; r++) h += m_variants->rowHeight(r);
  if (shown < rows) h += m_variants->rowHeight(0) / 2;  // half a row more: there is more to scroll to
  m_variants->setMaximumHeight(shortScreen ? std::max(m_variants->minimumHeight(), h) : QWIDGETSIZE_MAX);
}

void CompareWindow::offerVariantModels() {
  QStringList files;
  for (const CompareVariant& v : variants()) files << QString::fromStdString(v.file);
  files.removeDuplicates();
  m_sweep->setModels(files);
}

void CompareWindow::showBatchSweep() { m_modes->setCurrentWidget(m_sweep); }
void CompareWindow::setBatchModel(const QString& path) { m_sweep->setModel(path); }
void CompareWindow::setBatchBackend(const QString& kind) { m_sweep->setBackendKind(kind); }
void CompareWindow::setBatchSweep(const QString& sizes, int nPrompt, int nGen) { m_sweep->setSweep(sizes, nPrompt, nGen); }
bool CompareWindow::startBatchSweep() { return m_sweep->start(); }
void CompareWindow::cancelBatchSweep() { m_sweep->cancel(); }
bool CompareWindow::isBatchSweepRunning() const { return m_sweep->isRunning(); }
const std::vector<BatchBenchPoint>& CompareWindow::batchPoints() const { return m_sweep->points(); }
double CompareWindow::batchRidge() const { return m_sweep->ridge(); }

void CompareWindow::addVariantRow(const CompareVariant& v) {
  const int r = m_variants->rowCount();
  m_variants->insertRow(r);
  auto* name = new QTableWidgetItem(QFileInfo(QString::fromStdString(v.file)).fileName());
  name->setData(Qt::UserRole, QString::fromStdString(v.file));
  name->setToolTip(QString::fromStdString(v.file));
  name->setFlags(name->flags() & ~Qt::ItemIsEditable);
  m_variants->setItem(r, kColName, name);
  auto* src = new QTableWidgetItem(typeLabel(v));
  src->setData(Qt::UserRole, v.quantize_to ? static_cast<int>(*v.quantize_to) : -1);
  src->setData(Qt::UserRole + 1, QString::fromStdString(v.prune));
  if (v.prune.rfind("ffn:", 0) == 0)
    src->setToolTip(tr("Every layer's feed-forward cut to %1 of its neurons: those with the largest activation "
                       "norm on the text times the weight they write with (structured Wanda)")
                        .arg(QString::fromStdString(v.prune).mid(4)));
  else if (!v.prune.empty())
    src->setToolTip(v.prune.rfind("layers:n", 0) == 0
                        ? tr("The %1 consecutive layers that change the residual stream least on the text, "
                             "dropped (chosen when the run starts)")
                              .arg(QString::fromStdString(v.prune).mid(8))
                        : tr("Layers %1 dropped").arg(QString::fromStdString(v.prune).mid(7)));
  src->setFlags(src->flags() & ~Qt::ItemIsEditable);
  m_variants->setItem(r, kColSource, src);
  auto* backend = new QComboBox;
  for (const std::string& k : backend_kinds()) backend->addItem(QString::fromStdString(k));
  backend->setCurrentText(QString::fromStdString(v.backend));
  backend->setAccessibleName(tr("Backend"));
  m_variants->setCellWidget(r, kColBackend, backend);
  auto* kv = new QCheckBox;
  kv->setChecked(v.kv_cache);
  kv->setAccessibleName(tr("KV cache"));
  m_variants->setCellWidget(r, kColKv, kv);
  auto* spec = new QComboBox;
  spec->addItem(tr("off"), QString::fromLatin1(to_string(SpeculativeMode::off)));
  spec->addItem(tr("prompt lookup"), QString::fromLatin1(to_string(SpeculativeMode::prompt_lookup)));
  spec->addItem(tr("self (layers skipped)"), QString::fromLatin1(to_string(SpeculativeMode::self_draft)));
  spec->setCurrentIndex(std::max(0, spec->findData(QString::fromStdString(v.speculative))));
  spec->setAccessibleName(tr("Speculative decoding"));
  m_variants->setCellWidget(r, kColSpec, spec);
  auto* draft = new QCheckBox;
  draft->setChecked(v.draft);
  draft->setAccessibleName(tr("Draft of the first variant"));
  draft->setToolTip(tr("Measure as a speculative draft for the first variant (the target)"));
  m_variants->setCellWidget(r, kColDraft, draft);
  offerVariantModels();
  fitVariantsTable();
}

void CompareWindow::addModel(const QString& path) {
  CompareVariant v;
  v.file = path.toStdString();
  addVariantRow(v);
}

bool CompareWindow::addQuantization(const QString& type) {
  const auto ft = parse_file_type(type.toStdString());
  if (!ft) {
    showError(tr("Unknown quantization type %1").arg(type));
    return false;
  }
  if (m_variants->rowCount() == 0) {
    showError(tr("Add a model first: quantizations are made from the first model."));
    return false;
  }
  CompareVariant v;
  v.file = m_variants->item(0, kColName)->data(Qt::UserRole).toString().toStdString();
  v.quantize_to = *ft;
  addVariantRow(v);
  return true;
}

bool CompareWindow::addPruned(const QString& spec) {
  if (auto p = parse_prune_spec(spec.toStdString()); !p) {
    showError(QString::fromStdString(p.status().message()));
    return false;
  }
  if (m_variants->rowCount() == 0) {
    showError(tr("Add a model first: pruned variants are made from the first model."));
    return false;
  }
  CompareVariant v;
  v.file = m_variants->item(0, kColName)->data(Qt::UserRole).toString().toStdString();
  v.prune = spec.toStdString();
  addVariantRow(v);
  return true;
}

void CompareWindow::setDraft(int row, bool draft) {
  if (auto* box = row >= 0 && row < m_variants->rowCount() ? qobject_cast<QCheckBox*>(m_variants->cellWidget(row, kColDraft))
                                                          : nullptr)
    box->setChecked(draft);
}

bool CompareWindow::showResultTab(const QString& title) {
  for (int t = 0; t < m_tabs->count(); t++)
    if (m_tabs->tabText(t).compare(title, Qt::CaseInsensitive) == 0) {
      m_tabs->setCurrentIndex(t);
      return true;
    }
  return false;
}

int CompareWindow::variantCount() const { return m_variants->rowCount(); }
QString CompareWindow::textFile() const { return m_text->text(); }
int CompareWindow::chunks() const { return m_chunks->value(); }
int CompareWindow::threads() const { return m_threads->value(); }
void CompareWindow::setTextFile(const QString& path) { m_text->setText(path); }
void CompareWindow::setChunks(int chunks) { m_chunks->setValue(chunks); }
void CompareWindow::setThreads(int threads) {
  m_threads->setValue(threads);
  m_sweep->setThreads(threads);
}
void CompareWindow::setSpeedTests(int nPrompt, int nGen, int repetitions) {
  m_nPrompt = nPrompt, m_nGen = nGen, m_repetitions = repetitions;
}

std::vector<CompareVariant> CompareWindow::variants() const {
  std::vector<CompareVariant> out;
  for (int r = 0; r < m_variants->rowCount(); r++) {
    CompareVariant v;
    v.file = m_variants->item(r, kColName)->data(Qt::UserRole).toString().toStdString();
    const int ft = m_variants->item(r, kColSource)->data(Qt::UserRole).toInt();
    if (ft >= 0) v.quantize_to = static_cast<FileType>(ft);
    v.backend = static_cast<QComboBox*>(m_variants->cellWidget(r, kColBackend))->currentText().toStdString();
    v.kv_cache = static_cast<QCheckBox*>(m_variants->cellWidget(r, kColKv))->isChecked();
    v.speculative = static_cast<QComboBox*>(m_variants->cellWidget(r, kColSpec))->currentData().toString().toStdString();
    v.prune = m_variants->item(r, kColSource)->data(Qt::UserRole + 1).toString().toStdString();
    v.draft = static_cast<QCheckBox*>(m_variants->cellWidget(r, kColDraft))->isChecked();
    out.push_back(v);
  }
  return out;
}

void CompareWindow::chooseModel() {
  const QString dir = QString::fromStdString(user_model_dir());
  const QStringList paths =
      QFileDialog::getOpenFileNames(this, tr("Add models"), dir, tr("GGUF models (*.gguf);;All files (*)"));
  for (const QString& p : paths) addModel(p);
}

void CompareWindow::chooseText() {
  const QString p = QFileDialog::getOpenFileName(this, tr("Evaluation text"), QFileInfo(m_text->text()).path(),
                                                 tr("Text (*.txt);;All files (*)"));
  if (!p.isEmpty()) m_text->setText(p);
}

void CompareWindow::removeSelected() {
  const auto rows = m_variants->selectionModel()->selectedRows();
  QList<int> indexes;
  for (const QModelIndex& i : rows) indexes << i.row();
  std::sort(indexes.begin(), indexes.end(), std::greater<>());
  for (int r : indexes) m_variants->removeRow(r);
  offerVariantModels();
  fitVariantsTable();
}

void CompareWindow::showError(const QString& message) {
  m_lastError = message;
  m_status->setText(QStringLiteral("<span style='color:#b00020'>%1</span>").arg(message.toHtmlEscaped()));
  spdlog::warn("compare: {}", message.toStdString());
}

void CompareWindow::setRunning(bool running) {
  m_run->setEnabled(!running);
  m_cancel->setEnabled(running);
  m_addModel->setEnabled(!running);
  m_addQuant->setEnabled(!running);
  m_addPrune->setEnabled(!running);
  m_remove->setEnabled(!running);
  m_variants->setEnabled(!running);
  m_sweep->setBlockedReason(running ? tr("A model comparison is running: wait for it or cancel it.") : QString());
}

bool CompareWindow::isRunning() const { return m_process && m_process->isRunning(); }
qint64 CompareWindow::childProcessId() const { return m_process->processId(); }
QStringList CompareWindow::childArguments() const { return m_process->lastArguments(); }
QString CompareWindow::childCommand() const {
  return m_process->program().isEmpty() ? QString()
                                        : CompareProcess::commandLine(m_process->program(), m_process->lastArguments());
}

bool CompareWindow::startRun() {
  if (isRunning()) return false;
  m_lastError.clear();
  auto refuse = [this](const QString& message) {
    showError(message);
    emit runFinished(false, m_lastError);
    return false;
  };
  if (m_sweep->isRunning()) return refuse(tr("A batch sweep is running: wait for it or cancel it."));
  const std::vector<CompareVariant> vs = variants();
  // The inputs are checked here too, so that a mistake is named before a
  // process starts (the child checks them again).
  CompareOptions opts;
  QFile text(m_text->text());
  if (m_text->text().isEmpty() || !text.open(QIODevice::ReadOnly))
    return refuse(tr("Cannot read the evaluation text %1: choose a text file.").arg(m_text->text()));
  if (text.size() > (64 << 20)) return refuse(tr("The evaluation text is larger than 64 MiB: choose a smaller one."));
  opts.text = text.readAll().toStdString();
  opts.n_chunks = m_chunks->value();
  opts.n_threads = m_threads->value();
  opts.n_prompt = m_nPrompt;
  opts.n_gen = m_nGen;
  opts.repetitions = m_repetitions;
  if (Status st = validate_compare(vs, opts); !st) return refuse(QString::fromStdString(st.message()));

  CompareRequest request;
  request.variants = vs;
  request.textPath = m_text->text();
  request.chunks = opts.n_chunks;
  request.threads = opts.n_threads;
  request.nPrompt = m_nPrompt;
  request.nGen = m_nGen;
  request.repetitions = m_repetitions;
  QString error;
  const QString cli = m_cliPath.isEmpty() ? CompareProcess::findCli() : m_cliPath;
  if (!m_process->start(cli, request, &error)) return refuse(error);
  // The results shown are the run's from here on.
  m_rows.clear();
  showRows();
  setRunning(true);
  m_progress->setValue(0);
  m_status->setText(tr("Starting phaselab-cli (pid %1)…").arg(m_process->processId()));
  m_status->setToolTip(childCommand());
  return true;
}

void CompareWindow::cancelRun() {
  if (!isRunning()) return;
  m_process->cancel();
  m_status->setText(tr("Cancelling…"));
}

void CompareWindow::onProgress(const CompareProgress& p) {
  m_progress->setValue(static_cast<int>(p.fraction * 1000));
  m_status->setText(tr("Variant %1 of %2 — %3 (phaselab-cli, pid %4)")
                        .arg(p.variant + 1)
                        .arg(p.n_variants)
                        .arg(QString::fromStdString(p.message))
                        .arg(m_process->processId()));
}

// A variant's row as soon as the child has measured it.
void CompareWindow::onRowMeasured(const CompareRow& row) {
  m_rows.push_back(row);
  showRows();
}

void CompareWindow::onDone(const std::vector<CompareRow>& rows, const QString& error, bool cancelled) {
  setRunning(false);
  if (cancelled) {
    m_status->setText(tr("Cancelled: %1 variants measured, not saved.").arg(m_rows.size()));
    m_progress->setValue(0);
    emit runFinished(false, tr("cancelled"));
    return;
  }
  if (!error.isEmpty()) {
    showError(error);
    emit runFinished(false, error);
    return;
  }
  m_rows = rows;  // the child's final JSON: the same rows it printed one by one
  m_progress->setValue(1000);
  showRows();
  const QString title = tr("%1 variants, %2").arg(rows.size()).arg(QDateTime::currentDateTime().toString(Qt::ISODate));
  if (m_store && m_store->isOpen() && m_store->saveCompareRun(title, optionsJson(), QByteArray::fromStdString(compare_rows_json(rows))) == 0)
    showError(tr("The run finished but could not be saved: %1").arg(m_store->lastError()));
  else
    m_status->setText(tr("Done: %1 variants measured by phaselab-cli and saved.").arg(rows.size()));
  refreshSavedRuns();
  emit runFinished(true, QString());
}

// What the run measured, saved with it so that reopening it can run it again.
QByteArray CompareWindow::optionsJson() const {
  const QJsonArray vs = QJsonDocument::fromJson(QByteArray::fromStdString(compare_variants_json(variants()))).array();
  return QJsonDocument(QJsonObject{{"variants", vs},
                                   {"text", m_text->text()},
                                   {"chunks", m_chunks->value()},
                                   {"threads", m_threads->value()},
                                   {"n_prompt", m_nPrompt},
                                   {"n_gen", m_nGen},
                                   {"repetitions", m_repetitions},
                                   {"command", childCommand()}})
      .toJson(QJsonDocument::Compact);
}

// The inputs of a saved run back in the window (saved runs from before the
// inputs were restored lack repetitions: the current value stays).
void CompareWindow::restoreOptions(const QByteArray& options) {
  const QJsonObject o = QJsonDocument::fromJson(options).object();
  const QByteArray vs = QJsonDocument(o.value(QStringLiteral("variants")).toArray()).toJson(QJsonDocument::Compact);
  auto variants = compare_variants_from_json(vs.toStdString());
  if (!variants) {
    showError(tr("The saved run's variants cannot be read: %1").arg(QString::fromStdString(variants.status().message())));
    return;
  }
  m_variants->setRowCount(0);
  for (const CompareVariant& v : *variants) addVariantRow(v);
  if (o.contains(QStringLiteral("text"))) m_text->setText(o.value(QStringLiteral("text")).toString());
  if (o.contains(QStringLiteral("chunks"))) m_chunks->setValue(o.value(QStringLiteral("chunks")).toInt());
  if (o.contains(QStringLiteral("threads"))) m_threads->setValue(o.value(QStringLiteral("threads")).toInt());
  m_nPrompt = o.value(QStringLiteral("n_prompt")).toInt(m_nPrompt);
  m_nGen = o.value(QStringLiteral("n_gen")).toInt(m_nGen);
  m_repetitions = o.value(QStringLiteral("repetitions")).toInt(m_repetitions);
}

void CompareWindow::showRows() {
  m_results->setRowCount(0);
  QStringList names;
  QList<double> pp, tg, size, rss;
  for (const CompareRow& r : m_rows) {
    const int i = m_results->rowCount();
    m_results->insertRow(i);
    const QString name = QString::fromStdString(r.name) + (r.reference ? tr(" (reference)") : QString());
    names << QString::fromStdString(r.name);
    auto cell = [&](int c, const QString& text, const QString& tip = {}) {
      auto* item = new QTableWidgetItem(text);
      if (c > 0) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
      if (!tip.isEmpty()) item->setToolTip(tip);
      m_results->setItem(i, c, item);
    };
    const QString runs = r.repetitions > 0 ? tr("mean ± sd of %n run(s)", nullptr, r.repetitions) : QString();
    cell(0, name, QString::fromStdString(r.file));
    cell(1, QString::fromStdString(r.file_type.empty() ? r.type_mix : r.file_type), QString::fromStdString(r.type_mix));
    cell(2, QString::number(r.size_mib, 'f', 1));
    cell(3, meanSd(r.pp, r.pp_sd, r.repetitions), r.n_prompt > 0 ? tr("pp%1, %2").arg(r.n_prompt).arg(runs) : runs);
    cell(4, meanSd(r.tg, r.tg_sd, r.repetitions),
         (r.n_gen > 0 ? tr("tg%1, %2").arg(r.n_gen).arg(runs) : runs) + (r.kv_cache ? QString() : tr(", without the KV cache")));
    cell(5, meanSd(r.ttft_ms, r.ttft_sd_ms, r.repetitions),
         r.ttft_prompt_tokens > 0 ? tr("a chat prompt of %1 tokens, %2").arg(r.ttft_prompt_tokens).arg(runs) : runs);
    cell(6, QString::number(r.peak_rss_mib, 'f', 0),
         r.rss_per_variant ? QString() : tr("The peak could not be reset before this variant: at least the rows' above"));
    cell(7, QStringLiteral("%1 ± %2").arg(r.ppl, 0, 'f', 3).arg(r.ppl_err, 0, 'f', 3), tr("± its standard error"));
    cell(8, QString::number(r.kld, 'f', 5));
    cell(9, QStringLiteral("%1%").arg(100 * r.top1_agree, 0, 'f', 2));
    cell(10, QStringLiteral("%1%").arg(r.rms_dp, 0, 'f', 2));
    cell(11, r.accept_sampled >= 0 ? QStringLiteral("%1%").arg(100 * r.accept_sampled, 0, 'f', 2) : QStringLiteral("—"),
         r.accept_sampled >= 0 ? QString() : tr("not measured in this saved run"));
    if (r.draft)
      cell(12, tr("%1× (%2% kept, %3/pass)")
                   .arg(r.draft_speedup, 0, 'f', 2)
                   .arg(100 * r.draft_acceptance, 0, 'f', 0)
                   .arg(r.draft_tokens_per_pass, 0, 'f', 2),
           tr("The first variant answering the chat prompt: %1 tok/s with this draft (k = %2), %3 tok/s plainly, %4")
               .arg(meanSd(r.draft_tg, r.draft_tg_sd, r.repetitions), QString::number(r.draft_k),
                    meanSd(r.draft_base_tg, r.draft_base_tg_sd, r.repetitions), runs));
    else
      cell(12, r.reference ? tr("target") : QStringLiteral("—"));
    pp << r.pp;
    tg << r.tg;
    size << r.size_mib;
    rss << r.peak_rss_mib;
  }
  fillBars(m_prefillChart, names, {{tr("prefill"), pp}}, tr("tokens/s"));
  fillBars(m_decodeChart, names, {{tr("decode"), tg}}, tr("tokens/s"));
  fillBars(m_memoryChart, names, {{tr("file"), size}, {tr("peak RSS"), rss}}, tr("MiB"));
  fillSpeedQuality(m_qualityChart, m_rows);
  fillAcceptance(m_acceptanceChart, m_rows);
}

std::vector<CompareRow> CompareWindow::rowsFromJson(const QByteArray& json, QString* error) {
  auto rows = compare_rows_from_json(json.toStdString());
  if (!rows) {
    if (error) *error = QString::fromStdString(rows.status().message());
    return {};
  }
  return std::move(*rows);
}

void CompareWindow::refreshSavedRuns() {
  m_saved->clear();
  if (!m_store || !m_store->isOpen()) return;
  for (const CompareRunRecord& r : m_store->compareRuns()) m_saved->addItem(r.title, r.id);
}

bool CompareWindow::openSavedRun(qint64 id) {
  if (!m_store) return false;
  for (const CompareRunRecord& r : m_store->compareRuns()) {
    if (r.id != id) continue;
    QString error;
    std::vector<CompareRow> rows = rowsFromJson(r.rows, &error);
    if (rows.empty()) {
      showError(tr("The saved run %1 cannot be read: %2").arg(r.title, error));
      return false;
    }
    if (isRunning()) {
      showError(tr("A comparison is running: open the saved run when it has finished or been cancelled."));
      return false;
    }
    m_rows = std::move(rows);
    showRows();
    restoreOptions(r.options);
    m_status->setText(tr("Saved run: %1 (Run measures its variants again)").arg(r.title));
    m_status->setToolTip(QJsonDocument::fromJson(r.options).object().value(QStringLiteral("command")).toString());
    return true;
  }
  showError(tr("No saved run %1").arg(id));
  return false;
}

bool CompareWindow::writeFile(const QString& path, const QByteArray& data) {
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly) || f.write(data) != data.size() || !f.commit()) {
    showError(tr("Could not write %1: %2").arg(path, f.errorString()));
    return false;
  }
  m_status->setText(tr("Exported to %1").arg(path));
  return true;
}

bool CompareWindow::exportCsv(const QString& path) {
  if (m_rows.empty()) {
    showError(tr("Nothing to export: run a comparison or open a saved run first."));
    return false;
  }
  return writeFile(path, QByteArray::fromStdString(compare_rows_csv(m_rows)));
}

bool CompareWindow::exportJson(const QString& path) {
  if (m_rows.empty()) {
    showError(tr("Nothing to export: run a comparison or open a saved run first."));
    return false;
  }
  return writeFile(path, QByteArray::fromStdString(compare_rows_json(m_rows)));
}

void CompareWindow::resizeEvent(QResizeEvent* e) {
  QMainWindow::resizeEvent(e);
  fitVariantsTable();
}

void CompareWindow::closeEvent(QCloseEvent* e) {
  cancelRun();  // the child stops at its next step (or is killed after a grace period)
  m_sweep->cancel();
  QMainWindow::closeEvent(e);
}

}  // namespace phaselab::ui
