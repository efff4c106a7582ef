#include "model_manager.h"

#include <QApplication>
#include <algorithm>
#include <QDialogButtonBox>
#include <QDir>
#include <QGuiApplication>
#include <QScreen>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPointer>
#include <QPushButton>
#include <QTableWidget>
#include <QThread>
#include <QVBoxLayout>

#include "get_models_dialog.h"
#include "phaselab/metrics.h"
#include "phaselab/model.h"

namespace phaselab::ui {

ModelInfo ModelManager::describe(const QString& path, QString* error) {
  ModelInfo info;
  info.path = path;
  info.fileSize = QFileInfo(path).size();
  try {
    auto model = Model::load(path.toStdString());
    if (!model) {
      if (error) *error = QString::fromStdString(model.status().message());
      return info;
    }
    const Model& m = **model;
    const ModelConfig& c = m.config();
    info.name = c.name.empty() ? QFileInfo(path).completeBaseName() : QString::fromStdString(c.name);
    info.architecture = QString::fromStdString(c.arch_str);
    info.nParams = static_cast<qint64>(parameter_count(m));
    info.nParamsActive = static_cast<qint64>(active_parameter_count(m));
    info.typeMix = QString::fromStdString(m.type_mix());
    info.contextTrained = c.n_ctx_train;
    info.weightBytes = m.active_weight_bytes();
    info.chatTemplate = QString::fromStdString(chat_format_name(m.chat_format()));
    info.hasChatTemplate = m.has_chat_template();
  } catch (const std::exception& e) {
    if (error) *error = QString::fromUtf8(e.what());
  }
  return info;
}

QString ModelManager::formatParams(qint64 n) {
  if (n >= 1'000'000'000) return QStringLiteral("%1 B").arg(n / 1e9, 0, 'f', 2);
  if (n >= 1'000'000) return QStringLiteral("%1 M").arg(n / 1e6, 0, 'f', 1);
  return QStringLiteral("%1 K").arg(n / 1e3, 0, 'f', 1);
}

QString ModelManager::formatParamsWithActive(const ModelInfo& m) {
  if (m.nParamsActive <= 0 || m.nParamsActive >= m.nParams) return formatParams(m.nParams);
  return tr("%1, %2 active").arg(formatParams(m.nParams), formatParams(m.nParamsActive));
}

QString ModelManager::formatBytes(qint64 n) {
  if (n >= (qint64{1} << 30)) return QStringLiteral("%1 GiB").arg(n / double(1 << 30), 0, 'f', 2);
  return QStringLiteral("%1 MiB").arg(n / double(1 << 20), 0, 'f', 1);
}

ModelManager::ModelManager(const QString& modelDir, const ModelInfo& loaded, bool hasModel, QWidget* parent)
    : QDialog(parent), m_modelDir(modelDir) {
  setWindowTitle(tr("Models"));
  // 900 px wide where the screen has room: on an 800 px screen the table's
  // last column ("Chat format") was cut at the screen's edge.
  const QRect avail = (parent ? parent->screen() : QGuiApplication::primaryScreen())->availableGeometry();
  resize(std::min(900, avail.width() - 40), std::min(360, avail.height() - 80));
  auto* layout = new QVBoxLayout(this);
  auto* current = new QLabel(hasModel ? tr("Loaded: <b>%1</b> (%2, %3)")
                                            .arg(loaded.name.toHtmlEscaped(), loaded.backend, loaded.typeMix)
                                      : tr("No model loaded."));
  layout->addWidget(current);
  layout->addWidget(new QLabel(tr("Models in %1:").arg(QDir::toNativeSeparators(modelDir))));
  m_table = new QTableWidget(0, 7);
  m_table->setHorizontalHeaderLabels(
      {tr("File"), tr("Architecture"), tr("Parameters"), tr("Quantization"), tr("Context"), tr("Size"), tr("Chat format")});
  m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
  m_table->setSelectionMode(QAbstractItemView::SingleSelection);
  m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_table->horizontalHeader()->setStretchLastSection(true);
  layout->addWidget(m_table, 1);
  m_status = new QLabel(tr("Reading the model folder…"));
  m_status->setWordWrap(true);
  layout->addWidget(m_status);

  auto* row = new QHBoxLayout;
  auto* open = new QPushButton(tr("Open file…"));
  auto* get = new QPushButton(tr("Get Models…"));
  get->setObjectName(QStringLiteral("getModelsButton"));
  get->setToolTip(tr("Search Hugging Face for GGUF models and download one into this folder"));
  m_load = new QPushButton(tr("Load"));
  m_load->setEnabled(false);
  auto* unload = new QPushButton(tr("Unload"));
  unload->setEnabled(hasModel);
  auto* close = new QPushButton(tr("Close"));
  row->addWidget(open);
  row->addWidget(get);
  row->addStretch(1);
  row->addWidget(m_load);
  row->addWidget(unload);
  row->addWidget(close);
  layout->addLayout(row);

  connect(open, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Open a GGUF model"), m_modelDir, tr("GGUF models (*.gguf)"));
    if (path.isEmpty()) return;
    emit loadRequested(path);
    accept();
  });
  // A model downloaded there is in the list once the dialog closes; its Load
  // loads it right away.
  connect(get, &QPushButton::clicked, this, [this] {
    GetModelsDialog dlg(m_modelDir, this);
    bool loaded = false;
    connect(&dlg, &GetModelsDialog::modelDownloaded, this, [this, &loaded](const QString& path) {
      loaded = true;
      emit loadRequested(path);
    });
    dlg.exec();
    if (loaded)
      accept();
    else
      scan();
  });
  connect(m_load, &QPushButton::clicked, this, [this] {
    if (selectedPath().isEmpty()) return;
    emit loadRequested(selectedPath());
    accept();
  });
  connect(m_table, &QTableWidget::cellDoubleClicked, m_load, &QPushButton::click);
  connect(m_table, &QTableWidget::itemSelectionChanged, this, [this] { m_load->setEnabled(!selectedPath().isEmpty()); });
  connect(unload, &QPushButton::clicked, this, [this] {
    emit unloadRequested();
    accept();
  });
  connect(close, &QPushButton::clicked, this, &QDialog::reject);
  scan();
}

QString ModelManager::selectedPath() const {
  const auto rows = m_table->selectionModel()->selectedRows();
  if (rows.isEmpty()) return {};
  return m_table->item(rows.first().row(), 0)->data(Qt::UserRole).toString();
}

void ModelManager::scan() {
  const QStringList files = QDir(m_modelDir).entryList({QStringLiteral("*.gguf")}, QDir::Files, QDir::Name);
  QPointer<ModelManager> self(this);
  const QString dir = m_modelDir;
  QThread* t = QThread::create([self, files, dir] {
    QList<ModelInfo> rows;
    QStringList errors;
    for (const QString& f : files) {
      QString err;
      ModelInfo info = describe(QDir(dir).filePath(f), &err);
      if (!err.isEmpty()) errors << QStringLiteral("%1: %2").arg(f, err);
      rows << info;
    }
    // Back to the GUI thread (qApp lives there); the dialog may be gone.
    QMetaObject::invokeMethod(qApp, [self, rows, errors] {
      if (self) self->setRows(rows, errors);
    }, Qt::QueuedConnection);
  });
  connect(t, &QThread::finished, t, &QObject::deleteLater);
  t->start();
}

void ModelManager::setRows(const QList<ModelInfo>& rows, const QStringList& errors) {
  m_table->setRowCount(0);
  for (const ModelInfo& m : rows) {
    const int r = m_table->rowCount();
    m_table->insertRow(r);
    auto* file = new QTableWidgetItem(QFileInfo(m.path).fileName());
    file->setData(Qt::UserRole, m.path);
    m_table->setItem(r, 0, file);
    const bool ok = !m.architecture.isEmpty();
    m_table->setItem(r, 1, new QTableWidgetItem(ok ? m.architecture : tr("unreadable")));
    m_table->setItem(r, 2, new QTableWidgetItem(ok ? formatParamsWithActive(m) : QString()));
    m_table->setItem(r, 3, new QTableWidgetItem(m.typeMix));
    m_table->setItem(r, 4, new QTableWidgetItem(ok ? QString::number(m.contextTrained) : QString()));
    m_table->setItem(r, 5, new QTableWidgetItem(formatBytes(m.fileSize)));
    m_table->setItem(r, 6, new QTableWidgetItem(!ok || m.hasChatTemplate ? m.chatTemplate : tr("none: base model")));
  }
  QString status = rows.isEmpty() ? tr("No .gguf files here. Use Open file… or drop a model on the window.")
                                  : tr("%n model(s).", "", rows.size());
  if (!errors.isEmpty()) status += QLatin1Char(' ') + errors.join(QStringLiteral("; "));
  m_status->setText(status);
}

}  // namespace phaselab::ui
