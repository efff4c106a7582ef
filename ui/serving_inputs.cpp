#include "serving_inputs.h"

#include <QCheckBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QRegularExpression>
#include <QSpinBox>
#include <QVBoxLayout>

#include "phaselab/log.h"

namespace phaselab::ui {

namespace {

QSpinBox* spin(int lo, int hi, int value, const QString& suffix, const QString& name) {
  auto* s = new QSpinBox;
  s->setRange(lo, hi);
  s->setValue(value);
  s->setSuffix(suffix);
  s->setAccessibleName(name);
  return s;
}

QDoubleSpinBox* dspin(double hi, double value, const QString& suffix, const QString& special, const QString& name) {
  auto* s = new QDoubleSpinBox;
  s->setRange(0, hi);
  s->setDecimals(1);
  s->setValue(value);
  s->setSuffix(suffix);
  s->setSpecialValueText(special);
  s->setAccessibleName(name);
  return s;
}

}  // namespace

ServingInputs::ServingInputs(QWidget* parent) : QWidget(parent) {
  auto* col = new QVBoxLayout(this);
  col->setContentsMargins(0, 0, 0, 0);
  col->setSpacing(4);
  auto* modelRow = new QHBoxLayout;
  modelRow->addWidget(new QLabel(tr("Model:")));
  m_model = new QLineEdit;
  m_model->setAccessibleName(tr("Model"));
  m_model->setPlaceholderText(tr("a GGUF model file"));
  modelRow->addWidget(m_model, 1);
  auto* choose = new QPushButton(tr("Choose…"));
  choose->setAccessibleName(tr("Choose the model"));
  connect(choose, &QPushButton::clicked, this, &ServingInputs::chooseModel);
  modelRow->addWidget(choose);
  col->addLayout(modelRow);

  // Four label/value pairs a row: two rows fit 800 pixels.
  m_threads = spin(0, 256, 0, QString(), tr("Threads"));
  m_threads->setSpecialValueText(tr("per core"));
  m_threads->setToolTip(tr("CPU threads of the run (disaggregated splits its own: P + D cores); 0: one per physical core"));
  m_streams = spin(1, 256, 4, QString(), tr("Chat streams"));
  m_streams->setToolTip(tr("Chat streams decoding all along: short prompts, long answers"));
  m_longPrompt = spin(16, 131072, 2000, tr(" tok"), tr("Long prompt length"));
  m_longPrompt->setToolTip(tr("Tokens of each long-document prompt (distinct prompts: no prefix cache helps)"));
  m_longCount = spin(0, 10000, 1, QString(), tr("Long requests"));
  m_longRate = dspin(100, 0, tr(" /s"), tr("at once"), tr("Arrival rate"));
  m_longRate->setToolTip(tr("Long requests per second, Poisson arrivals (seeded); 0: all of them at the long start"));
  m_duration = dspin(3600, 0, tr(" s"), tr("until done"), tr("Duration"));
  m_duration->setToolTip(tr("How long each run lasts; 0: until the long requests are answered"));
  m_ttft = spin(1, 600000, 5000, tr(" ms"), tr("TTFT target"));
  m_ttft->setToolTip(tr("Goodput counts the requests whose first token came within this"));
  m_itl = spin(1, 60000, 250, tr(" ms"), tr("ITL target"));
  m_itl->setToolTip(tr("… and none of whose gaps between two tokens was longer than this"));
  auto* grid = new QGridLayout;
  grid->setHorizontalSpacing(6);
  grid->setVerticalSpacing(3);
  const std::pair<QString, QWidget*> cells[] = {
      {tr("Threads:"), m_threads},       {tr("Streams:"), m_streams},   {tr("Long prompt:"), m_longPrompt},
      {tr("Long requests:"), m_longCount}, {tr("Arrival:"), m_longRate}, {tr("Duration:"), m_duration},
      {tr("TTFT target:"), m_ttft},      {tr("ITL target:"), m_itl}};
  for (int i = 0; i < 8; i++) {
    auto* label = new QLabel(cells[i].first);
    label->setBuddy(cells[i].second);
    grid->addWidget(label, i / 4, (i % 4) * 2, Qt::AlignRight);
    grid->addWidget(cells[i].second, i / 4, (i % 4) * 2 + 1);
    grid->setColumnStretch((i % 4) * 2 + 1, 1);
  }
  col->addLayout(grid);

  auto* policies = new QHBoxLayout;
  policies->setSpacing(4);
  policies->addWidget(new QLabel(tr("Policies:")));
  m_prefillFirst = new QCheckBox(tr("prefill-first"));
  m_prefillFirst->setChecked(true);
  m_prefillFirst->setToolTip(tr("A waiting prompt is prefilled whole before the decodes resume"));
  m_chunked = new QCheckBox(tr("chunked:"));
  m_chunked->setChecked(true);
  m_chunked->setToolTip(tr("A token budget per pass: prefill chunks mixed with the decodes"));
  m_chunk = spin(16, 65536, 256, QString(), tr("Chunk tokens"));
  m_chunkedAuto = new QCheckBox(tr("chunked:auto"));
  m_chunkedAuto->setChecked(true);
  m_chunkedAuto->setToolTip(tr("Chunks sized by time: beside decodes, only the prompt tokens that add at most half a "
                               "decode pass (the server's default)"));
  m_disaggregated = new QCheckBox(tr("disaggregated:"));
  m_disaggregated->setChecked(true);
  m_disaggregated->setToolTip(tr("A prefill worker on P cores and a decode worker on D cores; the prompt's K/V moves between them"));
  m_prefillCores = spin(1, 256, 1, QString(), tr("Prefill cores"));
  m_decodeCores = spin(1, 256, 1, QString(), tr("Decode cores"));
  m_baseline = new QCheckBox(tr("baseline"));
  m_baseline->setChecked(true);
  m_baseline->setToolTip(tr("First a run without long prompts: the chat streams' ITL to compare with"));
  policies->addWidget(m_prefillFirst);
  policies->addSpacing(6);
  policies->addWidget(m_chunked);
  policies->addWidget(m_chunk);
  policies->addSpacing(6);
  policies->addWidget(m_chunkedAuto);
  policies->addSpacing(6);
  policies->addWidget(m_disaggregated);
  policies->addWidget(m_prefillCores);
  policies->addWidget(new QLabel(QStringLiteral("+")));
  policies->addWidget(m_decodeCores);
  policies->addSpacing(6);
  policies->addWidget(m_baseline);
  policies->addStretch(1);
  col->addLayout(policies);
}

void ServingInputs::chooseModel() {
  const QString p = QFileDialog::getOpenFileName(this, tr("Model"), QString::fromStdString(user_model_dir()),
                                                 tr("GGUF models (*.gguf);;All files (*)"));
  if (!p.isEmpty()) m_model->setText(p);
}

void ServingInputs::setModel(const QString& path) { m_model->setText(path); }
QString ServingInputs::model() const { return m_model->text(); }

ServingRequest ServingInputs::request() const {
  ServingRequest r;
  r.model = m_model->text();
  r.threads = m_threads->value();
  if (m_prefillFirst->isChecked()) r.policies << QStringLiteral("prefill-first");
  if (m_chunked->isChecked()) r.policies << QStringLiteral("chunked:%1").arg(m_chunk->value());
  if (m_chunkedAuto->isChecked()) r.policies << QStringLiteral("chunked:auto");
  if (m_disaggregated->isChecked())
    r.policies << QStringLiteral("disaggregated:%1+%2").arg(m_prefillCores->value()).arg(m_decodeCores->value());
  r.streams = m_streams->value();
  r.longPrompt = m_longPrompt->value();
  r.longCount = m_longCount->value();
  r.longRate = m_longRate->value();
  r.durationS = m_duration->value();
  r.ttftTargetMs = m_ttft->value();
  r.itlTargetMs = m_itl->value();
  r.baseline = m_baseline->isChecked();
  return r;
}

void ServingInputs::setRequest(const ServingRequest& r) {
  m_model->setText(r.model);
  m_threads->setValue(r.threads);
  m_streams->setValue(r.streams);
  m_longPrompt->setValue(r.longPrompt);
  m_longCount->setValue(r.longCount);
  m_longRate->setValue(r.longRate);
  m_duration->setValue(r.durationS);
  m_ttft->setValue(static_cast<int>(r.ttftTargetMs));
  m_itl->setValue(static_cast<int>(r.itlTargetMs));
  m_baseline->setChecked(r.baseline);
  m_prefillFirst->setChecked(false);
  m_chunked->setChecked(false);
  m_chunkedAuto->setChecked(false);
  m_disaggregated->setChecked(false);
  static const QRegularExpression chunked(QStringLiteral("^chunked:(\\d+)$"));
  static const QRegularExpression disaggregated(QStringLiteral("^disaggregated:(\\d+)\\+(\\d+)$"));
  for (const QString& p : r.policies) {
    if (p == QLatin1String("prefill-first")) {
      m_prefillFirst->setChecked(true);
    } else if (p == QLatin1String("chunked:auto")) {
      m_chunkedAuto->setChecked(true);
    } else if (const auto m = chunked.match(p); m.hasMatch()) {
      m_chunked->setChecked(true);
      m_chunk->setValue(m.captured(1).toInt());
    } else if (const auto d = disaggregated.match(p); d.hasMatch()) {
      m_disaggregated->setChecked(true);
      m_prefillCores->setValue(d.captured(1).toInt());
      m_decodeCores->setValue(d.captured(2).toInt());
    }
  }
}

QString ServingInputs::validate() const {
  const QString m = m_model->text();
  if (m.isEmpty()) return tr("Choose a model (a GGUF file) to serve.");
  if (!QFileInfo(m).isFile()) return tr("The model %1 does not exist: choose a GGUF file.").arg(m);
  if (!m_prefillFirst->isChecked() && !m_chunked->isChecked() && !m_chunkedAuto->isChecked() &&
      !m_disaggregated->isChecked())
    return tr("Check at least one policy to run.");
  if (m_longCount->value() == 0 && m_duration->value() == 0)
    return tr("With no long requests, give a duration: the runs would have no end.");
  return {};
}

}  // namespace phaselab::ui
