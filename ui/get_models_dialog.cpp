#include "get_models_dialog.h"

#include <spdlog/spdlog.h>

#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QScreen>
#include <QSpinBox>
#include <QSplitter>
#include <QStackedWidget>
#include <QTableWidget>
#include <QTimer>
#include <QVBoxLayout>
#include <algorithm>
#include <chrono>
#include <mutex>

#include "hub_token_store.h"

namespace phaselab::ui {

namespace {

QString qs(const std::string& s) { return QString::fromStdString(s); }
QString bytes(uint64_t n) { return qs(hub::format_bytes(n)); }

QString formatCount(int64_t n) {
  if (n >= 1'000'000) return QStringLiteral("%1 M").arg(n / 1e6, 0, 'f', 1);
  if (n >= 10'000) return QStringLiteral("%1 k").arg(n / 1e3, 0, 'f', 0);
  if (n >= 1'000) return QStringLiteral("%1 k").arg(n / 1e3, 0, 'f', 1);
  return QString::number(n);
}

QString formatDuration(double s) {
  if (s < 60) return QStringLiteral("%1 s").arg(std::max(1, int(s + 0.5)));
  if (s < 3600) return QStringLiteral("%1 min %2 s").arg(int(s) / 60).arg(int(s) % 60);
  return QStringLiteral("%1 h %2 min").arg(int(s) / 3600).arg(int(s) % 3600 / 60);
}

QString gatedText(const std::string& gated) {
  if (gated.empty()) return {};
  return gated == "manual" ? QObject::tr("gated (approval)") : QObject::tr("gated");
}

// A cell's text cut to a table-friendly length, whole in the tooltip.
QString elided(const QString& s, int n) { return s.size() <= n ? s : s.left(n - 1) + QChar(0x2026); }

// "yes — needs X of Y" and the split behind it.
QString fitText(const hub::FitEstimate& f, QString* tooltip) {
  const MemoryNeed& n = f.need;
  QStringList tip;
  if (n.kv || n.work)
    tip << QObject::tr("Weights %1 + KV cache for %2 positions %3 + work buffers %4 = %5")
               .arg(bytes(n.weights))
               .arg(f.n_ctx)
               .arg(bytes(n.kv), bytes(n.work), bytes(n.total()));
  else
    tip << QObject::tr("Weights %1 (the file's size: its header could not be read)").arg(bytes(n.weights));
  tip << (f.available ? QObject::tr("Memory available now: %1").arg(bytes(f.available))
                      : QObject::tr("The memory available is not known on this system."));
  if (!f.architecture.empty()) tip << QObject::tr("Architecture: %1").arg(qs(f.architecture));
  if (!f.note.empty()) tip << qs(f.note);
  *tooltip = tip.join(QLatin1Char('\n'));
  if (!f.supported) {
    if (f.architecture.empty())
      return QObject::tr("unknown (%1)").arg(elided(f.note.empty() ? QObject::tr("header not readable") : qs(f.note), 40));
    return QObject::tr("unsupported architecture (%1)").arg(qs(f.architecture));
  }
  if (f.available == 0) return QObject::tr("unknown (needs %1; free memory not known)").arg(bytes(n.total()));
  if (f.fits()) return QObject::tr("yes — needs %1 of %2").arg(bytes(n.total()), bytes(f.available));
  return QObject::tr("no — needs %1, %2 available").arg(bytes(n.total()), bytes(f.available));
}

QTableWidget* makeTable(const QStringList& headers) {
  auto* t = new QTableWidget(0, headers.size());
  t->setHorizontalHeaderLabels(headers);
  t->setSelectionBehavior(QAbstractItemView::SelectRows);
  t->setSelectionMode(QAbstractItemView::SingleSelection);
  t->setEditTriggers(QAbstractItemView::NoEditTriggers);
  t->verticalHeader()->setVisible(false);
  t->setWordWrap(false);
  t->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);  // the first column gives way instead
  t->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  t->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  t->horizontalHeader()->setStretchLastSection(false);
  return t;
}

QTableWidgetItem* item(const QString& text, Qt::Alignment align = Qt::AlignLeft | Qt::AlignVCenter) {
  auto* it = new QTableWidgetItem(text);
  it->setTextAlignment(align);
  return it;
}

// Workers still running when their dialog went (a search the network is
// slow to answer cannot be interrupted): joined as the application ends, so
// that closing a dialog never waits on the network.
struct Orphans {
  std::mutex mutex;
  std::vector<std::thread> threads;
};
Orphans& orphans() {
  static Orphans* o = new Orphans;  // never destroyed: the post routine may run after statics
  return *o;
}
void joinOrphans() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(orphans().mutex);
    threads.swap(orphans().threads);
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace

GetModelsDialog::GetModelsDialog(const QString& modelDir, QWidget* parent, HubTokenStore* tokens)
    : QDialog(parent), m_modelDir(modelDir), m_tokens(tokens), m_options(hub::HubOptions::from_environment()) {
  setObjectName(QStringLiteral("getModelsDialog"));
  setWindowTitle(tr("Get Models"));
  if (!m_tokens) m_tokens = new HubTokenStore(this);
  // 900x640 where the screen has room; on an 800x600 screen a little less
  // than the screen, so that the title bar and the panel stay in view.
  const QRect avail = (parent ? parent->screen() : QGuiApplication::primaryScreen())->availableGeometry();
  resize(std::min(900, avail.width() - 40), std::min(640, avail.height() - 80));

  auto* layout = new QVBoxLayout(this);
  auto* searchRow = new QHBoxLayout;
  m_search = new QLineEdit;
  m_search->setPlaceholderText(tr("Search Hugging Face for GGUF models…"));
  m_search->setClearButtonEnabled(true);
  m_sort = new QComboBox;
  m_sort->addItem(tr("Most downloaded"), int(hub::SortBy::downloads));
  m_sort->addItem(tr("Most liked"), int(hub::SortBy::likes));
  m_sort->addItem(tr("Recently updated"), int(hub::SortBy::last_modified));
  m_searchButton = new QPushButton(tr("Search"));
  m_tokenButton = new QPushButton(tr("Token…"));
  m_tokenButton->setToolTip(tr("A Hugging Face token, for gated models"));
  searchRow->addWidget(m_search, 1);
  searchRow->addWidget(m_sort);
  searchRow->addWidget(m_searchButton);
  searchRow->addWidget(m_tokenButton);
  layout->addLayout(searchRow);
  m_tokenLabel = new QLabel;
  m_tokenLabel->setWordWrap(true);
  layout->addWidget(m_tokenLabel);

  auto* split = new QSplitter(Qt::Vertical);
  split->setChildrenCollapsible(false);
  split->addWidget(buildResultsPanel());
  split->addWidget(buildFilesPanel());
  // About as many rows of repositories as of files (the files' panel also
  // holds the licence and the context).
  split->setSizes({200, 260});
  layout->addWidget(split, 1);

  m_progress = new QProgressBar;
  m_progress->setRange(0, 1000);
  m_progress->setValue(0);
  m_progress->setTextVisible(false);
  layout->addWidget(m_progress);
  m_status = new QLabel;
  m_status->setObjectName(QStringLiteral("getModelsStatus"));
  m_status->setWordWrap(true);
  m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(m_status);
  layout->addLayout(buildDownloadRow());

  // No button is a default: Enter in the search box searches, and nowhere
  // else does it start a download or close the dialog.
  for (QPushButton* b : findChildren<QPushButton*>()) b->setAutoDefault(false);

  connect(m_search, &QLineEdit::returnPressed, this, &GetModelsDialog::search);
  connect(m_searchButton, &QPushButton::clicked, this, &GetModelsDialog::search);
  connect(m_tokenButton, &QPushButton::clicked, this, &GetModelsDialog::openTokenDialog);
  connect(m_tokens, &HubTokenStore::changed, this, [this] {
    updateTokenLabel();
    // A new token may open a gated repository: read the selected one again.
    const auto rows = m_results->selectionModel()->selectedRows();
    if (!rows.isEmpty() && !m_tokens->isBusy()) selectRepository(rows.first().row());
  });
  showResultsMessage(tr("Search by name, e.g. “qwen2.5 0.5b instruct”, “gemma 3” or “llama 3.2 1b”; an empty "
                        "search lists the most downloaded GGUF repositories."));
  setStatus(tr("Models are saved to %1.").arg(QDir::toNativeSeparators(m_modelDir)));
  updateTokenLabel();
  updateButtons();
  m_tokens->load();
}

QWidget* GetModelsDialog::buildResultsPanel() {
  m_resultsStack = new QStackedWidget;
  m_results = makeTable({tr("Repository"), tr("Downloads"), tr("Likes"), tr("Updated"), tr("Licence"), tr("Access")});
  m_results->setObjectName(QStringLiteral("hubResults"));
  m_results->setMinimumHeight(90);
  m_resultsMessage = new QLabel;
  m_resultsMessage->setObjectName(QStringLiteral("hubResultsMessage"));
  m_resultsMessage->setWordWrap(true);
  m_resultsMessage->setAlignment(Qt::AlignCenter);
  m_resultsMessage->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_resultsMessage->setMargin(12);
  m_resultsStack->addWidget(m_results);
  m_resultsStack->addWidget(m_resultsMessage);
  connect(m_results, &QTableWidget::itemSelectionChanged, this, [this] {
    const auto rows = m_results->selectionModel()->selectedRows();
    if (!rows.isEmpty()) selectRepository(rows.first().row());
  });
  return m_resultsStack;
}

QWidget* GetModelsDialog::buildFilesPanel() {
  auto* panel = new QWidget;
  auto* col = new QVBoxLayout(panel);
  col->setContentsMargins(0, 0, 0, 0);
  auto* infoRow = new QHBoxLayout;
  auto* labels = new QVBoxLayout;
  m_licence = new QLabel(tr("Select a repository to see its licence and files."));
  m_licence->setObjectName(QStringLiteral("hubLicence"));
  m_licence->setWordWrap(true);
  m_repoNote = new QLabel;
  m_repoNote->setObjectName(QStringLiteral("hubRepoNote"));
  m_repoNote->setWordWrap(true);
  m_repoNote->setOpenExternalLinks(true);
  m_repoNote->setTextInteractionFlags(Qt::TextBrowserInteraction);
  m_repoNote->hide();
  labels->addWidget(m_licence);
  labels->addWidget(m_repoNote);
  infoRow->addLayout(labels, 1);
  auto* ctxLabel = new QLabel(tr("Context:"));
  m_context = new QSpinBox;
  m_context->setRange(512, 131072);
  m_context->setSingleStep(512);
  m_context->setValue(4096);
  m_context->setSuffix(tr(" tokens"));
  m_context->setToolTip(tr("The context the Fits? column estimates the KV cache for"));
  ctxLabel->setBuddy(m_context);
  infoRow->addWidget(ctxLabel, 0, Qt::AlignTop);
  infoRow->addWidget(m_context, 0, Qt::AlignTop);
  col->addLayout(infoRow);
  m_files = makeTable({tr("File"), tr("Quantization"), tr("Size"), tr("Fits?")});
  m_files->setObjectName(QStringLiteral("hubFiles"));
  m_files->setMinimumHeight(80);
  col->addWidget(m_files, 1);

  // A context being typed is estimated once the typing pauses.
  m_refit = new QTimer(this);
  m_refit->setSingleShot(true);
  m_refit->setInterval(400);
  connect(m_refit, &QTimer::timeout, this, &GetModelsDialog::refitAll);
  connect(m_context, &QSpinBox::valueChanged, m_refit, qOverload<>(&QTimer::start));
  connect(m_files, &QTableWidget::itemSelectionChanged, this, [this] {
    const int row = selectedFileRow();
    if (row >= 0 && std::find(m_fitAsked.begin(), m_fitAsked.end(), row) == m_fitAsked.end()) startFits({row});
    updateButtons();
  });
  connect(m_files, &QTableWidget::cellDoubleClicked, this, [this] {
    if (m_download->isEnabled()) m_download->click();
  });
  return panel;
}

QLayout* GetModelsDialog::buildDownloadRow() {
  auto* row = new QHBoxLayout;
  m_download = new QPushButton(tr("Download"));
  m_pause = new QPushButton(tr("Pause"));
  m_cancel = new QPushButton(tr("Cancel"));
  m_load = new QPushButton(tr("Load"));
  m_load->setToolTip(tr("Load the downloaded model and close this window"));
  auto* close = new QPushButton(tr("Close"));
  close->setToolTip(tr("A running download is paused: Download resumes it later"));
  row->addWidget(m_download);
  row->addWidget(m_pause);
  row->addWidget(m_cancel);
  row->addStretch(1);
  row->addWidget(m_load);
  row->addWidget(close);
  connect(m_download, &QPushButton::clicked, this, [this] {
    const int r = selectedFileRow();
    if (r < 0 || !m_repo || m_dlState == DownloadState::running) return;
    m_dlInfo = *m_repo;
    m_dlModel = m_repo->models[size_t(r)];
    startDownload();
  });
  connect(m_pause, &QPushButton::clicked, this, &GetModelsDialog::pauseOrResume);
  connect(m_cancel, &QPushButton::clicked, this, &GetModelsDialog::cancelDownload);
  connect(m_load, &QPushButton::clicked, this, [this] {
    if (m_savedPath.isEmpty()) return;
    emit modelDownloaded(m_savedPath);
    accept();
  });
  connect(close, &QPushButton::clicked, this, &QDialog::reject);
  return row;
}

GetModelsDialog::~GetModelsDialog() {
  if (m_control) m_control->pause();
  m_fitGenShared->store(++m_fitGen);  // a fit worker still reading headers stops between files
  // The download stops at its next chunk: waited for a moment, so that the
  // partial file is complete on disk when the dialog is gone. A query (a
  // search, a file list, a fit's header) cannot be interrupted; it is left
  // to end with its request, its answer dropped.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    const bool stopped = std::all_of(m_workers.begin(), m_workers.end(),
                                     [](const Worker& w) { return !w.download || w.finished->load(); });
    if (stopped || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  bool orphaned = false;
  for (Worker& w : m_workers) {
    if (w.finished->load()) {
      w.thread.join();
    } else {
      std::lock_guard lock(orphans().mutex);
      orphans().threads.push_back(std::move(w.thread));
      orphaned = true;
    }
  }
  static bool routineAdded = false;
  if (orphaned && !routineAdded) {
    qAddPostRoutine(joinOrphans);
    routineAdded = true;
  }
}

void GetModelsDialog::done(int r) {
  // Closing pauses, it does not throw the bytes away: Download resumes.
  if (m_dlState == DownloadState::running && m_control) m_control->pause();
  QDialog::done(r);
}

void GetModelsDialog::spawn(std::function<void()> work, bool download) {
  reapWorkers();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread t([work = std::move(work), finished] {
    // An exception must not end the application (std::terminate): the
    // worker's answer is then simply missing, and the log says why.
    try {
      work();
    } catch (const std::exception& e) {
      spdlog::error("Get Models: a worker failed: {}", e.what());
    } catch (...) {
      spdlog::error("Get Models: a worker failed");
    }
    finished->store(true);
  });
  m_workers.push_back({std::move(t), finished, download});
}

void GetModelsDialog::reapWorkers() {
  for (auto it = m_workers.begin(); it != m_workers.end();) {
    if (it->finished->load()) {
      it->thread.join();
      it = m_workers.erase(it);
    } else {
      ++it;
    }
  }
}

// Back on the GUI thread (qApp lives there), unless the dialog is gone.
template <typename F>
static void post(QPointer<GetModelsDialog> self, F f) {
  QMetaObject::invokeMethod(
      qApp, [self, f = std::move(f)]() mutable {
        if (self) f(self.data());
      },
      Qt::QueuedConnection);
}

void GetModelsDialog::setHubOptions(const hub::HubOptions& options) { m_options = options; }

hub::HubOptions GetModelsDialog::hubOptions() const {
  hub::HubOptions o = m_options;
  if (o.token.empty()) o.token = m_tokens->token().toStdString();
  return o;
}

void GetModelsDialog::setStatus(const QString& text) { m_status->setText(text); }

void GetModelsDialog::updateTokenLabel() {
  m_tokenLabel->setText(m_tokens->statusText());
  m_tokenLabel->setToolTip(m_tokens->storeError());
}

void GetModelsDialog::openTokenDialog() {
  auto* dlg = new HubTokenDialog(m_tokens, this);
  dlg->setAttribute(Qt::WA_DeleteOnClose);
  dlg->open();
}

bool GetModelsDialog::isResultsMessageShown() const { return m_resultsStack->currentWidget() == m_resultsMessage; }

void GetModelsDialog::showResultsMessage(const QString& text) {
  m_resultsMessage->setText(text);
  m_resultsStack->setCurrentWidget(m_resultsMessage);
}

// ---- search and repository -------------------------------------------------

void GetModelsDialog::search() {
  const int gen = ++m_searchGen;
  ++m_repoGen;  // a repository still being read belongs to the old results
  const std::string text = m_search->text().trimmed().toStdString();
  const auto sort = hub::SortBy(m_sort->currentData().toInt());
  showResultsMessage(tr("Searching…"));
  setStatus(tr("Searching %1…").arg(qs(hubOptions().endpoint)));
  QPointer<GetModelsDialog> self(this);
  spawn([self, gen, text, sort, opt = hubOptions()] {
    auto r = hub::search_models(opt, text, sort, 50);
    post(self, [gen, r = std::move(r)](GetModelsDialog* d) { d->onSearchDone(gen, r); });
  });
}

void GetModelsDialog::onSearchDone(int generation, const Result<std::vector<hub::ModelSummary>>& result) {
  if (generation != m_searchGen) return;  // searched again since
  {
    const QSignalBlocker block(m_results);
    m_results->setRowCount(0);
  }
  m_summaries.clear();
  if (!result) {
    const QString message = qs(result.status().message());
    showResultsMessage(tr("The search failed: %1").arg(message));
    setStatus(message);
    return;
  }
  m_summaries = result.value();
  if (m_summaries.empty()) {
    showResultsMessage(m_search->text().trimmed().isEmpty()
                           ? tr("No GGUF repositories found.")
                           : tr("No GGUF repositories match “%1”.").arg(m_search->text().trimmed()));
    setStatus(QString());
    return;
  }
  const QSignalBlocker block(m_results);
  const auto right = Qt::AlignRight | Qt::AlignVCenter;
  for (const hub::ModelSummary& m : m_summaries) {
    const int r = m_results->rowCount();
    m_results->insertRow(r);
    auto* id = item(qs(m.id));
    id->setToolTip(qs(m.id));
    m_results->setItem(r, RepoColumn, id);
    m_results->setItem(r, DownloadsColumn, item(formatCount(m.downloads), right));
    m_results->setItem(r, LikesColumn, item(formatCount(m.likes), right));
    m_results->setItem(r, UpdatedColumn, item(qs(m.last_modified).left(10)));
    m_results->setItem(r, LicenceColumn, item(m.license.empty() ? QStringLiteral("—") : elided(qs(m.license), 24)));
    m_results->item(r, LicenceColumn)->setToolTip(m.license.empty() ? tr("No licence stated") : qs(m.license));
    m_results->setItem(r, GatedColumn, item(gatedText(m.gated)));
  }
  m_resultsStack->setCurrentWidget(m_results);
  setStatus(tr("%n repositories. Select one to see its files.", "", int(m_summaries.size())));
}

void GetModelsDialog::selectRepository(int row) {
  if (row < 0 || size_t(row) >= m_summaries.size()) return;
  const int gen = ++m_repoGen;
  m_fitGenShared->store(++m_fitGen);
  m_fitAsked.clear();
  m_repo.reset();
  m_files->setRowCount(0);
  const std::string id = m_summaries[size_t(row)].id;
  m_licence->setText(tr("Reading %1…").arg(qs(id)));
  m_repoNote->hide();
  updateButtons();
  QPointer<GetModelsDialog> self(this);
  spawn([self, gen, id, opt = hubOptions()] {
    auto r = hub::repo_info(opt, id);
    post(self, [gen, r = std::move(r)](GetModelsDialog* d) { d->onRepoInfo(gen, r); });
  });
}

void GetModelsDialog::showRepoFailure(const QString& repo, const QString& message) {
  m_licence->setText(tr("Could not read %1.").arg(repo));
  QString note = message.toHtmlEscaped();
  if (m_tokens->token().isEmpty() && (message.contains(QLatin1String("401")) || message.contains(QLatin1String("gated"), Qt::CaseInsensitive)))
    note += QStringLiteral("<br>") + tr("No token is set: add yours with <b>Token…</b>.");
  m_repoNote->setText(note);
  m_repoNote->show();
  setStatus(message);
}

void GetModelsDialog::onRepoInfo(int generation, const Result<hub::RepoInfo>& result) {
  if (generation != m_repoGen) return;  // another repository was selected since
  const auto rows = m_results->selectionModel()->selectedRows();
  const QString repo = rows.isEmpty() ? QString() : m_results->item(rows.first().row(), RepoColumn)->text();
  if (!result) {
    showRepoFailure(repo, qs(result.status().message()));
    return;
  }
  m_repo = result.value();
  const hub::RepoInfo& info = *m_repo;
  m_licence->setText(info.license.empty() ? tr("Licence: not stated — read the model card before use")
                                          : tr("Licence: %1").arg(qs(info.license)));
  const QString card = qs(hubOptions().endpoint) + QLatin1Char('/') + qs(info.id);
  QString note;
  if (!info.gated.empty()) {
    note = tr("Gated: accept the authors' conditions on the model card first; the download sends your token.");
    if (m_tokens->token().isEmpty() && m_options.token.empty())
      note += QLatin1Char(' ') + tr("No token is set: add yours with <b>Token…</b>.");
    note += QLatin1Char(' ');
  }
  note += tr("<a href=\"%1\">Model card</a>").arg(card.toHtmlEscaped());
  m_repoNote->setText(note);
  m_repoNote->show();
  const QSignalBlocker block(m_files);
  for (const hub::GgufChoice& m : info.models) {
    const int r = m_files->rowCount();
    m_files->insertRow(r);
    auto* name = item(qs(m.label()));
    QStringList parts;
    for (const hub::RepoFile& f : m.parts) parts << qs(f.path);
    name->setToolTip(parts.join(QLatin1Char('\n')));
    m_files->setItem(r, FileNameColumn, name);
    m_files->setItem(r, QuantColumn, item(m.quant.empty() ? QStringLiteral("—") : qs(m.quant)));
    m_files->setItem(r, SizeColumn, item(bytes(m.total_size()), Qt::AlignRight | Qt::AlignVCenter));
    m_files->setItem(r, FitsColumn, item(r < kFitCap ? tr("estimating…") : tr("select to estimate")));
  }
  setStatus(info.models.empty() ? tr("%1 has no GGUF files.").arg(qs(info.id))
                                : tr("%n GGUF model(s) in %1.", "", int(info.models.size())).arg(qs(info.id)));
  std::vector<int> first;
  for (int r = 0; r < std::min<int>(kFitCap, int(info.models.size())); r++) first.push_back(r);
  startFits(first);
  updateButtons();
}

// ---- fit -------------------------------------------------------------------

int GetModelsDialog::selectedFileRow() const {
  const auto rows = m_files->selectionModel()->selectedRows();
  return rows.isEmpty() ? -1 : rows.first().row();
}

void GetModelsDialog::refitAll() {
  if (!m_repo) return;
  m_fitGenShared->store(++m_fitGen);
  m_fitAsked.clear();
  std::vector<int> rows;
  for (int r = 0; r < m_files->rowCount(); r++) {
    if (r < kFitCap || r == selectedFileRow()) {
      rows.push_back(r);
      m_files->item(r, FitsColumn)->setText(tr("estimating…"));
    } else {
      m_files->item(r, FitsColumn)->setText(tr("select to estimate"));
    }
    m_files->item(r, FitsColumn)->setToolTip(QString());
  }
  startFits(rows);
}

void GetModelsDialog::startFits(const std::vector<int>& rows) {
  if (!m_repo || rows.empty()) return;
  std::vector<std::pair<int, hub::GgufChoice>> todo;
  for (int r : rows) {
    if (r < 0 || size_t(r) >= m_repo->models.size()) continue;
    m_fitAsked.push_back(r);
    m_files->item(r, FitsColumn)->setText(tr("estimating…"));
    todo.emplace_back(r, m_repo->models[size_t(r)]);
  }
  const int gen = m_fitGen;
  QPointer<GetModelsDialog> self(this);
  spawn([self, gen, todo, info = *m_repo, nCtx = m_context->value(), opt = hubOptions(), current = m_fitGenShared] {
    for (const auto& [row, model] : todo) {
      if (current->load() != gen) return;  // another repository or context since
      auto fit = hub::estimate_fit(opt, info, model, nCtx);
      post(self, [gen, row = row, fit = std::move(fit)](GetModelsDialog* d) { d->onFit(gen, row, fit); });
    }
  });
}

void GetModelsDialog::onFit(int generation, int row, const Result<hub::FitEstimate>& fit) {
  if (generation != m_fitGen || row >= m_files->rowCount()) return;
  QTableWidgetItem* cell = m_files->item(row, FitsColumn);
  if (!fit) {
    const QString message = qs(fit.status().message());
    cell->setText(tr("unknown (%1)").arg(elided(message, 40)));
    cell->setToolTip(message);
    cell->setForeground(QBrush());
    return;
  }
  QString tip;
  cell->setText(fitText(fit.value(), &tip));
  cell->setToolTip(tip);
  // Red only for a clear "no"; unknown and unsupported stay plain.
  if (fit->supported && fit->available && !fit->fits())
    cell->setForeground(QColor(0xc0, 0x39, 0x2b));
  else
    cell->setForeground(QBrush());
}

// ---- download --------------------------------------------------------------

void GetModelsDialog::startDownload() {
  QDir().mkpath(m_modelDir);
  m_control = std::make_shared<hub::DownloadControl>();
  m_dlState = DownloadState::running;
  m_savedPath.clear();
  const int gen = ++m_dlGen;
  setStatus(tr("Starting %1…").arg(qs(m_dlModel.label())));
  updateButtons();
  QPointer<GetModelsDialog> self(this);
  spawn([self, gen, info = m_dlInfo, model = m_dlModel, dir = m_modelDir.toStdString(), opt = hubOptions(),
         control = m_control] {
    // The engine calls this at most ~10 times a second.
    auto onProgress = [self, gen](const hub::DownloadProgress& p) {
      post(self, [gen, p](GetModelsDialog* d) { d->onProgress(gen, p); });
    };
    auto r = hub::download_model(opt, info, model, dir, onProgress, control.get());
    post(self, [gen, r = std::move(r)](GetModelsDialog* d) { d->onDownloadDone(gen, r); });
  }, true);
}

void GetModelsDialog::pauseOrResume() {
  if (m_dlState == DownloadState::running && m_control) {
    m_control->pause();
    setStatus(tr("Pausing…"));
    m_pause->setEnabled(false);  // until the transfer has stopped
  } else if (m_dlState == DownloadState::paused) {
    startDownload();
  }
}

void GetModelsDialog::cancelDownload() {
  if (m_dlState == DownloadState::running && m_control) {
    m_control->cancel();
    setStatus(tr("Cancelling…"));
    m_pause->setEnabled(false);
    m_cancel->setEnabled(false);
    return;
  }
  if (m_dlState != DownloadState::paused) return;
  // Nothing runs to remove the partial files: remove them here, by the
  // names download_model gives them.
  for (const hub::RepoFile& f : m_dlModel.parts) QFile::remove(qs(hub::partial_path(m_modelDir.toStdString(), f)));
  m_dlState = DownloadState::idle;
  m_progress->setValue(0);
  setStatus(tr("Cancelled: the partial download of %1 is removed.").arg(qs(m_dlModel.label())));
  updateButtons();
}

void GetModelsDialog::onProgress(int generation, const hub::DownloadProgress& p) {
  if (generation != m_dlGen || m_dlState != DownloadState::running) return;
  if (p.total > 0) m_progress->setValue(int(std::min<uint64_t>(1000, p.done * 1000 / p.total)));
  QString stage = qs(p.stage.empty() ? std::string("downloading") : p.stage);
  if (!stage.isEmpty()) stage[0] = stage[0].toUpper();
  QString text = tr("%1 %2").arg(stage, qs(p.file));
  if (p.n_parts > 1) text += QLatin1Char(' ') + tr("(part %1 of %2)").arg(p.part).arg(p.n_parts);
  text += QStringLiteral(": ") + tr("%1 of %2").arg(bytes(p.done), bytes(p.total));
  if (p.bytes_per_s > 0) {
    text += QStringLiteral(" · ") + tr("%1 MiB/s").arg(p.bytes_per_s / double(1 << 20), 0, 'f', 2);
    if (p.total > p.done) text += QStringLiteral(" · ") + tr("%1 left").arg(formatDuration((p.total - p.done) / p.bytes_per_s));
  }
  setStatus(text);
}

void GetModelsDialog::onDownloadDone(int generation, const Result<hub::DownloadResult>& result) {
  if (generation != m_dlGen) return;
  if (!result) {
    // A partial file stays where the engine left it: Download resumes it.
    m_dlState = DownloadState::idle;
    setStatus(qs(result.status().message()));
  } else if (result->cancelled) {
    m_dlState = DownloadState::idle;
    m_progress->setValue(0);
    setStatus(tr("Cancelled: the partial download of %1 is removed.").arg(qs(m_dlModel.label())));
  } else if (result->paused) {
    m_dlState = DownloadState::paused;
    setStatus(tr("Paused at %1%: Resume continues from there (so does Download, later).")
                  .arg(m_progress->value() / 10));
  } else if (result->paths.empty()) {
    m_dlState = DownloadState::idle;
    setStatus(tr("The download ended without a file."));
  } else {
    m_dlState = DownloadState::done;
    m_savedPath = qs(result->paths.front());
    m_progress->setValue(1000);
    const QString where = QDir::toNativeSeparators(m_savedPath);
    if (result->already_present)
      setStatus(tr("Already in the model folder: %1").arg(where));
    else
      setStatus(tr("Saved to %1 (%2 in %3).")
                    .arg(where, bytes(result->bytes_transferred), formatDuration(std::max(result->seconds, 0.5))));
  }
  updateButtons();
}

void GetModelsDialog::updateButtons() {
  const bool running = m_dlState == DownloadState::running;
  const bool paused = m_dlState == DownloadState::paused;
  m_download->setEnabled(!running && m_repo && selectedFileRow() >= 0);
  m_pause->setText(paused ? tr("Resume") : tr("Pause"));
  m_pause->setEnabled(running || paused);
  m_cancel->setEnabled(running || paused);
  m_load->setEnabled(m_dlState == DownloadState::done && !m_savedPath.isEmpty());
}

}  // namespace phaselab::ui
