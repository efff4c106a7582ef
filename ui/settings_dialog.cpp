#include "settings_dialog.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QRegularExpressionValidator>
#include <QSpinBox>
#include <QTabWidget>
#include <QVBoxLayout>

#include "phaselab/backend.h"
#include "phaselab/machine.h"

namespace phaselab::ui {

SettingsDialog::SettingsDialog(const AppSettings& current, const EngineConfig& loaded, bool hasModel, QWidget* parent)
    : QDialog(parent), m_initial(current), m_loaded(loaded), m_hasModel(hasModel) {
  setWindowTitle(tr("Settings"));
  auto* top = new QVBoxLayout(this);
  // Pages, so that the dialog fits a 1280x800 screen: the engine, its
  // answers, and the connections (a remote server, the API server).
  m_tabs = new QTabWidget;
  m_tabs->setObjectName(QStringLiteral("settingsTabs"));
  auto addPage = [this](const QString& title) {
    auto* page = new QWidget;
    auto* layout = new QVBoxLayout(page);
    m_tabs->addTab(page, title);
    return layout;
  };
  QVBoxLayout* engineLayout = addPage(tr("Engine"));
  QVBoxLayout* generationLayout = addPage(tr("Generation"));
  QVBoxLayout* serverLayout = addPage(tr("Servers"));
  top->addWidget(m_tabs);

  engineLayout->addWidget(buildEngineBox(current.engine));
  engineLayout->addStretch(1);
  generationLayout->addWidget(buildGenerationBox(current.generation));
  serverLayout->addWidget(buildRemoteBox(current));
  serverLayout->addWidget(buildServeBox(current));
  serverLayout->addStretch(1);

  m_reloadNote = new QLabel;
  m_reloadNote->setWordWrap(true);
  top->addWidget(m_reloadNote);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  top->addWidget(buttons);

  connect(m_backend, &QComboBox::currentIndexChanged, this, &SettingsDialog::updateReloadNote);
  connect(m_threads, &QSpinBox::valueChanged, this, &SettingsDialog::updateReloadNote);
  connect(m_context, &QSpinBox::valueChanged, this, &SettingsDialog::updateReloadNote);
  connect(m_kvType, &QComboBox::currentIndexChanged, this, &SettingsDialog::updateReloadNote);
  updateReloadNote();
}

namespace {
// The probe's reason is a clause ("the CUDA backend is not available (...)"):
// shown alone, as a sentence (it was "CUDA not available: the CUDA backend is
// not available").
QString capitalized(QString s) {
  if (!s.isEmpty()) s[0] = s[0].toUpper();
  return s;
}
}  // namespace

QGroupBox* SettingsDialog::buildEngineBox(const EngineConfig& engine) {
  auto* engineBox = new QGroupBox(tr("Engine (changes need a model reload)"));
  auto* ef = new QFormLayout(engineBox);
  m_backend = new QComboBox;
  // The item's data: the kind's name, as the settings keep it.
  auto kindName = [](BackendKind k) {
    const std::string_view n = to_string(k);
    return QString::fromUtf8(n.data(), static_cast<qsizetype>(n.size()));
  };
  m_backend->addItem(tr("CPU (fast, SIMD)"), kindName(BackendKind::cpu));
  m_backend->addItem(tr("CPU portable (no SIMD)"), kindName(BackendKind::cpu_portable));
  m_backend->addItem(tr("CPU reference (the oracle, slow)"), kindName(BackendKind::cpu_reference));
  m_backend->setCurrentIndex(std::max(0, m_backend->findData(engine.backend)));
  ef->addRow(tr("Backend:"), m_backend);
  // CUDA is offered when its library loads and finds a device; else why not.
  const CudaProbe cudaProbe = probe_cuda(backend_options_from_environment().cuda.library);
  if (cudaProbe.available)
    m_backend->addItem(tr("CUDA: %1").arg(QString::fromStdString(cudaProbe.description)), kindName(BackendKind::cuda));
  m_backend->setCurrentIndex(std::max(0, m_backend->findData(engine.backend)));
  auto* cuda = new QLabel(cudaProbe.available ? tr("CUDA available: %1").arg(QString::fromStdString(cudaProbe.description))
                                              : capitalized(QString::fromStdString(cudaProbe.reason)));
  cuda->setWordWrap(true);
  cuda->setEnabled(cudaProbe.available);
  ef->addRow(QString(), cuda);
  m_threads = new QSpinBox;
  m_threads->setRange(0, 256);
  m_threads->setSpecialValueText(tr("auto: one per physical core (%1)").arg(default_thread_count()));
  m_threads->setValue(engine.threads);
  ef->addRow(tr("Threads:"), m_threads);
  m_context = new QSpinBox;
  m_context->setObjectName(QStringLiteral("contextSpin"));
  m_context->setRange(0, 1 << 20);
  m_context->setSingleStep(512);
  m_context->setSpecialValueText(tr("the model's (at most 4096)"));
  m_context->setValue(engine.contextSize);
  ef->addRow(tr("Context size:"), m_context);
  m_engineError = new QLabel;
  m_engineError->setObjectName(QStringLiteral("engineError"));
  m_engineError->setWordWrap(true);
  m_engineError->setStyleSheet(QStringLiteral("color: #c0392b;"));
  m_engineError->hide();
  ef->addRow(QString(), m_engineError);
  m_kvType = new QComboBox;
  m_kvType->setObjectName(QStringLiteral("kvTypeCombo"));
  m_kvType->addItem(tr("F16 (half the memory, as llama.cpp)"), QStringLiteral("f16"));
  m_kvType->addItem(tr("BF16 (the same memory, F32's range)"), QStringLiteral("bf16"));
  m_kvType->addItem(tr("F32"), QStringLiteral("f32"));
  m_kvType->addItem(tr("Q8_0 (8-bit blocks: about half of F16's memory)"), QStringLiteral("q8_0"));
  m_kvType->setCurrentIndex(std::max(0, m_kvType->findData(engine.kvType)));
  m_kvType->setToolTip(tr("How the KV cache stores keys and values: F16 rounds them to half precision and holds "
                          "twice the positions in the same memory"));
  ef->addRow(tr("KV cache storage:"), m_kvType);
  return engineBox;
}

QGroupBox* SettingsDialog::buildGenerationBox(const GenerationSettings& g) {
  auto* sampling = new QGroupBox(tr("Generation (applies to the next answer)"));
  auto* sf = new QFormLayout(sampling);
  auto dspin = [](double lo, double hi, double step, double v, int decimals = 2) {
    auto* s = new QDoubleSpinBox;
    s->setRange(lo, hi);
    s->setSingleStep(step);
    s->setDecimals(decimals);
    s->setValue(v);
    return s;
  };
  m_temperature = dspin(0, 5, 0.05, g.temperature);
  m_temperature->setToolTip(tr("0 = greedy (always the most likely token)"));
  sf->addRow(tr("Temperature:"), m_temperature);
  m_topK = new QSpinBox;
  m_topK->setRange(0, 1000);
  m_topK->setSpecialValueText(tr("off"));
  m_topK->setValue(g.topK);
  sf->addRow(tr("Top-k:"), m_topK);
  m_topP = dspin(0.01, 1, 0.01, g.topP);
  sf->addRow(tr("Top-p:"), m_topP);
  m_minP = dspin(0, 0.99, 0.01, g.minP);
  sf->addRow(tr("Min-p:"), m_minP);
  m_repeatPenalty = dspin(0.5, 3, 0.05, g.repeatPenalty);
  sf->addRow(tr("Repeat penalty:"), m_repeatPenalty);
  m_seed = new QLineEdit(g.seed ? QString::number(g.seed) : QString());
  m_seed->setPlaceholderText(tr("random"));
  m_seed->setValidator(new QRegularExpressionValidator(QRegularExpression(QStringLiteral("[0-9]{0,19}")), m_seed));
  sf->addRow(tr("Seed:"), m_seed);
  m_maxTokens = new QSpinBox;
  m_maxTokens->setRange(1, 1 << 20);
  m_maxTokens->setValue(g.maxTokens);
  sf->addRow(tr("Answer token limit:"), m_maxTokens);
  m_kvCache = new QCheckBox(tr("Use the KV cache (off: recompute the whole sequence every token, slow on purpose)"));
  m_kvCache->setChecked(g.useKvCache);
  sf->addRow(tr("KV cache:"), m_kvCache);
  m_prefixCache = new QCheckBox(tr("Reuse cached prefixes (earlier turns, other conversations, the system prompt)"));
  m_prefixCache->setChecked(g.prefixCache);
  sf->addRow(tr("Prefix cache:"), m_prefixCache);
  m_speculative = new QComboBox;
  m_speculative->addItem(tr("Off"), QString::fromLatin1(to_string(SpeculativeMode::off)));
  m_speculative->addItem(tr("Prompt lookup (n-grams of the conversation)"),
                         QString::fromLatin1(to_string(SpeculativeMode::prompt_lookup)));
  m_speculative->addItem(tr("Draft model"), QString::fromLatin1(to_string(SpeculativeMode::draft_model)));
  m_speculative->addItem(tr("Self (the model with layers skipped; CPU)"),
                         QString::fromLatin1(to_string(SpeculativeMode::self_draft)));
  m_speculative->setCurrentIndex(std::max(0, m_speculative->findData(g.speculative)));
  sf->addRow(tr("Speculative decoding:"), m_speculative);
  m_specK = new QSpinBox;
  m_specK->setRange(1, 16);
  m_specK->setValue(g.specK);
  sf->addRow(tr("Tokens drafted per pass:"), m_specK);
  m_draftModel = new QLineEdit(g.draftModel);
  m_draftModel->setPlaceholderText(tr("a smaller GGUF with the same vocabulary"));
  sf->addRow(tr("Draft model:"), m_draftModel);
  m_specSkip = new QLineEdit(g.specSkip);
  m_specSkip->setObjectName(QStringLiteral("specSkipEdit"));
  m_specSkip->setPlaceholderText(tr("default: the layer before the middle, e.g. 8 of 18"));
  m_specSkip->setToolTip(tr("Self-speculation: the layers the draft leaves out, counted from 0 (8-13 or 3,5,9-11)"));
  sf->addRow(tr("Layers the self draft skips:"), m_specSkip);
  m_systemPrompt = new QPlainTextEdit(g.systemPrompt);
  m_systemPrompt->setMaximumHeight(80);
  sf->addRow(tr("System prompt:"), m_systemPrompt);
  return sampling;
}

// A remote server instead of a local model: the chat streams from it, and
// the metrics are what this side can measure.
QGroupBox* SettingsDialog::buildRemoteBox(const AppSettings& current) {
  auto* remoteBox = new QGroupBox(tr("Remote server (instead of a local model)"));
  auto* rf = new QFormLayout(remoteBox);
  m_useRemote = new QCheckBox(tr("Chat with a remote OpenAI-compatible server"));
  m_useRemote->setObjectName(QStringLiteral("useRemoteCheck"));
  m_useRemote->setToolTip(tr("PhaseLab's own server, vLLM, SGLang, llama-server, NVIDIA Dynamo... PhaseLab connects "
                             "when you press OK; opening a local model switches back."));
  m_useRemote->setChecked(current.useRemote);
  rf->addRow(m_useRemote);
  m_remoteUrl = new QLineEdit(current.remote.url);
  m_remoteUrl->setObjectName(QStringLiteral("remoteUrlEdit"));
  m_remoteUrl->setPlaceholderText(QStringLiteral("http://127.0.0.1:8000/v1"));
  rf->addRow(tr("URL:"), m_remoteUrl);
  m_remoteKey = new QLineEdit(current.remote.apiKey);
  m_remoteKey->setObjectName(QStringLiteral("remoteKeyEdit"));
  m_remoteKey->setEchoMode(QLineEdit::Password);
  m_remoteKey->setPlaceholderText(tr("none"));
  m_remoteKey->setToolTip(tr("Sent as \"Authorization: Bearer KEY\". Kept in PhaseLab's settings file in plain text."));
  rf->addRow(tr("API key:"), m_remoteKey);
  m_remoteModel = new QLineEdit(current.remote.model);
  m_remoteModel->setObjectName(QStringLiteral("remoteModelEdit"));
  m_remoteModel->setPlaceholderText(tr("the first the server lists"));
  rf->addRow(tr("Model:"), m_remoteModel);
  auto enableRemote = [this](bool on) {
    for (QWidget* w : {static_cast<QWidget*>(m_remoteUrl), static_cast<QWidget*>(m_remoteKey),
                       static_cast<QWidget*>(m_remoteModel)})
      w->setEnabled(on);
  };
  connect(m_useRemote, &QCheckBox::toggled, this, enableRemote);
  enableRemote(current.useRemote);
  return remoteBox;
}

// The loaded model over the OpenAI API, for other programs on this machine.
QGroupBox* SettingsDialog::buildServeBox(const AppSettings& current) {
  auto* serveBox = new QGroupBox(tr("OpenAI API server"));
  serveBox->setToolTip(tr("The server has its own KV cache (memory beside the chat's) and shares the CPU with the "
                          "chat: an answer in the window and a request to the server slow each other down."));
  auto* vf = new QFormLayout(serveBox);
  m_serve = new QCheckBox(tr("Serve the loaded model"));
  m_serve->setObjectName(QStringLiteral("serveCheck"));
  m_serve->setToolTip(serveBox->toolTip() + tr(" Only programs on this machine can connect (127.0.0.1)."));
  m_serve->setChecked(current.serve);
  vf->addRow(m_serve);
  m_servePort = new QSpinBox;
  m_servePort->setObjectName(QStringLiteral("servePortSpin"));
  m_servePort->setRange(0, 65535);
  m_servePort->setSpecialValueText(tr("any free port"));
  m_servePort->setValue(current.servePort);
  vf->addRow(tr("Port:"), m_servePort);
  m_serveStatus = new QLabel(tr("Not serving."));
  m_serveStatus->setObjectName(QStringLiteral("serveStatus"));
  m_serveStatus->setWordWrap(true);
  m_serveStatus->setTextInteractionFlags(Qt::TextSelectableByMouse);
  vf->addRow(tr("Address:"), m_serveStatus);
  return serveBox;
}

AppSettings SettingsDialog::settings() const {
  AppSettings a = m_initial;
  a.engine.backend = m_backend->currentData().toString();
  a.engine.threads = m_threads->value();
  a.engine.contextSize = m_context->value();
  a.engine.kvType = m_kvType->currentData().toString();
  GenerationSettings& g = a.generation;
  g.temperature = static_cast<float>(m_temperature->value());
  g.topK = m_topK->value();
  g.topP = static_cast<float>(m_topP->value());
  g.minP = static_cast<float>(m_minP->value());
  g.repeatPenalty = static_cast<float>(m_repeatPenalty->value());
  g.seed = m_seed->text().toULongLong();
  g.maxTokens = m_maxTokens->value();
  g.useKvCache = m_kvCache->isChecked();
  g.prefixCache = m_prefixCache->isChecked();
  g.speculative = m_speculative->currentData().toString();
  g.specK = m_specK->value();
  g.draftModel = m_draftModel->text().trimmed();
  g.specSkip = m_specSkip->text().trimmed();
  g.systemPrompt = m_systemPrompt->toPlainText();
  a.useRemote = m_useRemote->isChecked();
  a.remote.url = m_remoteUrl->text().trimmed();
  a.remote.apiKey = m_remoteKey->text().trimmed();
  a.remote.model = m_remoteModel->text().trimmed();
  a.serve = m_serve->isChecked();
  a.servePort = m_servePort->value();
  return a;
}

void SettingsDialog::setServeStatus(const QString& text) { m_serveStatus->setText(text); }

QString SettingsDialog::serveStatus() const { return m_serveStatus->text(); }

void SettingsDialog::showServersPage() { m_tabs->setCurrentIndex(2); }

void SettingsDialog::setTrainedContext(int tokens) {
  m_trainedContext = tokens;
  if (tokens > 0) m_context->setToolTip(tr("0: the model's own, at most 4096; at most %1 (what the model was trained "
                                           "for)").arg(tokens));
  updateReloadNote();
}

QString SettingsDialog::engineError() const {
  const int ctx = m_context->value();
  if (ctx == 0) return {};
  if (ctx < kMinContext)
    return tr("A context of %1 tokens is too small: at least %2 (the chat template and an answer need room), or 0 for "
              "the model's.").arg(ctx).arg(kMinContext);
  if (m_trainedContext > 0 && ctx > m_trainedContext)
    return tr("The loaded model was trained for %1 tokens of context; %2 is more than it can use. Choose at most %1, "
              "or 0 for the model's.").arg(m_trainedContext).arg(ctx);
  return {};
}

void SettingsDialog::accept() {
  const QString error = engineError();
  if (!error.isEmpty()) {
    // Nothing is applied or saved: the loaded model stays as it is.
    m_tabs->setCurrentIndex(0);
    m_engineError->setText(error);
    m_engineError->show();
    m_context->setFocus();
    return;
  }
  QDialog::accept();
}

bool SettingsDialog::needsReload() const {
  if (!m_hasModel) return false;
  const EngineConfig e = settings().engine;
  return e.backend != m_loaded.backend || e.threads != m_loaded.threads || e.contextSize != m_loaded.contextSize ||
         e.kvType != m_loaded.kvType;
}

void SettingsDialog::updateReloadNote() {
  const QString error = engineError();
  m_engineError->setText(error);
  m_engineError->setVisible(!error.isEmpty());
  m_reloadNote->setText(needsReload() ? tr("The backend, thread, context or KV storage change takes effect when the model is "
                                           "reloaded: PhaseLab reloads it when you press OK.")
                                      : QString());
}

}  // namespace phaselab::ui
