#include "hub_token_store.h"

#include <algorithm>

#include <QDialogButtonBox>
#include <QHash>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QVBoxLayout>
#include <qt6keychain/keychain.h>

namespace phaselab::ui {

namespace {

// Tokens kept for this session where the secret store refused them, per
// service: a later dialog (each opening makes a new one) still has them.
QHash<QString, QString>& sessionTokens() {
  static QHash<QString, QString> tokens;
  return tokens;
}

}  // namespace

HubTokenStore::HubTokenStore(QObject* parent, const QString& service) : QObject(parent), m_service(service) {}

QString HubTokenStore::environmentToken() { return qEnvironmentVariable("HF_TOKEN").trimmed(); }

QString HubTokenStore::token() const {
  const QString env = environmentToken();
  if (!env.isEmpty()) return env;
  if (!m_stored.isEmpty()) return m_stored;
  return sessionTokens().value(m_service);
}

HubTokenStore::Source HubTokenStore::source() const {
  if (!environmentToken().isEmpty()) return Source::environment;
  if (!m_stored.isEmpty()) return Source::secretStore;
  if (!sessionTokens().value(m_service).isEmpty()) return Source::memory;
  return Source::none;
}

QString HubTokenStore::statusText() const {
  switch (source()) {
    case Source::environment:
      return tr("Token: using HF_TOKEN from the environment.");
    case Source::secretStore:
      return tr("Token: kept in the desktop's secret store.");
    case Source::memory:
      return tr("No secret store on this desktop: the token is kept until PhaseLab closes; set HF_TOKEN to keep it.");
    case Source::none:
      break;
  }
  if (m_busy > 0) return tr("Token: reading the secret store…");
  return tr("No token: public repositories only (a gated model needs one: Token…).");
}

void HubTokenStore::load() {
  if (!m_secretStoreEnabled) {
    m_storeUnavailable = true;
    emit changed();
    return;
  }
  // Not parented: a job deleted while its backend still answers is not safe;
  // it deletes itself once finished, and `this` as the context drops the
  // answer if the store has gone by then.
  auto* job = new QKeychain::ReadPasswordJob(m_service);
  job->setKey(QString::fromLatin1(kKey));
  m_busy++;
  connect(job, &QKeychain::Job::finished, this, [this](QKeychain::Job* j) {
    m_busy--;
    if (j->error() == QKeychain::NoError) {
      m_stored = static_cast<QKeychain::ReadPasswordJob*>(j)->textData().trimmed();
    } else if (j->error() != QKeychain::EntryNotFound) {
      m_storeUnavailable = true;
      m_storeError = j->errorString();
    }
    emit changed();
  });
  job->start();
}

void HubTokenStore::keepInMemory(const QString& token, const QString& why) {
  m_storeUnavailable = true;
  if (!why.isEmpty()) m_storeError = why;
  m_stored.clear();
  sessionTokens()[m_service] = token;
  emit changed();
}

void HubTokenStore::save(const QString& rawToken) {
  const QString token = rawToken.trimmed();
  if (!m_secretStoreEnabled) {
    keepInMemory(token, {});
    return;
  }
  m_busy++;
  if (token.isEmpty()) {
    auto* job = new QKeychain::DeletePasswordJob(m_service);
    job->setKey(QString::fromLatin1(kKey));
    connect(job, &QKeychain::Job::finished, this, [this](QKeychain::Job*) {
      m_busy--;
      m_stored.clear();
      sessionTokens().remove(m_service);
      emit changed();
    });
    job->start();
    return;
  }
  auto* job = new QKeychain::WritePasswordJob(m_service);
  job->setKey(QString::fromLatin1(kKey));
  job->setTextData(token);
  connect(job, &QKeychain::Job::finished, this, [this, token](QKeychain::Job* j) {
    m_busy--;
    if (j->error() == QKeychain::NoError) {
      m_stored = token;
      sessionTokens().remove(m_service);
      emit changed();
    } else {
      keepInMemory(token, j->errorString());
    }
  });
  job->start();
}

HubTokenDialog::HubTokenDialog(HubTokenStore* store, QWidget* parent) : QDialog(parent), m_store(store) {
  setObjectName(QStringLiteral("hubTokenDialog"));
  setWindowTitle(tr("Hugging Face Token"));
  auto* layout = new QVBoxLayout(this);
  auto* intro = new QLabel(tr("A token lets PhaseLab download gated models whose conditions you have accepted on "
                              "huggingface.co. Create a read token under Settings > Access Tokens there."));
  intro->setWordWrap(true);
  layout->addWidget(intro);
  m_edit = new QLineEdit;
  m_edit->setEchoMode(QLineEdit::Password);
  m_edit->setPlaceholderText(tr("hf_…"));
  m_edit->setClearButtonEnabled(true);
  layout->addWidget(m_edit);
  m_where = new QLabel;
  m_where->setWordWrap(true);
  layout->addWidget(m_where);
  auto* buttons = new QDialogButtonBox;
  m_save = buttons->addButton(tr("Save"), QDialogButtonBox::AcceptRole);
  m_remove = buttons->addButton(tr("Remove"), QDialogButtonBox::DestructiveRole);
  buttons->addButton(QDialogButtonBox::Cancel);
  layout->addWidget(buttons);
  const auto showWhere = [this] {
    QString where = m_store->statusText();
    if (m_store->source() == HubTokenStore::Source::environment)
      where += QLatin1Char(' ') + tr("A token saved here is used once HF_TOKEN is unset.");
    else if (m_store->source() == HubTokenStore::Source::none && m_store->secretStoreUnavailable())
      where += QLatin1Char(' ') + tr("No secret store on this desktop: a token saved here is kept until PhaseLab "
                                     "closes; set HF_TOKEN to keep it.");
    else if (m_store->source() == HubTokenStore::Source::none)
      where += QLatin1Char(' ') + tr("Saved in the desktop's secret store, never in a file.");
    m_where->setText(where);
    m_where->setToolTip(m_store->storeError());
    m_remove->setEnabled(m_store->source() == HubTokenStore::Source::secretStore ||
                         m_store->source() == HubTokenStore::Source::memory);
  };
  showWhere();
  connect(m_store, &HubTokenStore::changed, this, showWhere);
  m_save->setEnabled(false);
  connect(m_edit, &QLineEdit::textChanged, this, [this](const QString& t) { m_save->setEnabled(!t.trimmed().isEmpty()); });
  connect(m_save, &QPushButton::clicked, this, [this] {
    m_store->save(m_edit->text());
    m_edit->clear();  // the dialog keeps no copy
    accept();
  });
  connect(m_remove, &QPushButton::clicked, this, [this] {
    m_store->save(QString());
    accept();
  });
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  resize(std::max(sizeHint().width(), 460), sizeHint().height());
}

}  // namespace phaselab::ui
