// Status and Result<T>: every engine call that can fail returns one of these.
// A message says what went wrong and, where possible, what to do about it.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace phaselab {

enum class StatusCode {
  ok = 0,
  invalid_argument,  // a bad parameter from the caller
  invalid_file,      // a malformed or hostile file
  unsupported,       // valid, but not something PhaseLab can run
  io_error,          // the OS refused (open, mmap, read)
  out_of_memory,     // an allocation of the stated size failed or would not fit
  cancelled,         // the caller asked to stop
  context_full,      // the request does not fit in the context window
  internal,          // a bug: an invariant did not hold
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Adds context in front of the message: "loading model: <message>".
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return {code_, context + ": " + message_};
  }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::invalid_argument, std::move(m)}; }
inline Status invalid_file(std::string m) { return {StatusCode::invalid_file, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::unsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::io_error, std::move(m)}; }
inline Status out_of_memory(std::string m) { return {StatusCode::out_of_memory, std::move(m)}; }
inline Status cancelled(std::string m = "cancelled") { return {StatusCode::cancelled, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::internal, std::move(m)}; }

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT

  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace phaselab

#define PHASELAB_TRY(expr)                 \
  do {                                     \
    ::phaselab::Status _st = (expr);       \
    if (!_st.is_ok()) return _st;          \
  } while (0)
