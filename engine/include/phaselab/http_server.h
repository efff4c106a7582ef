// A small HTTP/1.1 server for PhaseLab's OpenAI API, written for hostile
// clients: one thread (poll) owns every socket, so a slow or idle client
// costs a buffer, never a thread; every limit is counted as bytes arrive.
//
//   - request line, headers: at most max_header_bytes and max_headers, within
//     header_timeout_ms of the request's first byte (else 431 / 408);
//   - Content-Length: digits only, at most max_body_bytes (413 at once, before
//     any body byte is read), one value; chunked bodies counted chunk by
//     chunk against the same limit; both at once is a 400;
//   - every buffered body reserves its bytes from one budget shared by all
//     connections (body_budget_bytes): past it a request gets 503 with
//     Retry-After instead of memory;
//   - body_timeout_ms for the whole body, idle_timeout_ms between keep-alive
//     requests, write_timeout_ms without progress while sending;
//   - max_connections in all (past it: 503 + Retry-After, then close) and
//     max_connections_per_client per address: a client at its limit loses
//     its oldest connection that has no request being answered;
//   - pipelined requests are answered in order; HTTP/1.1 needs exactly one
//     Host; header values with control characters are refused.
//
// The handler runs on the server thread and must return quickly: it answers
// through the Responder at once or hands the Responder to another thread
// (which may answer later, stream, and learn when the client goes away).
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "phaselab/status.h"

namespace phaselab::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: "/v1/models?x=1"
  std::string path;     // target without the query: "/v1/models"
  int minor_version = 1;  // HTTP/1.<minor_version>
  Headers headers;      // names lower-cased, values trimmed, in arrival order
  std::string body;     // de-chunked
  std::string peer;     // the client's address ("127.0.0.1", "::1")
  std::shared_ptr<void> body_reservation;  // returns the body's bytes to the budget when the request goes

  // The first value of a header (name lower-case), or nullptr.
  const std::string* header(std::string_view name) const;
  int header_count(std::string_view name) const;
};

// One response under way. Any thread may answer through it; the server
// thread sends. Every call after the response ended, or after the client
// went away, does nothing (and write_chunk returns false).
class Responder {
 public:
  struct Exchange;
  explicit Responder(std::shared_ptr<Exchange> x) : x_(std::move(x)) {}

  // Headers every response head of this exchange carries (CORS).
  void always_send(const Headers& headers);
  // A whole response (Content-Length).
  void reply(int status, std::string_view content_type, std::string body, const Headers& extra = {});
  // A streamed one: the head now, then write_chunk() pieces, then end_stream().
  void start_stream(int status, std::string_view content_type, const Headers& extra = {});
  bool write_chunk(std::string_view data);  // false: the client is gone
  void end_stream();
  // Called once, on the server thread (or here if it already happened), when
  // the client goes away before the response ended.
  void on_gone(std::function<void()> f);

 private:
  std::shared_ptr<Exchange> x_;
};

using Handler = std::function<void(Request&& req, std::shared_ptr<Responder> res)>;

// How the server words the errors it answers itself (a limit, a deadline, a
// malformed request): the API's own error shape, so that clients read them
// as they read the handler's.
struct ErrorResponse {
  std::string content_type;
  std::string body;
};
using ErrorFormatter = std::function<ErrorResponse(int status, const std::string& message)>;

struct Limits {
  std::size_t max_header_bytes = 16 << 10;  // request line + headers (+ chunked trailers)
  int max_headers = 100;
  std::size_t max_body_bytes = 4 << 20;
  std::size_t body_budget_bytes = 32 << 20;  // all buffered bodies together
  int header_timeout_ms = 10000;  // from a request's first byte to the end of its headers
  int body_timeout_ms = 30000;    // from the end of the headers to the end of the body
  int idle_timeout_ms = 5000;     // a kept-alive connection waiting for its next request
  int write_timeout_ms = 30000;   // sending without any progress
  std::size_t max_pending_output = 16 << 20;  // unsent response bytes; past it the client is "gone"
  int max_connections = 1024;
  int max_connections_per_client = 512;
  int listen_backlog = 4096;  // capped by the kernel's somaxconn
};

// Reads one request at a time from bytes as they arrive, every limit of
// Limits counted as they do (the server's state machine, without sockets:
// tests/fuzz/fuzz_http.cpp drives it). feed() consumes what it uses from
// `in`; after Step::request take() the request (the reader is then ready for
// the next one, whose bytes may already be in `in`: pipelining); after
// Step::error the connection is answered error() and closed.
class RequestReader {
 public:
  enum class Step { need_more, request, error };
  enum class Phase { head, body, chunk_size, chunk_data, chunk_crlf, trailers, done, failed };
  struct Error {
    int status = 0;
    std::string message;
  };
  // reserve(n): n more body bytes are about to be buffered; false refuses
  // them (503). Empty: no budget.
  explicit RequestReader(const Limits& limits, std::function<bool(std::size_t)> reserve = {});

  Step feed(std::string& in);
  Request take();
  const Error& error() const { return error_; }
  // True once per request whose client waits for "100 Continue" before
  // sending its body (and whose body is acceptable).
  bool take_continue();
  Phase phase() const { return phase_; }
  int minor_version() const { return req_.minor_version; }
  void reset();

 private:
  Step fail(int status, std::string message);
  Step parse_head(std::string_view head);
  Step parse_framing();

  Limits limits_;
  std::function<bool(std::size_t)> reserve_;
  Phase phase_ = Phase::head;
  Request req_;
  std::size_t scanned_ = 0;  // where the search for the end of the headers resumes
  std::size_t body_left_ = 0, body_total_ = 0, trailer_bytes_ = 0;
  bool send_continue_ = false;
  Error error_;
};

std::string lower_ascii(std::string_view s);

class Server {
 public:
  // Binds host:port (port 0: any free one). An error names the address.
  // format_error empty: the message as plain text.
  static Result<std::unique_ptr<Server>> bind(const std::string& host, int port, const Limits& limits, Handler handler,
                                              ErrorFormatter format_error = {});
  ~Server();  // stop(0)
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  void start();  // the server thread
  // Closes the listening socket at once; responses under way get up to
  // drain_ms to end and be sent; then every connection is closed and the
  // thread joined. Idempotent.
  void stop(int drain_ms);

 private:
  Server() = default;
  void run();

  struct Impl;
  std::unique_ptr<Impl> impl_;
  Handler handler_;
  ErrorFormatter format_error_;
  Limits limits_;
  int port_ = 0;
  std::thread thread_;
};

// The reason phrase of a status code ("Not Found").
const char* status_text(int status);

}  // namespace phaselab::http
