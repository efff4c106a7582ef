#include "welcome_page.h"

#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>
#include <QVBoxLayout>

#include "app_identity.h"
#include "model_fetcher.h"
#include "phaselab/log.h"

namespace phaselab::ui {

WelcomePage::WelcomePage(QWidget* parent) : QWidget(parent), m_fetcher(new ModelFetcher(this)) {
  setObjectName(QStringLiteral("welcomePage"));
  auto* outer = new QVBoxLayout(this);
  outer->addStretch(1);
  auto* column = new QVBoxLayout;
  column->setSpacing(12);

  auto* icon = new QLabel;
  icon->setPixmap(appIcon().pixmap(96, 96));
  icon->setAlignment(Qt::AlignHCenter);
  column->addWidget(icon);
  auto* title = new QLabel(tr("<h2>Welcome to PhaseLab</h2>"));
  title->setAlignment(Qt::AlignHCenter);
  column->addWidget(title);
  auto* intro = new QLabel(tr("Chat with a language model on this computer and watch the two phases of every "
                              "answer: <b>prefill</b> reads your whole prompt at once (time to first token), "
                              "<b>decode</b> writes one token per pass (tokens per second). "
                              "PhaseLab needs a model in the GGUF format to start."));
  intro->setWordWrap(true);
  intro->setAlignment(Qt::AlignHCenter);
  column->addWidget(intro);

  m_defaultText = new QLabel;
  m_defaultText->setObjectName(QStringLiteral("welcomeDefaultText"));
  m_defaultText->setWordWrap(true);
  m_defaultText->setAlignment(Qt::AlignHCenter);
  column->addWidget(m_defaultText);

  // One above the other: the page stays narrow enough for an 800 px window
  // with both side panels open.
  auto* buttons = new QVBoxLayout;
  m_fetchButton = new QPushButton;
  m_fetchButton->setObjectName(QStringLiteral("fetchDefaultModel"));
  m_fetchButton->setDefault(true);
  buttons->addWidget(m_fetchButton, 0, Qt::AlignHCenter);
  m_openButton = new QPushButton(tr("Open a GGUF File…"));
  m_openButton->setObjectName(QStringLiteral("openModelFile"));
  buttons->addWidget(m_openButton, 0, Qt::AlignHCenter);
  column->addLayout(buttons);

  auto* progressRow = new QHBoxLayout;
  m_progress = new QProgressBar;
  m_progress->setObjectName(QStringLiteral("fetchProgress"));
  m_progress->setAccessibleName(tr("Download progress"));
  m_progress->setFormat(tr("%p%"));
  progressRow->addWidget(m_progress, 1);
  m_cancelButton = new QPushButton(tr("Cancel"));
  m_cancelButton->setObjectName(QStringLiteral("cancelFetch"));
  progressRow->addWidget(m_cancelButton);
  column->addLayout(progressRow);
  m_status = new QLabel;
  m_status->setObjectName(QStringLiteral("fetchStatus"));
  m_status->setWordWrap(true);
  m_status->setAlignment(Qt::AlignHCenter);
  m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
  column->addWidget(m_status);

  auto* centre = new QHBoxLayout;
  centre->addStretch(1);
  centre->addLayout(column, 8);
  centre->addStretch(1);
  outer->addLayout(centre);
  outer->addStretch(2);

  connect(m_openButton, &QPushButton::clicked, this, &WelcomePage::openFileRequested);
  connect(m_fetchButton, &QPushButton::clicked, this, [this] {
    const QString path = ModelFetcher::defaultModelPath();
    if (QFileInfo(path).isFile()) {
      emit loadRequested(path);
      return;
    }
    setFetching(true);
    m_progress->setRange(0, 0);  // busy until the first figure arrives
    m_fetcher->start();
  });
  connect(m_cancelButton, &QPushButton::clicked, m_fetcher, &ModelFetcher::cancel);
  connect(m_fetcher, &ModelFetcher::progress, this, [this](qint64 done, qint64 total) {
    if (total <= 0) return;
    m_progress->setRange(0, 1000);
    m_progress->setValue(static_cast<int>(1000 * done / total));
    m_progress->setFormat(tr("%1 of %2 MiB").arg(done >> 20).arg(total >> 20));
  });
  connect(m_fetcher, &ModelFetcher::statusChanged, m_status, &QLabel::setText);
  connect(m_fetcher, &ModelFetcher::finished, this, [this](const QString& path) {
    setFetching(false);
    m_status->setText(tr("Downloaded and checked: %1").arg(path));
    refresh();
    emit loadRequested(path);
  });
  connect(m_fetcher, &ModelFetcher::failed, this, [this](const QString& error) {
    setFetching(false);
    m_status->setText(tr("The download failed: %1 You can also open a GGUF file you already have.").arg(error));
  });
  connect(m_fetcher, &ModelFetcher::cancelled, this, [this] {
    setFetching(false);
    m_status->setText(tr("Download cancelled; nothing was kept in the model folder."));
  });
  setFetching(false);
  refresh();
}

void WelcomePage::refresh() {
  const bool present = QFileInfo(ModelFetcher::defaultModelPath()).isFile();
  const QString folder = QString::fromStdString(user_model_dir());
  if (present) {
    m_defaultText->setText(tr("The default model, Gemma 3 270M (Q4_K_M), is in your model folder (%1).").arg(folder));
    m_fetchButton->setText(tr("Load Gemma 3 270M"));
  } else {
    m_defaultText->setText(tr("Start with the default model, Gemma 3 270M (Q4_K_M, 227 MiB download), saved to "
                              "%1, or open a GGUF file you already have.").arg(folder));
    m_fetchButton->setText(tr("Download Gemma 3 270M"));
  }
}

void WelcomePage::setFetching(bool fetching) {
  m_fetchButton->setEnabled(!fetching);
  m_progress->setVisible(fetching);
  m_cancelButton->setVisible(fetching);
  if (fetching) m_status->clear();
}

}  // namespace phaselab::ui
