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
#include <QVBoxLayout>

#include "phaselab/backend.h"
#include "phaselab/machine.h"

namespace phaselab::ui {

SettingsDialog::SettingsDialog(const AppSettings& current, const EngineConfig& loaded, bool hasModel, QWidget* parent)
    : QDialog(parent), m_initial(current), m_loaded(loaded), m_hasModel(hasModel) {
  setWindowTitle(tr("Settings"));
  auto* layout = new QVBoxLayout(this);

  auto* engineBox = new QGroupBox(tr("Engine (changes need a model reload)"));
  auto* ef = new QFormLayout(engineBox);
  m_backend = new QComboBox;
  m_backend->addItem(tr("CPU (fast, SIMD)"), QStringLiteral("cpu"));
  m_backend->addItem(tr("CPU portable (no SIMD)"), QStringLiteral("cpu-portable"));
  m_backend->addItem(tr("CPU reference (the oracle, slow)"), QStringLiteral("cpu-reference"));
  m_backend->setCurrentIndex(std::max(0, m_backend->findData(current.engine.backend)));
  ef->addRow(tr("Backend:"), m_backend);
  // CUDA is offered when its library loads and finds a device; else why not.
  const CudaProbe cudaProbe = probe_cuda();
  if (cudaProbe.available) m_backend->addItem(tr("CUDA: %1").arg(QString::fromStdString(cudaProbe.description)), QStringLiteral("cuda"));
  m_backend->setCurrentIndex(std::max(0, m_backend->findData(current.engine.backend)));
  auto* cuda = new QLabel(cudaProbe.available ? tr("CUDA available: %1").arg(QString::fromStdString(cudaProbe.description))
                                              : tr("CUDA not available: %1").arg(QString::fromStdString(cudaProbe.reason)));
  cuda->setWordWrap(true);
  cuda->setEnabled(cudaProbe.available);
  ef->addRow(QString(), cuda);
  m_threads = new QSpinBox;
  m_threads->setRange(0, 256);
  m_threads->setSpecialValueText(tr("auto: one per physical core (%1)").arg(default_thread_count()));
  m_threads->setValue(current.engine.threads);
  ef->addRow(tr("Threads:"), m_threads);
  m_context = new QSpinBox;
  m_context->setRange(0, 1 << 20);
  m_context->setSingleStep(512);
  m_context->setSpecialValueText(tr("the model's (at most 4096)"));
  m_context->setValue(current.engine.contextSize);
  ef->addRow(tr("Context size:"), m_context);
  m_kvType = new QComboBox;
  m_kvType->setObjectName(QStringLiteral("kvTypeCombo"));
  m_kvType->addItem(tr("F16 (half the memory, as llama.cpp)"), QStringLiteral("f16"));
  m_kvType->addItem(tr("F32"), QStringLiteral("f32"));
  m_kvType->setCurrentIndex(std::max(0, m_kvType->findData(current.engine.kvType)));
  m_kvType->setToolTip(tr("How the KV cache stores keys and values: F16 rounds them to half precision and holds "
                          "twice the positions in the same memory"));
  ef->addRow(tr("KV cache storage:"), m_kvType);
  layout->addWidget(engineBox);

  auto* sampling = new QGroupBox(tr("Generation (applies to the next answer)"));
  auto* sf = new QFormLayout(sampling);
  const GenerationSettings& g = current.generation;
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
  m_speculative->addItem(tr("Off"), QStringLiteral("none"));
  m_speculative->addItem(tr("Prompt lookup (n-grams of the conversation)"), QStringLiteral("lookup"));
  m_speculative->addItem(tr("Draft model"), QStringLiteral("draft"));
  m_speculative->setCurrentIndex(std::max(0, m_speculative->findData(g.speculative)));
  sf->addRow(tr("Speculative decoding:"), m_speculative);
  m_specK = new QSpinBox;
  m_specK->setRange(1, 16);
  m_specK->setValue(g.specK);
  sf->addRow(tr("Tokens drafted per pass:"), m_specK);
  m_draftModel = new QLineEdit(g.draftModel);
  m_draftModel->setPlaceholderText(tr("a smaller GGUF with the same vocabulary"));
  sf->addRow(tr("Draft model:"), m_draftModel);
  m_systemPrompt = new QPlainTextEdit(g.systemPrompt);
  m_systemPrompt->setMaximumHeight(80);
  sf->addRow(tr("System prompt:"), m_systemPrompt);
  layout->addWidget(sampling);

  m_reloadNote = new QLabel;
  m_reloadNote->setWordWrap(true);
  layout->addWidget(m_reloadNote);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  layout->addWidget(buttons);

  connect(m_backend, &QComboBox::currentIndexChanged, this, &SettingsDialog::updateReloadNote);
  connect(m_threads, &QSpinBox::valueChanged, this, &SettingsDialog::updateReloadNote);
  connect(m_context, &QSpinBox::valueChanged, this, &SettingsDialog::updateReloadNote);
  connect(m_kvType, &QComboBox::currentIndexChanged, this, &SettingsDialog::updateReloadNote);
  updateReloadNote();
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
  g.systemPrompt = m_systemPrompt->toPlainText();
  return a;
}

bool SettingsDialog::needsReload() const {
  if (!m_hasModel) return false;
  const EngineConfig e = settings().engine;
  return e.backend != m_loaded.backend || e.threads != m_loaded.threads || e.contextSize != m_loaded.contextSize ||
         e.kvType != m_loaded.kvType;
}

void SettingsDialog::updateReloadNote() {
  m_reloadNote->setText(needsReload() ? tr("The backend, thread, context or KV storage change takes effect when the model is "
                                           "reloaded: PhaseLab reloads it when you press OK.")
                                      : QString());
}

}  // namespace phaselab::ui
