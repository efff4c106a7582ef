#include "conversation_export.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QRegularExpression>
#include <QStringView>
#include <QTimeZone>
#include <cmath>
#include <limits>

namespace phaselab::ui {

using namespace conversation_export;

namespace {

const QStringList kRoles = {QStringLiteral("user"), QStringLiteral("assistant"), QStringLiteral("system")};
const QStringList kStates = {QStringLiteral("done"), QStringLiteral("stopped"), QStringLiteral("interrupted"),
                             QStringLiteral("error"), QStringLiteral("streaming")};

QString roleHeading(const QString& role) {
  if (role == QLatin1String("user")) return QStringLiteral("User");
  if (role == QLatin1String("assistant")) return QStringLiteral("Assistant");
  if (role == QLatin1String("system")) return QStringLiteral("System");
  return role;
}

// Inline text (a summary line, a heading): the characters that would start
// emphasis, code or a link are escaped, line breaks become spaces.
QString escapeInline(const QString& s) {
  QString out;
  out.reserve(s.size() + 8);
  for (const QChar c : s) {
    if (c == QLatin1Char('\n') || c == QLatin1Char('\r')) {
      out += QLatin1Char(' ');
      continue;
    }
    if (QStringView(u"\\`*_[]<>#|").contains(c)) out += QLatin1Char('\\');
    out += c;
  }
  return out;
}

// The text as it is, plus a closing fence if it leaves a ``` or ~~~ block
// open (CommonMark: up to three spaces of indent, a closer of the same
// character at least as long, nothing after it).
QString closeOpenFence(const QString& text) {
  static const QRegularExpression fence(QStringLiteral(R"(^ {0,3}(`{3,}|~{3,})(.*)$)"));
  QChar openChar;
  qsizetype openLen = 0;
  for (const QString& line : text.split(QLatin1Char('\n'))) {
    const auto m = fence.match(line);
    if (!m.hasMatch()) continue;
    const QString marks = m.captured(1);
    if (openLen == 0) {
      // A backtick fence's info string may not hold a backtick.
      if (marks[0] == QLatin1Char('`') && m.captured(2).contains(QLatin1Char('`'))) continue;
      openChar = marks[0];
      openLen = marks.size();
    } else if (marks[0] == openChar && marks.size() >= openLen && m.captured(2).trimmed().isEmpty()) {
      openLen = 0;
    }
  }
  if (openLen == 0) return text;
  QString out = text;
  if (!out.endsWith(QLatin1Char('\n'))) out += QLatin1Char('\n');
  return out + QString(openLen, openChar);
}

// A reasoning model's reasoning as a block quote above the answer: every
// line quoted (a blank one as ">" alone), so no line of it can end the
// quote, start a heading of the export or open a fence that swallows the
// answer.
QString quoteReasoning(const QString& reasoning) {
  QString md = QStringLiteral("> *Reasoning:*\n>\n");
  QString text = reasoning;
  text.replace(QStringLiteral("\r\n"), QStringLiteral("\n")).replace(QLatin1Char('\r'), QLatin1Char('\n'));
  for (const QString& line : closeOpenFence(text).split(QLatin1Char('\n')))
    md += line.isEmpty() ? QStringLiteral(">\n") : QStringLiteral("> %1\n").arg(line);
  return md + QStringLiteral("\n");
}

QString isoUtc(const QDateTime& t) { return t.toTimeZone(QTimeZone::utc()).toString(Qt::ISODateWithMs); }

QJsonObject toJsonObject(const ConversationRecord& c, const ConversationSettings& s, const QList<MessageRecord>& msgs) {
  QJsonObject o;
  o[QStringLiteral("format")] = QString::fromLatin1(kFormat);
  o[QStringLiteral("version")] = kVersion;
  o[QStringLiteral("title")] = c.title;
  if (c.createdAt.isValid()) o[QStringLiteral("created_at")] = isoUtc(c.createdAt);
  o[QStringLiteral("mode")] = s.mode;
  o[QStringLiteral("system_prompt")] = s.hasSystemPrompt ? QJsonValue(s.systemPrompt) : QJsonValue(QJsonValue::Null);
  o[QStringLiteral("template")] = s.chatTemplate.isEmpty() ? QJsonValue(QJsonValue::Null) : QJsonValue(s.chatTemplate);
  QJsonArray arr;
  for (const MessageRecord& m : msgs) {
    QJsonObject jm;
    jm[QStringLiteral("role")] = m.role;
    jm[QStringLiteral("content")] = m.content.isNull() ? QStringLiteral("") : m.content;
    jm[QStringLiteral("state")] = m.state.isEmpty() ? QStringLiteral("done") : m.state;
    if (m.hasStats) jm[QStringLiteral("stats")] = m.stats.toJson();
    if (!m.reasoning.isEmpty()) jm[QStringLiteral("reasoning")] = m.reasoning;
    arr.append(jm);
  }
  o[QStringLiteral("messages")] = arr;
  return o;
}

// ---- import: every check names the field it refuses ----

struct Checker {
  QString error;

  bool fail(const QString& field, const QString& why) {
    if (error.isEmpty()) error = QStringLiteral("%1: %2").arg(field, why);
    return false;
  }

  static QString typeName(const QJsonValue& v) {
    switch (v.type()) {
      case QJsonValue::Null: return QStringLiteral("null");
      case QJsonValue::Bool: return QStringLiteral("a boolean");
      case QJsonValue::Double: return QStringLiteral("a number");
      case QJsonValue::String: return QStringLiteral("a string");
      case QJsonValue::Array: return QStringLiteral("an array");
      case QJsonValue::Object: return QStringLiteral("an object");
      case QJsonValue::Undefined: return QStringLiteral("missing");
    }
    return QStringLiteral("unknown");
  }

  // A string of at most maxChars UTF-16 units, valid Unicode, without NUL.
  bool text(const QString& field, const QJsonValue& v, int maxChars, QString* out) {
    if (v.isUndefined()) return fail(field, QStringLiteral("missing (a string is required)"));
    if (!v.isString()) return fail(field, QStringLiteral("must be a string, not %1").arg(typeName(v)));
    const QString s = v.toString();
    if (s.size() > maxChars)
      return fail(field, QStringLiteral("%1 characters, more than the %2 allowed").arg(s.size()).arg(maxChars));
    if (!s.isValidUtf16()) return fail(field, QStringLiteral("not valid Unicode (an unpaired surrogate)"));
    if (s.contains(QChar(u'\0'))) return fail(field, QStringLiteral("contains a NUL character"));
    *out = s;
    return true;
  }

  // A JSON number that is a whole number in [0, max].
  bool count(const QString& field, const QJsonValue& v, double max, double* out) {
    if (!v.isDouble()) return fail(field, QStringLiteral("must be a number, not %1").arg(typeName(v)));
    const double d = v.toDouble();
    if (!std::isfinite(d) || d < 0 || d > max || d != std::floor(d))
      return fail(field, QStringLiteral("must be a whole number from 0 to %1").arg(max, 0, 'f', 0));
    *out = d;
    return true;
  }

  bool stats(const QString& field, const QJsonValue& v, RequestStats* out) {
    if (!v.isObject()) return fail(field, QStringLiteral("must be an object, not %1").arg(typeName(v)));
    const QJsonObject o = v.toObject();
    double d = 0;
    for (const char* k : {"n_prompt", "n_reused", "n_generated", "spec_drafted", "spec_accepted"})
      if (o.contains(QLatin1String(k)) &&
          !count(field + QLatin1Char('.') + QLatin1String(k), o[QLatin1String(k)], std::numeric_limits<int>::max(), &d))
        return false;
    for (const char* k : {"kv_used", "kv_capacity"})  // exact in a double up to 2^53
      if (o.contains(QLatin1String(k)) &&
          !count(field + QLatin1Char('.') + QLatin1String(k), o[QLatin1String(k)], 9007199254740992.0, &d))
        return false;
    for (const char* k : {"ttft_ms", "prefill_ms", "prefill_tps", "decode_ms", "decode_tps", "tokens_per_pass"}) {
      if (!o.contains(QLatin1String(k))) continue;
      const QJsonValue x = o[QLatin1String(k)];
      if (!x.isDouble() || !std::isfinite(x.toDouble()) || x.toDouble() < 0)
        return fail(field + QLatin1Char('.') + QLatin1String(k),
                    QStringLiteral("must be a number of at least 0, not %1").arg(typeName(x)));
    }
    QString s;
    for (const char* k : {"stop_reason", "backend", "error"})
      if (o.contains(QLatin1String(k)) &&
          !text(field + QLatin1Char('.') + QLatin1String(k), o[QLatin1String(k)], kMaxStatsStringChars, &s))
        return false;
    *out = RequestStats::fromJson(o);
    return true;
  }

  bool conversation(const QString& at, const QJsonValue& v, ConversationStore::ConversationData* out) {
    const QString where = at.isEmpty() ? QStringLiteral("the file") : at;
    if (!v.isObject())
      return fail(where, QStringLiteral("must be a PhaseLab conversation object, not %1").arg(typeName(v)));
    const QJsonObject o = v.toObject();
    auto field = [&at](const QString& name) { return at.isEmpty() ? name : at + QLatin1Char('.') + name; };

    const QJsonValue format = o[QStringLiteral("format")];
    if (format.toString() != QLatin1String(kFormat))
      return fail(field(QStringLiteral("format")),
                  QStringLiteral("must be \"%1\" (%2): not a PhaseLab conversation export")
                      .arg(QLatin1String(kFormat),
                           format.isString() ? QStringLiteral("found \"%1\"").arg(format.toString().left(80))
                                             : typeName(format)));
    const QJsonValue version = o[QStringLiteral("version")];
    if (!version.isDouble() || version.toDouble() != std::floor(version.toDouble()) || version.toDouble() < 1)
      return fail(field(QStringLiteral("version")), QStringLiteral("must be a whole number from 1, not %1")
                                                        .arg(version.isDouble() ? QString::number(version.toDouble())
                                                                                : typeName(version)));
    if (version.toDouble() > kVersion)
      return fail(field(QStringLiteral("version")),
                  QStringLiteral("%1 is newer than this PhaseLab reads (%2): update PhaseLab to import it")
                      .arg(version.toDouble())
                      .arg(kVersion));

    if (!text(field(QStringLiteral("title")), o[QStringLiteral("title")], kMaxTitleChars, &out->record.title))
      return false;

    const QJsonValue created = o[QStringLiteral("created_at")];
    if (!created.isUndefined()) {
      QString s;
      if (!text(field(QStringLiteral("created_at")), created, 64, &s)) return false;
      out->record.createdAt = QDateTime::fromString(s, Qt::ISODateWithMs);
      if (!out->record.createdAt.isValid())
        return fail(field(QStringLiteral("created_at")),
                    QStringLiteral("\"%1\" is not an ISO 8601 date and time (2025-01-02T03:04:05.678Z)").arg(s));
    }

    ConversationSettings& st = out->settings;
    const QJsonValue mode = o[QStringLiteral("mode")];
    if (!mode.isUndefined()) {
      if (!text(field(QStringLiteral("mode")), mode, 64, &st.mode)) return false;
      if (!ConversationSettings::modeNames().contains(st.mode))
        return fail(field(QStringLiteral("mode")), QStringLiteral("\"%1\" is not one of %2")
                                                       .arg(st.mode, ConversationSettings::modeNames().join(
                                                                         QStringLiteral(", "))));
    }
    const QJsonValue prompt = o[QStringLiteral("system_prompt")];
    if (!prompt.isUndefined() && !prompt.isNull()) {
      if (!text(field(QStringLiteral("system_prompt")), prompt, kMaxContentChars, &st.systemPrompt)) return false;
      st.hasSystemPrompt = true;
    }
    const QJsonValue tmpl = o[QStringLiteral("template")];
    if (!tmpl.isUndefined() && !tmpl.isNull()) {
      if (!text(field(QStringLiteral("template")), tmpl, 64, &st.chatTemplate)) return false;
      if (!st.chatTemplate.isEmpty() && !ConversationSettings::templateNames().contains(st.chatTemplate))
        return fail(field(QStringLiteral("template")),
                    QStringLiteral("\"%1\" is not one of %2, or null for the model's own")
                        .arg(st.chatTemplate, ConversationSettings::templateNames().join(QStringLiteral(", "))));
    }

    const QJsonValue msgs = o[QStringLiteral("messages")];
    if (msgs.isUndefined()) return fail(field(QStringLiteral("messages")), QStringLiteral("missing (an array is required)"));
    if (!msgs.isArray())
      return fail(field(QStringLiteral("messages")), QStringLiteral("must be an array, not %1").arg(typeName(msgs)));
    const QJsonArray arr = msgs.toArray();
    if (arr.size() > kMaxMessages)
      return fail(field(QStringLiteral("messages")),
                  QStringLiteral("%1 messages, more than the %2 allowed").arg(arr.size()).arg(kMaxMessages));
    for (qsizetype i = 0; i < arr.size(); i++) {
      const QString mf = field(QStringLiteral("messages[%1]").arg(i));
      if (!arr[i].isObject()) return fail(mf, QStringLiteral("must be an object, not %1").arg(typeName(arr[i])));
      const QJsonObject jm = arr[i].toObject();
      MessageRecord m;
      if (!text(mf + QStringLiteral(".role"), jm[QStringLiteral("role")], 64, &m.role)) return false;
      if (!kRoles.contains(m.role))
        return fail(mf + QStringLiteral(".role"),
                    QStringLiteral("\"%1\" is not one of %2").arg(m.role, kRoles.join(QStringLiteral(", "))));
      if (!text(mf + QStringLiteral(".content"), jm[QStringLiteral("content")], kMaxContentChars, &m.content))
        return false;
      m.state = QStringLiteral("done");
      if (jm.contains(QStringLiteral("state"))) {
        if (!text(mf + QStringLiteral(".state"), jm[QStringLiteral("state")], 64, &m.state)) return false;
        if (!kStates.contains(m.state))
          return fail(mf + QStringLiteral(".state"),
                      QStringLiteral("\"%1\" is not one of %2").arg(m.state, kStates.join(QStringLiteral(", "))));
        if (m.state == QLatin1String("streaming")) m.state = QStringLiteral("interrupted");
      }
      if (jm.contains(QStringLiteral("stats"))) {
        if (!stats(mf + QStringLiteral(".stats"), jm[QStringLiteral("stats")], &m.stats)) return false;
        m.hasStats = true;
      }
      if (jm.contains(QStringLiteral("reasoning")) &&
          !text(mf + QStringLiteral(".reasoning"), jm[QStringLiteral("reasoning")], kMaxContentChars, &m.reasoning))
        return false;
      out->messages.push_back(m);
    }
    return true;
  }
};

}  // namespace

QString toMarkdown(const ConversationRecord& c, const ConversationSettings& s, const QList<MessageRecord>& msgs) {
  QString md = QStringLiteral("# %1\n\n").arg(c.title.trimmed().isEmpty() ? QStringLiteral("Untitled")
                                                                           : escapeInline(c.title));
  QStringList facts;
  if (s.mode != QLatin1String("chat")) facts << QStringLiteral("Mode: %1").arg(escapeInline(s.mode));
  if (!s.chatTemplate.isEmpty()) facts << QStringLiteral("Template: %1").arg(escapeInline(s.chatTemplate));
  if (!facts.isEmpty()) md += QStringLiteral("*%1*\n\n").arg(facts.join(QStringLiteral(" · ")));
  if (s.hasSystemPrompt) md += QStringLiteral("## System prompt\n\n%1\n\n").arg(closeOpenFence(s.systemPrompt));
  for (const MessageRecord& m : msgs) {
    md += QStringLiteral("## %1").arg(roleHeading(m.role));
    if (!m.state.isEmpty() && m.state != QLatin1String("done")) md += QStringLiteral(" (%1)").arg(escapeInline(m.state));
    md += QStringLiteral("\n\n");
    if (!m.reasoning.isEmpty()) md += quoteReasoning(m.reasoning);
    if (!m.content.isEmpty()) md += closeOpenFence(m.content) + QStringLiteral("\n\n");
    if (m.role == QLatin1String("assistant") && m.hasStats)
      md += QStringLiteral("*%1*\n\n").arg(escapeInline(m.stats.summary()));
  }
  while (md.endsWith(QStringLiteral("\n\n"))) md.chop(1);
  return md;
}

QString exportMarkdown(const ConversationStore* store, qint64 id) {
  const ConversationRecord c = store->conversation(id);
  if (c.id == 0) return {};
  return toMarkdown(c, store->conversationSettings(id), store->messages(id));
}

QByteArray toJson(const ConversationRecord& c, const ConversationSettings& s, const QList<MessageRecord>& msgs) {
  return QJsonDocument(toJsonObject(c, s, msgs)).toJson(QJsonDocument::Indented);
}

QByteArray exportConversation(const ConversationStore* store, qint64 id) {
  const ConversationRecord c = store->conversation(id);
  if (c.id == 0) return {};
  return toJson(c, store->conversationSettings(id), store->messages(id));
}

QByteArray exportAll(const ConversationStore* store) {
  QJsonArray arr;
  const QList<ConversationRecord> all = store->conversations();
  for (auto it = all.crbegin(); it != all.crend(); ++it)
    arr.append(toJsonObject(*it, store->conversationSettings(it->id), store->messages(it->id)));
  return QJsonDocument(arr).toJson(QJsonDocument::Indented);
}

qint64 importJson(ConversationStore* store, const QByteArray& json, QString* error, QList<qint64>* ids) {
  auto refuse = [error](const QString& why) {
    if (error) *error = why;
    return qint64(0);
  };
  if (!store || !store->isOpen()) return refuse(QStringLiteral("no conversation database is open"));
  if (json.size() > kMaxFileBytes)
    return refuse(QStringLiteral("the file is %1 bytes, more than the %2 MiB an import reads")
                      .arg(json.size())
                      .arg(kMaxFileBytes >> 20));
  QJsonParseError perr;
  const QJsonDocument doc = QJsonDocument::fromJson(json, &perr);
  if (perr.error != QJsonParseError::NoError)
    return refuse(QStringLiteral("not JSON: %1 at byte %2 (is this a PhaseLab conversation export?)")
                      .arg(perr.errorString())
                      .arg(perr.offset));

  Checker check;
  QList<ConversationStore::ConversationData> items;
  if (doc.isArray()) {
    const QJsonArray arr = doc.array();
    if (arr.isEmpty()) return refuse(QStringLiteral("the file holds an empty list: no conversations to import"));
    if (arr.size() > kMaxConversations)
      return refuse(QStringLiteral("the file holds %1 conversations, more than the %2 an import takes")
                        .arg(arr.size())
                        .arg(kMaxConversations));
    for (qsizetype i = 0; i < arr.size(); i++) {
      ConversationStore::ConversationData d;
      if (!check.conversation(QStringLiteral("[%1]").arg(i), arr[i], &d)) return refuse(check.error);
      items.push_back(std::move(d));
    }
  } else {
    ConversationStore::ConversationData d;
    if (!check.conversation(QString(), doc.object(), &d)) return refuse(check.error);
    items.push_back(std::move(d));
  }

  QList<qint64> created;
  if (!store->insertConversations(items, &created) || created.isEmpty())
    return refuse(QStringLiteral("writing the conversations failed, nothing was imported: %1").arg(store->lastError()));
  if (ids) *ids = created;
  if (error) error->clear();
  return created.front();
}

}  // namespace phaselab::ui
