// A conversation as Markdown (to read or share) and as JSON (to move it to
// another machine or keep it), and JSON back into the store. No widgets: the
// window picks the files, this only converts.
//
// The JSON format, "phaselab.conversation" version 1, UTF-8, one object:
//   format         "phaselab.conversation"                      required
//   version        1 (a newer version is refused, with a hint)   required
//   title          string, at most kMaxTitleChars                 required
//   created_at     ISO 8601 ("2025-01-02T03:04:05.678Z"; UTC on export);
//                  absent: the time of the import
//   mode           "chat" | "notebook"; absent: chat
//   system_prompt  string, or null / absent for the application's default
//   template       "gemma" | "chatml" | "llama3" | "llama2" | "plain" |
//                  "plain-fewshot", or null / absent / "" for the model's own
//   messages       array (at most kMaxMessages), in order, of       required
//     role         "user" | "assistant" | "system"                  required
//     content      string, at most kMaxContentChars                 required
//     state        "done" | "stopped" | "interrupted" | "error" | "streaming";
//                  absent: done. streaming is imported as interrupted: nothing
//                  streams into an imported conversation.
//     stats        object, RequestStats::toJson()'s keys; absent: none
//     reasoning    string, at most kMaxContentChars: a reasoning model's
//                  reasoning beside the answer; absent or "": none
// A file may hold an array of such objects instead (exportAll()): an import
// adds all of them or none. Keys this version does not know are ignored, so
// that a later version can add optional keys without a version bump.
//
// Not in the format: ids and the time of the last change (the importing store
// gives new ones). Export -> import -> export therefore gives the same bytes,
// except for a message exported while it streamed (interrupted after import).
#pragma once

#include <QByteArray>
#include <QList>
#include <QString>

#include "conversation_store.h"

namespace phaselab::ui {

namespace conversation_export {

inline constexpr const char* kFormat = "phaselab.conversation";
inline constexpr int kVersion = 1;
// Limits on what an import accepts, far above anything the application writes.
inline constexpr qint64 kMaxFileBytes = 64LL << 20;
inline constexpr int kMaxConversations = 10000;
inline constexpr int kMaxMessages = 10000;      // per conversation
inline constexpr int kMaxContentChars = 1 << 20;  // per message and for the system prompt
inline constexpr int kMaxTitleChars = 1000;
inline constexpr int kMaxStatsStringChars = 1 << 16;

}  // namespace conversation_export

// Markdown: the title as a heading, the mode, template and system prompt when
// they are not the defaults, then each message under a heading with its role
// (and its state when not done), its text as it is, and for an answer with
// stats the RequestStats::summary() line in italics. A code fence the text
// leaves open is closed, so that it cannot swallow the next message.
QString toMarkdown(const ConversationRecord& conversation, const ConversationSettings& settings,
                   const QList<MessageRecord>& messages);
QString exportMarkdown(const ConversationStore* store, qint64 conversationId);

// The format above, indented. exportConversation() reads it from the store
// (empty for an unknown id); exportAll() writes every conversation, oldest
// change first, so that an import lists them in the same order.
QByteArray toJson(const ConversationRecord& conversation, const ConversationSettings& settings,
                  const QList<MessageRecord>& messages);
QByteArray exportConversation(const ConversationStore* store, qint64 conversationId);
QByteArray exportAll(const ConversationStore* store);

// Checks the whole input first, then writes it in one transaction: on any
// error nothing is written, 0 is returned and *error names the field
// ("messages[3].role: ..."; "[2].title: ..." inside an array). Returns the
// first new conversation's id; ids gets all of them.
qint64 importJson(ConversationStore* store, const QByteArray& json, QString* error, QList<qint64>* ids = nullptr);

}  // namespace phaselab::ui
