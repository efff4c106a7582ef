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
constexpr auto kLinger = 2s;  // reading what a refused client still sends, so our answer is not reset
constexpr int kMaxExtraClosing = 256;  // connections past the limit, kept only to send them a 503
constexpr auto kEvictAfter = 1s;  // a connection this long without a request may give way to its client's new one

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

// A response's head up to its framing headers (Content-Length or
// Transfer-Encoding, which the caller adds, then the blank line).
std::string head_text(int minor, int status, std::string_view content_type, const Headers& extra, const Headers& always,
                      bool close) {
  std::string h = "HTTP/1." + std::to_string(minor) + " " + std::to_string(status) + " " + status_text(status) + "\r\n";
  if (!content_type.empty()) h.append("Content-Type: ").append(content_type).append("\r\n");
  for (const Headers* hs : {&extra, &always})
    for (const auto& [k, v] : *hs) h.append(k).append(": ").append(v).append("\r\n");
  if (close) h += "Connection: close\r\n";
  else if (minor == 0) h += "Connection: keep-alive\r\n";
  return h;
}

}  // namespace

// --- the response's shared state ----------------------------------------------

struct Responder::Exchange {
  std::mutex mu;
  std::string out;  // bytes for the server thread to send
  bool head_sent = false, chunked = false, ended = false, gone = false;
  bool close_after = false;  // Connection: close after this response
  bool head_request = false;  // HEAD: no body
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
    std::string h = head_text(x_->minor, status, content_type, extra, x_->always, x_->close_after);
    if (status != 204 && status != 304) h += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    x_->out += h + "\r\n";
    // A HEAD request's answer has the head alone (a body would be read as
    // the next response on a kept-alive connection).
    if (!x_->head_request && status != 204 && status != 304) x_->out += body;
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
    std::string h = head_text(x_->minor, status, content_type, extra, x_->always, x_->close_after);
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
  reading,  // a request (its reader says which part)
  serving,  // the handler has the request; its response is being sent
  closing,  // sending a last response, then lingering
  linger,   // written side shut; discarding what the client still sends
};

struct Conn {
  int fd = -1;
  std::string peer;
  State st = State::reading;
  std::string in;  // received, not yet parsed
  std::unique_ptr<RequestReader> reader;
  std::shared_ptr<Reservation> reservation;  // the body being read's share of the budget
  std::shared_ptr<Responder::Exchange> x;    // the response under way (serving)
  std::string send;
  std::size_t send_off = 0;
  bool ended = false;      // the exchange ended: close or take the next request once sent
  bool close_after = false;
  bool eof = false;
  Clock::time_point deadline;       // when the current phase must be done
  Clock::time_point last_progress;  // of sending
  Clock::time_point since;          // accepted, or its last response sent: waiting for a request since
  bool dead = false;
  bool head_started = false;  // a byte of the next request's head has arrived

  bool reading_head() const { return st == State::reading && reader->phase() == RequestReader::Phase::head; }
};

// A server-made error response: the connection closes after it.
void queue_error(Conn& c, int status, const ErrorResponse& e, const Headers& extra) {
  const std::string& body = e.body;
  std::string h = head_text(c.reader->minor_version(), status, e.content_type, extra, {}, true);
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

// Reads what has arrived, up to kMaxReadPerTurn; c.eof when the client
// closed or reset. What a closing or lingering connection receives is
// dropped.
void read_some(Conn& c) {
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
}

// Connections this process can hold: the limit, within the descriptors
// it may open (a few kept for the model's files and logs).
int connection_capacity(const Limits& L) {
  int max_conns = L.max_connections;
  if (rlimit r{}; ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    max_conns = static_cast<int>(std::min<rlim_t>(static_cast<rlim_t>(max_conns),
                                                  r.rlim_cur > 2 * kMaxExtraClosing ? r.rlim_cur - 2 * kMaxExtraClosing : r.rlim_cur / 2));
  return max_conns;
}

}  // namespace

// The server's state, and its thread's reactor: one poll loop (run) whose
// every turn pulls what the handlers queued, polls, accepts, and steps each
// connection (step) through reading, dispatching, writing and its deadlines.
struct Server::Impl {
  // The Server's own settings (it holds them, and this, for its lifetime).
  Impl(const Limits& limits, const Handler& handler, const ErrorFormatter& format_error)
      : limits(limits), handler(handler), format_error(format_error) {}
  const Limits& limits;
  const Handler& handler;
  const ErrorFormatter& format_error;

  int listen_fd = -1;
  std::shared_ptr<Waker> waker = std::make_shared<Waker>();
  std::shared_ptr<Budget> budget = std::make_shared<Budget>();
  std::list<Conn> conns;
  std::map<std::string, int> per_peer;
  std::atomic<bool> stop{false};
  std::atomic<int> drain_ms{0};
  std::mutex stop_mu;
  bool stopped = false;

  void run();

 private:
  const Headers retry = {{"Retry-After", "1"}};
  // The server thread's own, for the length of run().
  int max_conns = 0;  // connection_capacity()
  Clock::time_point accept_paused_until{};
  bool draining = false;
  Clock::time_point drain_until{};
  std::vector<pollfd> fds;  // the waker, the listening socket when accepting, then order's
  std::vector<Conn*> order;

  // The loop's turn, in order.
  void begin_drain();
  Clock::time_point prepare_poll(bool accepting);
  void accept_all();
  void step(Conn& c, short revents, Clock::time_point now);

  // Accepting.
  void admit(int fd, const std::string& peer);
  void evict_for(const std::string& peer, bool client_full);
  int live_count() const;

  // A connection's steps.
  void advance(Conn& c);
  void dispatch(Conn& c);
  void pull(Conn& c);
  void write_some(Conn& c);
  void after_send(Conn& c);
  void check_deadlines(Conn& c, Clock::time_point now);
  void linger(Conn& c);
  void fail(Conn& c, int status, const std::string& message, const Headers& extra = {});
  void close_conn(Conn& c);
};

Result<std::unique_ptr<Server>> Server::bind(const std::string& host, int port, const Limits& limits, Handler handler,
                                             ErrorFormatter format_error) {
  std::unique_ptr<Server> s(new Server());
  s->impl_ = std::make_unique<Impl>(s->limits_, s->handler_, s->format_error_);
  s->limits_ = limits;
  s->handler_ = std::move(handler);
  s->format_error_ = format_error ? std::move(format_error) : [](int, const std::string& message) {
    return ErrorResponse{"text/plain; charset=utf-8", message + "\n"};
  };
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

void Server::run() { impl_->run(); }

// --- the reactor ------------------------------------------------------------------

void Server::Impl::run() {
  max_conns = connection_capacity(limits);
  for (;;) {
    if (stop && !draining) begin_drain();
    for (auto it = conns.begin(); it != conns.end();) it = it->dead ? conns.erase(it) : std::next(it);
    if (draining && (conns.empty() || Clock::now() >= drain_until)) break;

    const bool accepting = listen_fd >= 0 && Clock::now() >= accept_paused_until;
    const Clock::time_point next = prepare_poll(accepting);
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait + 1, 0, 1000)));
    if (n < 0 && errno != EINTR) {
      spdlog::error("http: poll failed: {}", std::strerror(errno));
      break;
    }
    if (fds[0].revents) waker->drain();
    const std::size_t base = accepting ? 2 : 1;
    if (accepting && (fds[1].revents & POLLIN)) accept_all();

    // (Connections accepted just now wait for the next turn.)
    const auto now = Clock::now();
    for (std::size_t i = 0; i < order.size(); i++) step(*order[i], fds[base + i].revents, now);
  }
  for (Conn& c : conns) close_conn(c);
  conns.clear();
}

// stop(): no new connections; connections without a request being answered
// end now, the others get until drain_until.
void Server::Impl::begin_drain() {
  draining = true;
  drain_until = Clock::now() + std::chrono::milliseconds(drain_ms.load());
  ::close(listen_fd);
  listen_fd = -1;
  for (Conn& c : conns)
    if (c.st != State::serving) close_conn(c);
}

// Pulls every exchange's queued output and fills fds / order; returns when
// the next deadline falls (at most a second away).
Clock::time_point Server::Impl::prepare_poll(bool accepting) {
  fds.clear();
  order.clear();
  fds.push_back({waker->rd, POLLIN, 0});
  if (accepting) fds.push_back({listen_fd, POLLIN, 0});
  auto next = Clock::now() + 1s;
  for (Conn& c : conns) {
    pull(c);
    short ev = 0;
    const bool reading = c.st != State::serving || c.in.size() < kMaxBufferedWhileServing;
    if (reading && !c.eof) ev |= POLLIN;
    if (c.send_off < c.send.size()) ev |= POLLOUT;
    fds.push_back({c.fd, ev, 0});
    order.push_back(&c);
    if (c.st != State::serving) next = std::min(next, c.deadline);
    else if (c.send_off < c.send.size())
      next = std::min(next, c.last_progress + std::chrono::milliseconds(limits.write_timeout_ms));
  }
  if (draining) next = std::min(next, drain_until);
  if (listen_fd >= 0 && !accepting) next = std::min(next, accept_paused_until);
  return next;
}

// One connection's turn after poll: read, advance its request, send, then
// the client's close and the deadlines.
void Server::Impl::step(Conn& c, short revents, Clock::time_point now) {
  if (c.dead) return;
  if (revents & (POLLIN | POLLHUP | POLLERR)) read_some(c);
  // Hung up or reset while its input is not being read (a response under
  // way with pipelined bytes waiting): gone, or poll would return at once
  // forever.
  if (revents & (POLLHUP | POLLERR)) c.eof = true;
  if (c.dead) return;
  if (!c.in.empty() && c.st == State::reading) {
    // A request's first byte: its headers have header_timeout_ms from now
    // (a kept-alive connection had been waiting on its idle timeout).
    if (c.reading_head() && !c.head_started) {
      c.head_started = true;
      c.deadline = now + std::chrono::milliseconds(limits.header_timeout_ms);
    }
    advance(c);
  }
  pull(c);
  if (c.send_off < c.send.size()) write_some(c);
  if (c.dead) return;
  after_send(c);
  if (c.dead) return;
  if (c.eof) {
    // The client closed or reset (what could be sent was, just above): a
    // response under way has no one to go to (its on_gone cancels the
    // work); a linger ends.
    close_conn(c);
    return;
  }
  check_deadlines(c, now);
  if (!c.dead && c.send_off < c.send.size()) write_some(c);
}

// --- accepting ----------------------------------------------------------------------

void Server::Impl::accept_all() {
  for (int i = 0; i < 256; i++) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int fd = ::accept(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
    if (fd < 0) {
      // Out of descriptors: the pending connections wait in the backlog
      // (polling the listening socket now would spin).
      if (errno == EMFILE || errno == ENFILE) accept_paused_until = Clock::now() + 100ms;
      return;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    admit(fd, peer_name(ss));
  }
}

// A new connection: room is made for it if it can be (evict_for); past the
// limits it is kept only to be told 503, and past those too it is closed.
void Server::Impl::admit(int fd, const std::string& peer) {
  const bool client_full = per_peer[peer] >= limits.max_connections_per_client;
  if (client_full || live_count() >= max_conns) evict_for(peer, client_full);
  const int n_live = live_count();
  const bool full = n_live >= max_conns || per_peer[peer] >= limits.max_connections_per_client;
  if (full && n_live >= max_conns + kMaxExtraClosing) {
    ::close(fd);
    if (per_peer[peer] == 0) per_peer.erase(peer);
    return;
  }
  Conn& c = conns.emplace_back();
  c.fd = fd;
  c.peer = peer;
  c.last_progress = c.since = Clock::now();
  c.deadline = Clock::now() + std::chrono::milliseconds(limits.header_timeout_ms);
  Conn* cp = &c;  // list elements stay where they are
  c.reader = std::make_unique<RequestReader>(limits, [cp, budget = this->budget](std::size_t n) {
    if (!cp->reservation) {
      cp->reservation = std::make_shared<Reservation>();
      cp->reservation->budget = budget;
    }
    return cp->reservation->grow(n);
  });
  per_peer[peer]++;
  if (full) fail(c, 503, "the server has too many connections open: retry shortly", retry);
}

// A client at its limit, or any client when the server is full, loses the
// connection that has waited longest for a request that is not coming
// (idle, or a request arriving slowly), if it has waited a second: a burst
// of new clients is not cut. When full, the victim comes from the client
// with the most connections. With none such, the new connection gets 503.
void Server::Impl::evict_for(const std::string& peer, bool client_full) {
  std::string whose = peer;
  if (!client_full)
    for (const auto& [p, n] : per_peer)
      if (n > per_peer[whose]) whose = p;
  Conn* victim = nullptr;
  const auto cutoff = Clock::now() - kEvictAfter;
  for (Conn& c : conns)
    if (!c.dead && c.peer == whose && c.st != State::serving && c.st != State::closing && c.st != State::linger &&
        c.since <= cutoff && (!victim || c.since < victim->since))
      victim = &c;
  if (victim) close_conn(*victim);
}

int Server::Impl::live_count() const {
  return static_cast<int>(std::count_if(conns.begin(), conns.end(), [](const Conn& c) { return !c.dead; }));
}

// --- a connection's steps --------------------------------------------------------------

// Reads as far as the input allows: a request is dispatched, a bad one
// answered; the body's deadline starts when its headers are in.
void Server::Impl::advance(Conn& c) {
  if (c.st != State::reading) return;
  const bool was_head = c.reader->phase() == RequestReader::Phase::head;
  const RequestReader::Step step = c.reader->feed(c.in);
  if (c.reader->take_continue()) c.send += "HTTP/1.1 100 Continue\r\n\r\n";
  if (step == RequestReader::Step::error) {
    const RequestReader::Error& e = c.reader->error();
    fail(c, e.status, e.message, e.status == 503 ? retry : Headers{});
  } else if (step == RequestReader::Step::request) {
    dispatch(c);
  } else if (was_head && c.reader->phase() != RequestReader::Phase::head) {
    c.deadline = Clock::now() + std::chrono::milliseconds(limits.body_timeout_ms);
  }
}

// Hands the request to the handler, with the exchange its answer goes through.
void Server::Impl::dispatch(Conn& c) {
  Request req = c.reader->take();
  req.peer = c.peer;
  req.body_reservation = std::move(c.reservation);
  c.st = State::serving;
  c.ended = false;
  auto x = std::make_shared<Responder::Exchange>();
  x->minor = req.minor_version;
  x->head_request = req.method == "HEAD";
  const std::string* conn_hdr = req.header("connection");
  const std::string conn_val = conn_hdr ? lower_ascii(*conn_hdr) : std::string();
  x->close_after = req.minor_version == 0 ? conn_val.find("keep-alive") == std::string::npos
                                          : conn_val.find("close") != std::string::npos;
  if (stop) x->close_after = true;
  x->max_pending = limits.max_pending_output;
  x->waker = waker;
  c.x = x;
  try {
    handler(std::move(req), std::make_shared<Responder>(x));
  } catch (const std::exception& e) {
    const ErrorResponse r = format_error(500, std::string("internal error: ") + e.what());
    Responder(x).reply(500, r.content_type, r.body);
  }
}

// The exchange's queued bytes join the send buffer; c.ended when it ended.
void Server::Impl::pull(Conn& c) {
  if (!c.x) return;
  std::lock_guard<std::mutex> lock(c.x->mu);
  if (!c.x->out.empty()) {
    if (c.send_off == c.send.size()) {
      c.send.clear();
      c.send_off = 0;
    }
    c.send += c.x->out;
    c.x->out.clear();
    // A stream whose client stopped reading (a whole response, however
    // large, is sent: it is done growing).
    if (!c.x->ended && c.send.size() - c.send_off > limits.max_pending_output) c.eof = true;
  }
  if (c.x->ended) {
    c.ended = true;
    c.close_after = c.close_after || c.x->close_after;
  }
}

void Server::Impl::write_some(Conn& c) {
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
}

// A response that ended and was sent: close, or take the next request.
void Server::Impl::after_send(Conn& c) {
  if (c.dead || !c.send.empty()) return;
  if (c.st == State::closing) {
    linger(c);
    return;
  }
  if (c.st != State::serving || !c.ended) return;
  if (c.close_after || stop) {
    linger(c);
    return;
  }
  c.x.reset();
  c.ended = false;
  c.st = State::reading;
  c.head_started = !c.in.empty();  // a pipelined request already begun
  c.since = Clock::now();
  c.deadline = Clock::now() + std::chrono::milliseconds(c.in.empty() ? limits.idle_timeout_ms : limits.header_timeout_ms);
  advance(c);
}

// Deadlines: a request that is too slow to arrive gets 408; a linger or a
// last response ends; a client that stopped reading is cut.
void Server::Impl::check_deadlines(Conn& c, Clock::time_point now) {
  if (c.st == State::linger && now >= c.deadline) {
    close_conn(c);
  } else if (c.st == State::closing && now >= c.deadline) {
    close_conn(c);
  } else if (c.reading_head() && now >= c.deadline) {
    if (!c.head_started) close_conn(c);  // idle: nothing to say
    else fail(c, 408, "the request headers took longer than " + std::to_string(limits.header_timeout_ms / 1000) + " s");
  } else if (c.st == State::reading && now >= c.deadline) {
    fail(c, 408, "the request body took longer than " + std::to_string(limits.body_timeout_ms / 1000) + " s");
  } else if (c.st == State::serving && c.send_off < c.send.size() &&
             now - c.last_progress > std::chrono::milliseconds(limits.write_timeout_ms)) {
    close_conn(c);  // a client that stopped reading
  }
}

// Shut our side and read what the client still sends for a moment:
// closing with unread input would reset the connection and could destroy
// the answer before the client reads it.
void Server::Impl::linger(Conn& c) {
  ::shutdown(c.fd, SHUT_WR);
  c.st = State::linger;
  c.deadline = Clock::now() + kLinger;
}

void Server::Impl::fail(Conn& c, int status, const std::string& message, const Headers& extra) {
  queue_error(c, status, format_error(status, message), extra);
}

// Closes the descriptor once; a response still under way (or not all sent)
// learns that its client is gone.
void Server::Impl::close_conn(Conn& c) {
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
  if (--per_peer[c.peer] <= 0) per_peer.erase(c.peer);
}

}  // namespace phaselab::http
