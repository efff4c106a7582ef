#include "phaselab/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <map>
#include <mutex>

#include "phaselab/log.h"

namespace phaselab::http {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::size_t kReadChunk = 16 << 10;
constexpr std::size_t kMaxReadPerTurn = 256 << 10;  // fairness: one connection cannot hog a turn
constexpr std::size_t kMaxBufferedWhileServing = 64 << 10;  // pipelined bytes kept while a response is under way
constexpr std::size_t kMaxChunkLine = 1024;
constexpr auto kLinger = 2s;  // reading what a refused client still sends, so our answer is not reset
constexpr int kMaxExtraClosing = 256;
constexpr auto kEvictAfter = 1s;  // a connection this long without a request may give way to its client's new one  // connections past the limit, kept only to send them a 503

bool is_tchar(unsigned char c) {
  // (c != 0: strchr finds the terminating NUL of its set.)
  return std::isalnum(c) || (c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

// Whether a complete request line can start a request ("METHOD /target
// HTTP/1.x"): checked as soon as the line is there, so that an HTTP/0.9
// request or junk is refused at once instead of waiting for headers.
bool plausible_request_line(std::string_view line) {
  const std::size_t sp = line.rfind(' ');
  return sp != std::string_view::npos && line.find(' ') < sp && line.substr(sp + 1).substr(0, 5) == "HTTP/";
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Wakes the server thread from another thread (a self-pipe: portable).
struct Waker {
  int rd = -1, wr = -1;
  std::atomic<bool> pending{false};
  Waker() {
    int fds[2];
    if (::pipe(fds) == 0) {
      rd = fds[0];
      wr = fds[1];
      for (int fd : fds) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
  }
  ~Waker() {
    if (rd >= 0) ::close(rd);
    if (wr >= 0) ::close(wr);
  }
  void wake() {
    if (pending.exchange(true)) return;
    const char b = 1;
    (void)!::write(wr, &b, 1);
  }
  // Empties the pipe, then allows the next wake() to write: the other order
  // loses a wake-up (one written between the two is read here while pending
  // is left true, and every later wake() skips its write).
  void drain() {
    char buf[64];
    while (::read(rd, buf, sizeof buf) > 0) {
    }
    pending = false;
  }
};

// The bytes all buffered bodies may take together.
struct Budget {
  std::mutex mu;
  std::size_t used = 0, cap = 0;
  bool take(std::size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    if (used + n > cap) return false;
    used += n;
    return true;
  }
  void give(std::size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    used -= std::min(used, n);
  }
};

// One request body's share of the budget; given back when the request goes.
struct Reservation {
  std::shared_ptr<Budget> budget;
  std::size_t bytes = 0;
  bool grow(std::size_t n) {
    if (!budget->take(n)) return false;
    bytes += n;
    return true;
  }
  ~Reservation() { budget->give(bytes); }
};

std::string head_text(int minor, int status, std::string_view content_type, const Headers& extra, bool close) {
  std::string h = "HTTP/1." + std::to_string(minor) + " " + std::to_string(status) + " " + status_text(status) + "\r\n";
  if (!content_type.empty()) h.append("Content-Type: ").append(content_type).append("\r\n");
  for (const auto& [k, v] : extra) h.append(k).append(": ").append(v).append("\r\n");
  if (close) h += "Connection: close\r\n";
  else if (minor == 0) h += "Connection: keep-alive\r\n";
  return h;
}

}  // namespace

const char* status_text(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

const std::string* Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

int Request::header_count(std::string_view name) const {
  int n = 0;
  for (const auto& h : headers) n += h.first == name;
  return n;
}

// --- the response's shared state ----------------------------------------------

struct Responder::Exchange {
  std::mutex mu;
  std::string out;  // bytes for the server thread to send
  bool head_sent = false, chunked = false, ended = false, gone = false;
  bool close_after = false;  // Connection: close after this response
  int minor = 1;
  std::size_t max_pending = 0;
  std::function<void()> on_gone;
  std::shared_ptr<Waker> waker;
  Headers always;
};

void Responder::always_send(const Headers& headers) {
  std::lock_guard<std::mutex> lock(x_->mu);
  x_->always.insert(x_->always.end(), headers.begin(), headers.end());
}

void Responder::reply(int status, std::string_view content_type, std::string body, const Headers& extra) {
  {
    std::lock_guard<std::mutex> lock(x_->mu);
    if (x_->gone || x_->ended || x_->head_sent) return;
    std::string h = head_text(x_->minor, status, content_type, extra, x_->close_after);
    for (const auto& [k, v] : x_->always) h.append(k).append(": ").append(v).append("\r\n");
    h += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
    x_->out += h;
    x_->out += body;
    x_->head_sent = x_->ended = true;
  }
  x_->waker->wake();
}

void Responder::start_stream(int status, std::string_view content_type, const Headers& extra) {
  {
    std::lock_guard<std::mutex> lock(x_->mu);
    if (x_->gone || x_->ended || x_->head_sent) return;
    // HTTP/1.0 has no chunked encoding: the end of the stream is the close.
    x_->chunked = x_->minor >= 1;
    if (!x_->chunked) x_->close_after = true;
    std::string h = head_text(x_->minor, status, content_type, extra, x_->close_after);
    for (const auto& [k, v] : x_->always) h.append(k).append(": ").append(v).append("\r\n");
    if (x_->chunked) h += "Transfer-Encoding: chunked\r\n";
    x_->out += h + "\r\n";
    x_->head_sent = true;
  }
  x_->waker->wake();
}

bool Responder::write_chunk(std::string_view data) {
  {
    std::lock_guard<std::mutex> lock(x_->mu);
    if (x_->gone) return false;
    if (x_->ended || !x_->head_sent) return true;
    if (data.empty()) return true;
    if (x_->out.size() > x_->max_pending) return false;  // not reading: the server thread will cut it
    if (x_->chunked) {
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      x_->out += size;
      x_->out.append(data.data(), data.size());
      x_->out += "\r\n";
    } else {
      x_->out.append(data.data(), data.size());
    }
  }
  x_->waker->wake();
  return true;
}

void Responder::end_stream() {
  {
    std::lock_guard<std::mutex> lock(x_->mu);
    if (x_->gone || x_->ended || !x_->head_sent) return;
    if (x_->chunked) x_->out += "0\r\n\r\n";
    x_->ended = true;
  }
  x_->waker->wake();
}

bool Responder::gone() const {
  std::lock_guard<std::mutex> lock(x_->mu);
  return x_->gone;
}

void Responder::on_gone(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> lock(x_->mu);
    if (!x_->gone) {
      x_->on_gone = std::move(f);
      return;
    }
  }
  if (f) f();
}

// --- connections ----------------------------------------------------------------

namespace {

enum class State {
  head,        // reading the request line and headers
  body,        // reading a Content-Length body
  chunk_size,  // a chunked body: the size line
  chunk_data,
  chunk_crlf,
  trailers,
  serving,  // the handler has the request; its response is being sent
  closing,  // sending a last response, then lingering
  linger,   // written side shut; discarding what the client still sends
};

struct Conn {
  int fd = -1;
  std::string peer;
  uint64_t serial = 0;
  State st = State::head;
  std::string in;            // received, not yet parsed
  std::size_t scanned = 0;   // where the search for the end of the headers resumes
  Request req;
  std::size_t body_left = 0, body_total = 0, trailer_bytes = 0;
  std::shared_ptr<Reservation> reservation;
  std::shared_ptr<Responder::Exchange> x;  // the response under way (serving)
  std::string send;
  std::size_t send_off = 0;
  bool ended = false;      // the exchange ended: close or take the next request once sent
  bool close_after = false;
  bool eof = false;
  Clock::time_point deadline;       // when the current phase must be done
  Clock::time_point last_progress;  // of sending
  Clock::time_point since;          // accepted, or its last response sent: waiting for a request since
  bool dead = false;
};

// A server-made error response: the connection closes after it.
void queue_error(Conn& c, int status, const std::string& body, const std::string& type, const Headers& extra = {}) {
  std::string h = head_text(c.req.minor_version, status, type, extra, true);
  h += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  c.send.append(h).append(body);
  c.st = State::closing;
  c.x.reset();
  c.reservation.reset();
  c.close_after = true;
  c.deadline = Clock::now() + 10s;
}

std::string peer_name(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(ss);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) {
      in_addr v4;
      std::memcpy(&v4, a6.sin6_addr.s6_addr + 12, 4);
      inet_ntop(AF_INET, &v4, buf, sizeof buf);
    } else {
      inet_ntop(AF_INET6, &a6.sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}

}  // namespace

struct Server::Impl {
  int listen_fd = -1;
  std::shared_ptr<Waker> waker = std::make_shared<Waker>();
  std::shared_ptr<Budget> budget = std::make_shared<Budget>();
  std::list<Conn> conns;
  std::map<std::string, int> per_peer;
  uint64_t next_serial = 0;
  std::atomic<bool> stop{false};
  std::atomic<int> drain_ms{0};
  std::mutex stop_mu;
  bool stopped = false;
};

Result<std::unique_ptr<Server>> Server::bind(const std::string& host, int port, const Limits& limits, Handler handler) {
  std::unique_ptr<Server> s(new Server());
  s->impl_ = std::make_unique<Impl>();
  s->limits_ = limits;
  s->handler_ = std::move(handler);
  s->impl_->budget->cap = limits.body_budget_bytes;
  // Every connection is a descriptor: take what the hard limit allows (the
  // soft limit is often 1024).
  if (rlimit r{}; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = std::min<rlim_t>(r.rlim_max, 1 << 16);
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  if (s->impl_->waker->rd < 0) return io_error("cannot create the server's wake-up pipe: " + std::string(std::strerror(errno)));
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int e = ::getaddrinfo(h.c_str(), service.c_str(), &hints, &res); e != 0)
    return io_error("cannot listen on " + host + ":" + service + ": " + gai_strerror(e) +
                    " (give an address of this machine with --host)");
  int fd = -1;
  std::string why;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only: it never lets a second server share a listening
    // port (SO_REUSEPORT would, and the kernel would split the clients).
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, limits.listen_backlog) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0)
    return io_error("cannot listen on " + host + ":" + service + ": " + why +
                    " (the port is in use or the address is not one of this machine's: choose another --port or --host)");
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  s->port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(ss).sin6_port
                                            : reinterpret_cast<sockaddr_in&>(ss).sin_port);
  s->impl_->listen_fd = fd;
  return s;
}

Server::~Server() { stop(0); }

void Server::start() { thread_ = std::thread([this] { run(); }); }

void Server::stop(int drain_ms) {
  {
    std::lock_guard<std::mutex> lock(impl_->stop_mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->drain_ms = std::max(0, drain_ms);
  impl_->stop = true;
  impl_->waker->wake();
  if (thread_.joinable()) thread_.join();
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  impl_->listen_fd = -1;
}

void Server::run() {
  Impl& m = *impl_;
  const Limits& L = limits_;
  // OpenAI's error shape: the only API this server carries.
  auto error_body = [](int status, const std::string& message) {
    (void)status;
    std::string e;
    for (char ch : message) {
      if (ch == '"' || ch == '\\') e += '\\';
      if (static_cast<unsigned char>(ch) >= 0x20) e += ch;
    }
    return "{\"error\":{\"message\":\"" + e + "\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}";
  };
  auto fail = [&](Conn& c, int status, const std::string& message, const Headers& extra = {}) {
    if (status == 408) counters_.timeouts++;
    else if (status == 503) counters_.rejected_busy++;
    else counters_.bad_requests++;
    queue_error(c, status, error_body(status, message), "application/json", extra);
  };
  const Headers retry = {{"Retry-After", "1"}};

  auto close_conn = [&](Conn& c) {
    if (c.dead) return;
    c.dead = true;
    std::function<void()> gone_fn;
    if (c.x) {
      std::lock_guard<std::mutex> lock(c.x->mu);
      if (!c.x->ended || !c.x->out.empty() || c.send_off < c.send.size()) {
        c.x->gone = true;
        gone_fn = std::move(c.x->on_gone);
      }
      c.x->gone = true;  // nothing more can be sent either way
    }
    if (gone_fn) gone_fn();
    ::close(c.fd);
    if (--m.per_peer[c.peer] <= 0) m.per_peer.erase(c.peer);
  };

  auto dispatch = [&](Conn& c) {
    c.st = State::serving;
    c.ended = false;
    auto x = std::make_shared<Responder::Exchange>();
    x->minor = c.req.minor_version;
    const std::string* conn_hdr = c.req.header("connection");
    const std::string conn_val = conn_hdr ? lower(*conn_hdr) : std::string();
    x->close_after = c.req.minor_version == 0 ? conn_val.find("keep-alive") == std::string::npos
                                              : conn_val.find("close") != std::string::npos;
    if (m.stop) x->close_after = true;
    x->max_pending = L.max_pending_output;
    x->waker = m.waker;
    c.x = x;
    c.req.body_reservation = std::move(c.reservation);
    counters_.requests++;
    Request req = std::move(c.req);
    c.req = Request{};
    c.req.minor_version = req.minor_version;
    try {
      handler_(std::move(req), std::make_shared<Responder>(x));
    } catch (const std::exception& e) {
      Responder(x).reply(500, "application/json", error_body(500, std::string("internal error: ") + e.what()));
    }
  };

  // Parses the request line and headers in c.in[0, end); false: answered with an error.
  auto parse_head = [&](Conn& c, std::size_t end) -> bool {
    std::string_view head(c.in.data(), end);
    const std::size_t eol = head.find("\r\n");
    const std::string_view line = head.substr(0, eol);
    const std::size_t sp1 = line.find(' '), sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
      fail(c, 400, "malformed request line: expected 'METHOD /path HTTP/1.1'");
      return false;
    }
    const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                           version = line.substr(sp2 + 1);
    if (method.empty() || method.size() > 16 ||
        !std::all_of(method.begin(), method.end(), [](char ch) { return is_tchar(static_cast<unsigned char>(ch)); })) {
      fail(c, 400, "malformed request method");
      return false;
    }
    if (version.size() != 8 || version.substr(0, 7) != "HTTP/1." || (version[7] != '0' && version[7] != '1')) {
      fail(c, version.substr(0, 5) == "HTTP/" ? 505 : 400, "only HTTP/1.0 and HTTP/1.1 are served");
      return false;
    }
    c.req.minor_version = version[7] - '0';
    if (target.empty() || (target.front() != '/' && !(target == "*" && method == "OPTIONS")) ||
        std::any_of(target.begin(), target.end(), [](char ch) {
          const auto u = static_cast<unsigned char>(ch);
          return u <= 0x20 || u >= 0x7f;  // anything else must be percent-encoded
        })) {
      fail(c, 400, "the request target must be a path beginning with '/'");
      return false;
    }
    c.req.method = std::string(method);
    c.req.target = std::string(target);
    c.req.path = c.req.target.substr(0, c.req.target.find('?'));
    std::size_t pos = eol + 2;
    while (pos < end) {
      std::size_t e = head.find("\r\n", pos);
      if (e == std::string_view::npos) e = end;
      const std::string_view h = head.substr(pos, e - pos);
      pos = e + 2;
      if (h.empty()) continue;
      if (h.front() == ' ' || h.front() == '\t') {
        fail(c, 400, "folded header lines are not accepted");
        return false;
      }
      const std::size_t colon = h.find(':');
      const std::string_view name = colon == std::string_view::npos ? std::string_view() : h.substr(0, colon);
      if (name.empty() || !std::all_of(name.begin(), name.end(), [](char ch) { return is_tchar(static_cast<unsigned char>(ch)); })) {
        fail(c, 400, "malformed header line");
        return false;
      }
      const std::string_view value = trim(h.substr(colon + 1));
      // NUL and other control characters end strings early in some readers
      // ("Bearer KEY\0junk" would compare as "Bearer KEY"): refused.
      if (std::any_of(value.begin(), value.end(), [](char ch) {
            const auto u = static_cast<unsigned char>(ch);
            return (u < 0x20 && u != '\t') || u == 0x7f;
          })) {
        fail(c, 400, "header '" + std::string(name) + "' holds a control character");
        return false;
      }
      if (static_cast<int>(c.req.headers.size()) >= L.max_headers) {
        fail(c, 431, "more than " + std::to_string(L.max_headers) + " headers");
        return false;
      }
      c.req.headers.emplace_back(lower(name), std::string(value));
    }
    const int hosts = c.req.header_count("host");
    if (hosts > 1 || (hosts == 0 && c.req.minor_version == 1)) {
      fail(c, 400, hosts > 1 ? "more than one Host header" : "an HTTP/1.1 request needs a Host header");
      return false;
    }
    // The body's framing, decided before any of it is read.
    const int n_te = c.req.header_count("transfer-encoding"), n_cl = c.req.header_count("content-length");
    if (n_te > 0 && n_cl > 0) {
      fail(c, 400, "Content-Length and Transfer-Encoding together are ambiguous");
      return false;
    }
    c.body_total = 0;
    c.reservation = std::make_shared<Reservation>();
    c.reservation->budget = m.budget;
    if (n_te > 0) {
      if (n_te > 1 || lower(*c.req.header("transfer-encoding")) != "chunked") {
        fail(c, 501, "only Transfer-Encoding: chunked is accepted");
        return false;
      }
      c.st = State::chunk_size;
    } else if (n_cl > 0) {
      const std::string& v = *c.req.header("content-length");
      if (n_cl > 1 || v.empty() || v.size() > 19 || !std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        // (19 digits always fit in 64 bits; more is past any limit anyway.)
        if (n_cl == 1 && v.size() > 19 && std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
          fail(c, 413, "the body (" + v + " bytes) is larger than the server accepts (" + std::to_string(L.max_body_bytes) +
                           " bytes; phaselab-cli serve --max-body)");
        else
          fail(c, 400, n_cl > 1 ? "more than one Content-Length header" : "Content-Length must be a whole number of bytes");
        return false;
      }
      const unsigned long long n = std::stoull(v);
      if (n > L.max_body_bytes) {
        fail(c, 413, "the body (" + v + " bytes) is larger than the server accepts (" + std::to_string(L.max_body_bytes) +
                         " bytes; phaselab-cli serve --max-body)");
        return false;
      }
      if (!c.reservation->grow(n)) {
        fail(c, 503, "the server is busy reading other requests' bodies: retry shortly", retry);
        return false;
      }
      c.body_left = n;
      c.st = n > 0 ? State::body : State::serving;
    } else {
      c.st = State::serving;  // no body
    }
    if (c.st != State::serving) {
      if (const std::string* ex = c.req.header("expect"); ex && lower(*ex) == "100-continue")
        c.send += "HTTP/1.1 100 Continue\r\n\r\n";
      c.deadline = Clock::now() + std::chrono::milliseconds(L.body_timeout_ms);
    }
    return true;
  };

  // Moves a connection through its states as far as the input allows.
  auto advance = [&](Conn& c) {
    for (;;) {
      switch (c.st) {
        case State::head: {
          // One empty line before a request is allowed (RFC 9112 2.2: some
          // clients add a CRLF after a body); more is not a request.
          if (c.scanned == 0 && c.in.size() >= 2 && c.in[0] == '\r' && c.in[1] == '\n') {
            if (c.in.size() >= 4 && c.in[2] == '\r' && c.in[3] == '\n') {
              fail(c, 400, "empty lines where a request line belongs");
              return;
            }
            c.in.erase(0, 2);
          }
          if (c.in.empty()) return;
          const std::size_t from = c.scanned > 3 ? c.scanned - 3 : 0;
          const std::size_t end = c.in.find("\r\n\r\n", from);
          if (end == std::string::npos) {
            const std::size_t eol = c.in.find("\r\n");
            if (eol != std::string::npos && !plausible_request_line(std::string_view(c.in.data(), eol))) {
              fail(c, 400, "malformed request line: expected 'METHOD /path HTTP/1.1'");
              return;
            }
            c.scanned = c.in.size();
            if (c.in.size() > L.max_header_bytes) fail(c, 431, "the request line and headers exceed " + std::to_string(L.max_header_bytes) + " bytes");
            return;
          }
          if (end + 4 > L.max_header_bytes) {
            fail(c, 431, "the request line and headers exceed " + std::to_string(L.max_header_bytes) + " bytes");
            return;
          }
          c.req.peer = c.peer;
          const bool ok = parse_head(c, end + 2);
          if (!ok) return;
          c.in.erase(0, end + 4);
          c.scanned = 0;
          if (c.st == State::serving) {
            dispatch(c);
            return;
          }
          break;
        }
        case State::body: {
          const std::size_t n = std::min(c.body_left, c.in.size());
          c.req.body.append(c.in, 0, n);
          c.in.erase(0, n);
          c.body_left -= n;
          if (c.body_left > 0) return;
          dispatch(c);
          return;
        }
        case State::chunk_size: {
          const std::size_t e = c.in.find("\r\n");
          if (e == std::string::npos) {
            if (c.in.size() > kMaxChunkLine) fail(c, 400, "malformed chunk size line");
            return;
          }
          std::string_view line(c.in.data(), e);
          line = line.substr(0, line.find(';'));  // chunk extensions are ignored
          line = trim(line);
          if (line.empty() || line.size() > 15 ||
              !std::all_of(line.begin(), line.end(), [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; })) {
            fail(c, 400, "malformed chunk size");
            return;
          }
          const std::size_t size = std::stoull(std::string(line), nullptr, 16);
          c.in.erase(0, e + 2);
          if (size == 0) {
            c.st = State::trailers;
            c.trailer_bytes = 0;
            break;
          }
          if (c.body_total + size > L.max_body_bytes) {
            fail(c, 413, "the chunked body exceeds " + std::to_string(L.max_body_bytes) +
                             " bytes, the most the server accepts (phaselab-cli serve --max-body)");
            return;
          }
          if (!c.reservation->grow(size)) {
            fail(c, 503, "the server is busy reading other requests' bodies: retry shortly", retry);
            return;
          }
          c.body_total += size;
          c.body_left = size;
          c.st = State::chunk_data;
          break;
        }
        case State::chunk_data: {
          const std::size_t n = std::min(c.body_left, c.in.size());
          c.req.body.append(c.in, 0, n);
          c.in.erase(0, n);
          c.body_left -= n;
          if (c.body_left > 0) return;
          c.st = State::chunk_crlf;
          break;
        }
        case State::chunk_crlf: {
          if (c.in.size() < 2) return;
          if (c.in[0] != '\r' || c.in[1] != '\n') {
            fail(c, 400, "a chunk does not end with CRLF");
            return;
          }
          c.in.erase(0, 2);
          c.st = State::chunk_size;
          break;
        }
        case State::trailers: {
          const std::size_t e = c.in.find("\r\n");
          if (e == std::string::npos) {
            if (c.trailer_bytes + c.in.size() > L.max_header_bytes) fail(c, 431, "the trailers are too large");
            return;
          }
          c.trailer_bytes += e + 2;
          if (c.trailer_bytes > L.max_header_bytes) {
            fail(c, 431, "the trailers are too large");
            return;
          }
          c.in.erase(0, e + 2);
          if (e == 0) {  // the empty line: the body is complete
            dispatch(c);
            return;
          }
          break;
        }
        case State::serving:
        case State::closing:
        case State::linger:
          return;
      }
    }
  };

  // The exchange's queued bytes join the send buffer; true when it ended.
  auto pull = [&](Conn& c) {
    if (!c.x) return;
    std::lock_guard<std::mutex> lock(c.x->mu);
    if (!c.x->out.empty()) {
      if (c.send_off == c.send.size()) {
        c.send.clear();
        c.send_off = 0;
      }
      c.send += c.x->out;
      c.x->out.clear();
      if (c.send.size() - c.send_off > L.max_pending_output) c.eof = true;  // a client that stopped reading
    }
    if (c.x->ended) {
      c.ended = true;
      c.close_after = c.close_after || c.x->close_after;
    }
  };

  auto write_some = [&](Conn& c) {
    while (c.send_off < c.send.size()) {
      const ssize_t n = ::send(c.fd, c.send.data() + c.send_off, c.send.size() - c.send_off, MSG_NOSIGNAL);
      if (n > 0) {
        c.send_off += static_cast<std::size_t>(n);
        c.last_progress = Clock::now();
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      close_conn(c);
      return;
    }
    c.send.clear();
    c.send_off = 0;
  };

  auto read_some = [&](Conn& c) {
    char buf[kReadChunk];
    std::size_t total = 0;
    while (total < kMaxReadPerTurn) {
      if (c.st == State::serving && c.in.size() >= kMaxBufferedWhileServing) return;
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        total += static_cast<std::size_t>(n);
        if (c.st != State::linger && c.st != State::closing) c.in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      c.eof = true;  // closed (0) or reset
      return;
    }
  };

  // Shut our side and read what the client still sends for a moment:
  // closing with unread input would reset the connection and could destroy
  // the answer before the client reads it.
  auto linger = [&](Conn& c) {
    ::shutdown(c.fd, SHUT_WR);
    c.st = State::linger;
    c.deadline = Clock::now() + kLinger;
  };

  // A response that ended and was sent: close, or take the next request.
  auto after_send = [&](Conn& c) {
    if (c.dead || !c.send.empty()) return;
    if (c.st == State::closing) {
      linger(c);
      return;
    }
    if (c.st != State::serving || !c.ended) return;
    if (c.close_after || m.stop) {
      linger(c);
      return;
    }
    c.x.reset();
    c.ended = false;
    c.st = State::head;
    c.since = Clock::now();
    c.deadline = Clock::now() + std::chrono::milliseconds(c.in.empty() ? L.idle_timeout_ms : L.header_timeout_ms);
    advance(c);
  };

  // Connections this process can hold: the limit, within the descriptors
  // it may open (a few kept for the model's files and logs).
  int max_conns = L.max_connections;
  if (rlimit r{}; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    max_conns = static_cast<int>(std::min<rlim_t>(static_cast<rlim_t>(max_conns),
                                                  r.rlim_cur > 2 * kMaxExtraClosing ? r.rlim_cur - 2 * kMaxExtraClosing : r.rlim_cur / 2));
  Clock::time_point accept_paused_until{};
  auto accept_all = [&] {
    for (int i = 0; i < 256; i++) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd = ::accept(m.listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
      if (fd < 0) {
        // Out of descriptors: the pending connections wait in the backlog
        // (polling the listening socket now would spin).
        if (errno == EMFILE || errno == ENFILE) accept_paused_until = Clock::now() + 100ms;
        return;
      }
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      ::fcntl(fd, F_SETFD, FD_CLOEXEC);
      counters_.connections++;
      const std::string peer = peer_name(ss);
      // A client at its limit, or any client when the server is full, loses
      // the connection that has waited longest for a request that is not
      // coming (idle, or a request arriving slowly), if it has waited a
      // second: a burst of new clients is not cut. When full, the victim
      // comes from the client with the most connections. With none such,
      // the new connection gets 503.
      const bool client_full = m.per_peer[peer] >= L.max_connections_per_client;
      if (client_full || static_cast<int>(m.conns.size()) >= max_conns) {
        std::string whose = peer;
        if (!client_full)
          for (const auto& [p, n] : m.per_peer)
            if (n > m.per_peer[whose]) whose = p;
        Conn* victim = nullptr;
        const auto cutoff = Clock::now() - kEvictAfter;
        for (Conn& c : m.conns)
          if (!c.dead && c.peer == whose && c.st != State::serving && c.st != State::closing && c.st != State::linger &&
              c.since <= cutoff && (!victim || c.since < victim->since))
            victim = &c;
        if (victim) {
          counters_.evicted++;
          close_conn(*victim);
        }
      }
      const int live = static_cast<int>(std::count_if(m.conns.begin(), m.conns.end(), [](const Conn& c) { return !c.dead; }));
      const bool full = live >= max_conns || m.per_peer[peer] >= L.max_connections_per_client;
      if (full && live >= max_conns + kMaxExtraClosing) {
        ::close(fd);
        counters_.rejected_busy++;
        continue;
      }
      Conn& c = m.conns.emplace_back();
      c.fd = fd;
      c.peer = peer;
      c.serial = m.next_serial++;
      c.last_progress = c.since = Clock::now();
      c.deadline = Clock::now() + std::chrono::milliseconds(L.header_timeout_ms);
      m.per_peer[peer]++;
      if (full) fail(c, 503, "the server has too many connections open: retry shortly", retry);
    }
  };

  Clock::time_point drain_until{};
  bool draining = false;
  std::vector<pollfd> fds;
  std::vector<Conn*> order;
  for (;;) {
    if (m.stop && !draining) {
      draining = true;
      drain_until = Clock::now() + std::chrono::milliseconds(m.drain_ms.load());
      ::close(m.listen_fd);
      m.listen_fd = -1;
      // Connections without a request being answered end now.
      for (Conn& c : m.conns)
        if (c.st != State::serving) close_conn(c);
    }
    for (auto it = m.conns.begin(); it != m.conns.end();) it = it->dead ? m.conns.erase(it) : std::next(it);
    if (draining && (m.conns.empty() || Clock::now() >= drain_until)) break;

    fds.clear();
    order.clear();
    fds.push_back({m.waker->rd, POLLIN, 0});
    const bool accepting = m.listen_fd >= 0 && Clock::now() >= accept_paused_until;
    if (accepting) fds.push_back({m.listen_fd, POLLIN, 0});
    auto next = Clock::now() + 1s;
    for (Conn& c : m.conns) {
      pull(c);
      short ev = 0;
      const bool reading = c.st != State::serving || c.in.size() < kMaxBufferedWhileServing;
      if (reading && !c.eof) ev |= POLLIN;
      if (c.send_off < c.send.size()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
      order.push_back(&c);
      if (c.st != State::serving) next = std::min(next, c.deadline);
      else if (c.send_off < c.send.size())
        next = std::min(next, c.last_progress + std::chrono::milliseconds(L.write_timeout_ms));
    }
    if (draining) next = std::min(next, drain_until);
    if (m.listen_fd >= 0 && !accepting) next = std::min(next, accept_paused_until);
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait + 1, 0, 1000)));
    if (n < 0 && errno != EINTR) {
      spdlog::error("http: poll failed: {}", std::strerror(errno));
      break;
    }
    if (fds[0].revents) m.waker->drain();
    const std::size_t base = accepting ? 2 : 1;
    if (accepting && (fds[1].revents & POLLIN)) accept_all();

    const auto now = Clock::now();
    for (std::size_t i = 0; i < order.size(); i++) {
      Conn& c = *order[i];
      if (c.dead) continue;
      const short re = fds[base + i].revents;
      if (re & (POLLIN | POLLHUP | POLLERR)) read_some(c);
      if (c.dead) continue;
      const State before = c.st;
      if (!c.in.empty() && c.st != State::serving && c.st != State::closing && c.st != State::linger) {
        if (before == State::head && c.scanned == 0 && c.in.size() > 0 && c.deadline - now > std::chrono::milliseconds(L.header_timeout_ms))
          c.deadline = now + std::chrono::milliseconds(L.header_timeout_ms);
        advance(c);
      }
      pull(c);
      if (c.send_off < c.send.size()) write_some(c);
      if (c.dead) continue;
      after_send(c);
      if (c.dead) continue;
      if (c.eof) {
        // The client closed or reset: a response under way has no one to go
        // to (its on_gone cancels the work); a linger ends.
        if (c.st != State::serving || !c.ended || c.send_off < c.send.size()) {
          close_conn(c);
          continue;
        }
      }
      // Deadlines: a request that is too slow to arrive gets 408.
      if (c.st == State::linger && now >= c.deadline) {
        close_conn(c);
      } else if (c.st == State::closing && now >= c.deadline) {
        close_conn(c);
      } else if (c.st == State::head && now >= c.deadline) {
        if (c.in.empty()) close_conn(c);  // idle keep-alive: nothing to say
        else fail(c, 408, "the request headers took longer than " + std::to_string(L.header_timeout_ms / 1000) + " s");
      } else if (c.st != State::serving && c.st != State::head && c.st != State::closing && c.st != State::linger &&
                 now >= c.deadline) {
        fail(c, 408, "the request body took longer than " + std::to_string(L.body_timeout_ms / 1000) + " s");
      } else if (c.st == State::serving && c.send_off < c.send.size() &&
                 now - c.last_progress > std::chrono::milliseconds(L.write_timeout_ms)) {
        close_conn(c);  // a client that stopped reading
      }
      if (!c.dead && c.send_off < c.send.size()) write_some(c);
    }
  }
  for (Conn& c : m.conns) close_conn(c);
  m.conns.clear();
}

}  // namespace phaselab::http
