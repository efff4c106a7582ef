#include "serving_result.h"

#include <QCoreApplication>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QJsonParseError>
#include <algorithm>

namespace phaselab::ui {

namespace {

QString tr(const char* s) { return QCoreApplication::translate("ServingResult", s); }

ServingStats statsFrom(const QJsonValue& v) {
  const QJsonObject o = v.toObject();
  ServingStats s;
  s.n = o.value(QStringLiteral("n")).toInt();
  s.p50 = o.value(QStringLiteral("p50")).toDouble();
  s.p90 = o.value(QStringLiteral("p90")).toDouble();
  s.p99 = o.value(QStringLiteral("p99")).toDouble();
  s.max = o.value(QStringLiteral("max")).toDouble();
  s.mean = o.value(QStringLiteral("mean")).toDouble();
  return s;
}

QJsonObject statsJson(const ServingStats& s) {
  return QJsonObject{{"n", s.n}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}};
}

// One timeline entry; false (and *error) when it is not an object or its
// token times are not numbers.
bool traceFrom(const QJsonValue& v, ServingRequestTrace* t, QString* error) {
  if (!v.isObject()) {
    *error = tr("is not an object");
    return false;
  }
  const QJsonObject o = v.toObject();
  t->stream = o.value(QStringLiteral("stream")).toInt();
  t->isLong = o.value(QStringLiteral("kind")).toString() == QLatin1String("long");
  t->arriveMs = o.value(QStringLiteral("arrive_ms")).toDouble();
  t->nPrompt = o.value(QStringLiteral("n_prompt")).toInt();
  t->firstTokenMs = o.value(QStringLiteral("first_token_ms")).toDouble();
  t->ok = o.value(QStringLiteral("ok")).toBool(true);
  const QJsonValue tokens = o.value(QStringLiteral("token_ms"));
  if (!tokens.isUndefined() && !tokens.isArray()) {
    *error = tr("has a token_ms that is not a list");
    return false;
  }
  for (const QJsonValue& x : tokens.toArray()) {
    if (!x.isDouble()) {
      *error = tr("has a token time that is not a number");
      return false;
    }
    t->tokenMs.push_back(x.toDouble());
  }
  return true;
}

bool rowFrom(const QJsonValue& v, ServingRow* r, QString* error) {
  if (!v.isObject()) {
    *error = tr("is not an object");
    return false;
  }
  const QJsonObject o = v.toObject();
  r->policy = o.value(QStringLiteral("policy")).toString();
  if (r->policy.isEmpty()) {
    *error = tr("has no policy");
    return false;
  }
  r->label = o.value(QStringLiteral("label")).toString(r->policy);
  r->target = o.value(QStringLiteral("target")).toString();
  r->placement = o.value(QStringLiteral("placement")).toString();
  r->requests = o.value(QStringLiteral("requests")).toInt();
  r->ok = o.value(QStringLiteral("ok")).toInt();
  r->durationS = o.value(QStringLiteral("duration_s")).toDouble();
  r->tokens = static_cast<long long>(o.value(QStringLiteral("tokens")).toDouble());
  r->tokensPerS = o.value(QStringLiteral("tokens_per_s")).toDouble();
  r->ttftMs = statsFrom(o.value(QStringLiteral("ttft_ms")));
  r->ttftLongMs = statsFrom(o.value(QStringLiteral("ttft_long_ms")));
  r->itlMs = statsFrom(o.value(QStringLiteral("itl_ms")));
  r->tpotMs = statsFrom(o.value(QStringLiteral("tpot_ms")));
  r->maxStallMs = o.value(QStringLiteral("max_stall_ms")).toDouble();
  r->goodputRps = o.value(QStringLiteral("goodput_rps")).toDouble();
  r->goodputFraction = o.value(QStringLiteral("goodput_fraction")).toDouble();
  r->kvTransfers = o.value(QStringLiteral("kv_transfers")).toInt();
  r->kvTransferBytes = o.value(QStringLiteral("kv_transfer_bytes")).toDouble();
  r->kvTransferMs = o.value(QStringLiteral("kv_transfer_ms")).toDouble();
  const QJsonValue timeline = o.value(QStringLiteral("timeline"));
  if (!timeline.isUndefined() && !timeline.isArray()) {
    *error = tr("has a timeline that is not a list");
    return false;
  }
  const QJsonArray requests = timeline.toArray();
  for (qsizetype i = 0; i < requests.size(); i++) {
    ServingRequestTrace t;
    QString why;
    if (!traceFrom(requests[i], &t, &why)) {
      *error = tr("has a timeline entry %1 that %2").arg(i + 1).arg(why);
      return false;
    }
    r->timeline.push_back(std::move(t));
  }
  return true;
}

QString csvField(const QString& s) {
  if (!s.contains(QLatin1Char(',')) && !s.contains(QLatin1Char('"')) && !s.contains(QLatin1Char('\n'))) return s;
  return QLatin1Char('"') + QString(s).replace(QLatin1Char('"'), QStringLiteral("\"\"")) + QLatin1Char('"');
}

}  // namespace

bool ServingRow::isBaseline() const { return label.startsWith(QLatin1String("baseline")); }

std::optional<ServingResult> parseServingResult(const QByteArray& json, QString* error) {
  auto fail = [error](const QString& message) -> std::optional<ServingResult> {
    if (error) *error = message;
    return std::nullopt;
  };
  if (json.trimmed().isEmpty())
    return fail(tr("The serving results are empty: the run printed nothing (see its error), run it again."));
  QJsonParseError pe;
  const QJsonDocument doc = QJsonDocument::fromJson(json, &pe);
  if (pe.error != QJsonParseError::NoError)
    return fail(tr("The serving results are not valid JSON (%1 at byte %2 of %3): the file was cut short or is not "
                   "a result of phaselab-cli bench --serving --json; run it again or choose another file.")
                    .arg(pe.errorString())
                    .arg(pe.offset)
                    .arg(json.size()));
  if (!doc.isObject())
    return fail(tr("The serving results are not a JSON object: expected the output of phaselab-cli bench --serving --json."));
  const QJsonObject o = doc.object();
  const QJsonValue rows = o.value(QStringLiteral("rows"));
  if (!rows.isArray())
    return fail(tr("The serving results have no \"rows\" list: expected the output of phaselab-cli bench --serving --json."));
  ServingResult r;
  r.model = o.value(QStringLiteral("model")).toString();
  r.backend = o.value(QStringLiteral("backend")).toString();
  r.threads = o.value(QStringLiteral("threads")).toInt();
  const QJsonObject w = o.value(QStringLiteral("workload")).toObject();
  r.workload.streams = w.value(QStringLiteral("streams")).toInt();
  r.workload.chatPrompt = w.value(QStringLiteral("chat_prompt")).toInt();
  r.workload.chatAnswer = w.value(QStringLiteral("chat_answer")).toInt();
  r.workload.longPrompt = w.value(QStringLiteral("long_prompt")).toInt();
  r.workload.longAnswer = w.value(QStringLiteral("long_answer")).toInt();
  r.workload.longCount = w.value(QStringLiteral("long_count")).toInt();
  r.workload.longRate = w.value(QStringLiteral("long_rate")).toDouble();
  r.workload.longStartS = w.value(QStringLiteral("long_start_s")).toDouble();
  r.workload.durationS = w.value(QStringLiteral("duration_s")).toDouble();
  r.workload.seed = w.value(QStringLiteral("seed")).toInt();
  r.workload.baseline = w.value(QStringLiteral("baseline")).toBool();
  const QJsonObject targets = o.value(QStringLiteral("targets")).toObject();
  r.ttftTargetMs = targets.value(QStringLiteral("ttft_ms")).toDouble();
  r.itlTargetMs = targets.value(QStringLiteral("itl_ms")).toDouble();
  const QJsonArray list = rows.toArray();
  for (qsizetype i = 0; i < list.size(); i++) {
    ServingRow row;
    QString why;
    if (!rowFrom(list[i], &row, &why)) return fail(tr("Row %1 of the serving results %2.").arg(i + 1).arg(why));
    r.rows.push_back(std::move(row));
  }
  if (r.rows.empty()) return fail(tr("The serving results hold no rows: the run measured nothing. Run it again."));
  return r;
}

QByteArray servingResultJson(const ServingResult& r) {
  QJsonArray rows;
  for (const ServingRow& row : r.rows) {
    QJsonArray timeline;
    for (const ServingRequestTrace& t : row.timeline) {
      QJsonArray tokens;
      for (double x : t.tokenMs) tokens.append(x);
      timeline.append(QJsonObject{{"stream", t.stream},
                                  {"kind", t.isLong ? "long" : "chat"},
                                  {"arrive_ms", t.arriveMs},
                                  {"n_prompt", t.nPrompt},
                                  {"first_token_ms", t.firstTokenMs},
                                  {"token_ms", tokens},
                                  {"ok", t.ok}});
    }
    rows.append(QJsonObject{{"policy", row.policy},
                            {"label", row.label},
                            {"target", row.target},
                            {"placement", row.placement},
                            {"requests", row.requests},
                            {"ok", row.ok},
                            {"duration_s", row.durationS},
                            {"tokens", static_cast<double>(row.tokens)},
                            {"tokens_per_s", row.tokensPerS},
                            {"ttft_ms", statsJson(row.ttftMs)},
                            {"ttft_long_ms", statsJson(row.ttftLongMs)},
                            {"itl_ms", statsJson(row.itlMs)},
                            {"tpot_ms", statsJson(row.tpotMs)},
                            {"max_stall_ms", row.maxStallMs},
                            {"goodput_rps", row.goodputRps},
                            {"goodput_fraction", row.goodputFraction},
                            {"kv_transfers", row.kvTransfers},
                            {"kv_transfer_bytes", row.kvTransferBytes},
                            {"kv_transfer_ms", row.kvTransferMs},
                            {"timeline", timeline}});
  }
  const ServingWorkload& w = r.workload;
  const QJsonObject workload{{"streams", w.streams},         {"chat_prompt", w.chatPrompt},
                             {"chat_answer", w.chatAnswer},   {"long_prompt", w.longPrompt},
                             {"long_answer", w.longAnswer},   {"long_count", w.longCount},
                             {"long_rate", w.longRate},       {"long_start_s", w.longStartS},
                             {"duration_s", w.durationS},     {"seed", w.seed},
                             {"baseline", w.baseline}};
  return QJsonDocument(QJsonObject{{"model", r.model},
                                   {"backend", r.backend},
                                   {"threads", r.threads},
                                   {"workload", workload},
                                   {"targets", QJsonObject{{"ttft_ms", r.ttftTargetMs}, {"itl_ms", r.itlTargetMs}}},
                                   {"rows", rows}})
      .toJson(QJsonDocument::Compact);
}

QByteArray servingResultCsv(const ServingResult& r) {
  QStringList lines{QStringLiteral(
      "label,policy,target,requests,ok,duration_s,tokens_per_s,ttft_p50_ms,ttft_p99_ms,ttft_long_p50_ms,"
      "ttft_long_p99_ms,itl_p50_ms,itl_p99_ms,max_stall_ms,goodput_rps,goodput_fraction,ttft_target_ms,itl_target_ms,"
      "kv_transfers,kv_transfer_bytes,kv_transfer_ms")};
  for (const ServingRow& row : r.rows) {
    QStringList f{csvField(row.label), csvField(row.policy), csvField(row.target)};
    f << QString::number(row.requests) << QString::number(row.ok);
    for (double x : {row.durationS, row.tokensPerS, row.ttftMs.p50, row.ttftMs.p99, row.ttftLongMs.p50,
                     row.ttftLongMs.p99, row.itlMs.p50, row.itlMs.p99, row.maxStallMs, row.goodputRps,
                     row.goodputFraction, r.ttftTargetMs, r.itlTargetMs})
      f << QString::number(x, 'g', 10);
    f << QString::number(row.kvTransfers) << QString::number(row.kvTransferBytes, 'f', 0)
      << QString::number(row.kvTransferMs, 'g', 10);
    lines << f.join(QLatin1Char(','));
  }
  return (lines.join(QLatin1Char('\n')) + QLatin1Char('\n')).toUtf8();
}

ServingStderrLine parseServingStderrLine(const QByteArray& line) {
  ServingStderrLine out;
  const QByteArray t = line.trimmed();
  if (!t.startsWith('{')) return out;
  const QJsonObject o = QJsonDocument::fromJson(t).object();
  if (o.contains(QStringLiteral("progress"))) {
    const QJsonObject p = o.value(QStringLiteral("progress")).toObject();
    out.kind = ServingStderrLine::Progress;
    out.progress.run = p.value(QStringLiteral("run")).toInt();
    out.progress.of = p.value(QStringLiteral("of")).toInt();
    out.progress.label = p.value(QStringLiteral("label")).toString();
    out.progress.elapsedS = p.value(QStringLiteral("elapsed_s")).toDouble();
    out.progress.requestsDone = p.value(QStringLiteral("requests_done")).toInt();
  } else if (o.value(QStringLiteral("done")).toBool()) {
    out.kind = ServingStderrLine::Done;
  } else if (o.contains(QStringLiteral("error"))) {
    out.kind = ServingStderrLine::Error;
    out.error = o.value(QStringLiteral("error")).toString();
  }
  return out;
}

double largestChatGapMs(const ServingRow& row) {
  double gap = 0;
  for (const ServingRequestTrace& t : row.timeline) {
    if (t.isLong) continue;
    for (size_t i = 1; i < t.tokenMs.size(); i++) gap = std::max(gap, t.tokenMs[i] - t.tokenMs[i - 1]);
  }
  return gap;
}

}  // namespace phaselab::ui
