// The HTTP/1.1 request reader: bytes in, one request (or the reason there is
// none) out, every limit counted as the bytes arrive. No sockets here, so
// that a fuzzer can drive it (tests/fuzz/fuzz_http.cpp).
#include <algorithm>
#include <cctype>
#include <cstring>

#include "phaselab/http_server.h"

namespace phaselab::http {

namespace {

constexpr std::size_t kMaxChunkLine = 1024;

bool is_tchar(unsigned char c) {
  // (c != 0: strchr finds the terminating NUL of its set.)
  return std::isalnum(c) || (c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

bool all_tchars(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char ch) { return is_tchar(static_cast<unsigned char>(ch)); });
}

bool all_digits(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether a complete request line can start a request ("METHOD /target
// HTTP/1.x"): checked as soon as the line is there, so that an HTTP/0.9
// request or junk is refused at once instead of waiting for headers.
bool plausible_request_line(std::string_view line) {
  const std::size_t sp = line.rfind(' ');
  return sp != std::string_view::npos && line.find(' ') < sp && line.substr(sp + 1).substr(0, 5) == "HTTP/";
}

}  // namespace

std::string lower_ascii(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

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

RequestReader::RequestReader(const Limits& limits, std::function<bool(std::size_t)> reserve)
    : limits_(limits), reserve_(std::move(reserve)) {}

void RequestReader::reset() {
  phase_ = Phase::head;
  req_ = Request{};
  scanned_ = body_left_ = body_total_ = trailer_bytes_ = 0;
  send_continue_ = false;
}

RequestReader::Step RequestReader::fail(int status, std::string message) {
  error_ = {status, std::move(message)};
  phase_ = Phase::failed;
  return Step::error;
}

RequestReader::Step RequestReader::feed(std::string& in) {
  for (;;) {
    switch (phase_) {
      case Phase::head: {
        // One empty line before a request is allowed (RFC 9112 2.2: some
        // clients add a CRLF after a body); more is not a request.
        if (scanned_ == 0 && in.size() >= 2 && in[0] == '\r' && in[1] == '\n') {
          if (in.size() >= 4 && in[2] == '\r' && in[3] == '\n') return fail(400, "empty lines where a request line belongs");
          in.erase(0, 2);
        }
        // (A lone CR may be the start of that empty line.)
        if (in.empty() || (scanned_ == 0 && in == "\r")) return Step::need_more;
        const std::size_t from = scanned_ > 3 ? scanned_ - 3 : 0;
        const std::size_t end = in.find("\r\n\r\n", from);
        if (end == std::string::npos) {
          const std::size_t eol = in.find("\r\n");
          if (eol != std::string::npos && !plausible_request_line(std::string_view(in.data(), eol)))
            return fail(400, "malformed request line: expected 'METHOD /path HTTP/1.1'");
          scanned_ = in.size();
          if (in.size() > limits_.max_header_bytes)
            return fail(431, "the request line and headers exceed " + std::to_string(limits_.max_header_bytes) + " bytes");
          return Step::need_more;
        }
        if (end + 4 > limits_.max_header_bytes)
          return fail(431, "the request line and headers exceed " + std::to_string(limits_.max_header_bytes) + " bytes");
        if (Step s = parse_head(std::string_view(in.data(), end + 2)); s == Step::error) return s;
        in.erase(0, end + 4);
        scanned_ = 0;
        if (phase_ == Phase::done) return Step::request;
        break;
      }
      case Phase::body:
      case Phase::chunk_data: {
        const std::size_t n = std::min(body_left_, in.size());
        req_.body.append(in, 0, n);
        in.erase(0, n);
        body_left_ -= n;
        if (body_left_ > 0) return Step::need_more;
        if (phase_ == Phase::body) {
          phase_ = Phase::done;
          return Step::request;
        }
        phase_ = Phase::chunk_crlf;
        break;
      }
      case Phase::chunk_size: {
        const std::size_t e = in.find("\r\n");
        if (e == std::string::npos) {
          if (in.size() > kMaxChunkLine) return fail(400, "malformed chunk size line");
          return Step::need_more;
        }
        std::string_view line(in.data(), e);
        line = trim(line.substr(0, line.find(';')));  // chunk extensions are ignored
        if (line.empty() || line.size() > 15 ||
            !std::all_of(line.begin(), line.end(), [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; }))
          return fail(400, "malformed chunk size");
        const std::size_t size = std::stoull(std::string(line), nullptr, 16);
        in.erase(0, e + 2);
        if (size == 0) {
          phase_ = Phase::trailers;
          trailer_bytes_ = 0;
          break;
        }
        if (body_total_ + size > limits_.max_body_bytes)
          return fail(413, "the chunked body exceeds " + std::to_string(limits_.max_body_bytes) +
                               " bytes, the most the server accepts (phaselab-cli serve --max-body)");
        if (reserve_ && !reserve_(size)) return fail(503, "the server is busy reading other requests' bodies: retry shortly");
        body_total_ += size;
        body_left_ = size;
        phase_ = Phase::chunk_data;
        break;
      }
      case Phase::chunk_crlf: {
        if (in.size() < 2) return Step::need_more;
        if (in[0] != '\r' || in[1] != '\n') return fail(400, "a chunk does not end with CRLF");
        in.erase(0, 2);
        phase_ = Phase::chunk_size;
        break;
      }
      case Phase::trailers: {
        const std::size_t e = in.find("\r\n");
        if (e == std::string::npos) {
          if (trailer_bytes_ + in.size() > limits_.max_header_bytes) return fail(431, "the trailers are too large");
          return Step::need_more;
        }
        trailer_bytes_ += e + 2;
        if (trailer_bytes_ > limits_.max_header_bytes) return fail(431, "the trailers are too large");
        in.erase(0, e + 2);
        if (e == 0) {  // the empty line: the body is complete
          phase_ = Phase::done;
          return Step::request;
        }
        break;
      }
      case Phase::done:
        return Step::request;
      case Phase::failed:
        return Step::error;
    }
  }
}

RequestReader::Step RequestReader::parse_head(std::string_view head) {
  const std::size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  const std::size_t sp1 = line.find(' '), sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line: expected 'METHOD /path HTTP/1.1'");
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  if (method.empty() || method.size() > 16 || !all_tchars(method)) return fail(400, "malformed request method");
  if (version.size() != 8 || version.substr(0, 7) != "HTTP/1." || (version[7] != '0' && version[7] != '1'))
    return fail(version.substr(0, 5) == "HTTP/" ? 505 : 400, "only HTTP/1.0 and HTTP/1.1 are served");
  req_.minor_version = version[7] - '0';
  if (target.empty() || (target.front() != '/' && !(target == "*" && method == "OPTIONS")) ||
      std::any_of(target.begin(), target.end(), [](char ch) {
        const auto u = static_cast<unsigned char>(ch);
        return u <= 0x20 || u >= 0x7f;  // anything else must be percent-encoded
      }))
    return fail(400, "the request target must be a path beginning with '/'");
  req_.method = std::string(method);
  req_.target = std::string(target);
  req_.path = req_.target.substr(0, req_.target.find('?'));
  std::size_t pos = eol + 2;
  while (pos < head.size()) {
    std::size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    const std::string_view h = head.substr(pos, e - pos);
    pos = e + 2;
    if (h.empty()) continue;
    if (h.front() == ' ' || h.front() == '\t') return fail(400, "folded header lines are not accepted");
    const std::size_t colon = h.find(':');
    const std::string_view name = colon == std::string_view::npos ? std::string_view() : h.substr(0, colon);
    if (name.empty() || !all_tchars(name)) return fail(400, "malformed header line");
    const std::string_view value = trim(h.substr(colon + 1));
    // NUL and other control characters end strings early in some readers
    // ("Bearer KEY\0junk" would compare as "Bearer KEY"): refused.
    if (std::any_of(value.begin(), value.end(), [](char ch) {
          const auto u = static_cast<unsigned char>(ch);
          return (u < 0x20 && u != '\t') || u == 0x7f;
        }))
      return fail(400, "header '" + std::string(name) + "' holds a control character");
    if (static_cast<int>(req_.headers.size()) >= limits_.max_headers)
      return fail(431, "more than " + std::to_string(limits_.max_headers) + " headers");
    req_.headers.emplace_back(lower_ascii(name), std::string(value));
  }
  const int hosts = req_.header_count("host");
  if (hosts > 1 || (hosts == 0 && req_.minor_version == 1))
    return fail(400, hosts > 1 ? "more than one Host header" : "an HTTP/1.1 request needs a Host header");
  return parse_framing();
}

// The body's framing, decided before any of it is read.
RequestReader::Step RequestReader::parse_framing() {
  const int n_te = req_.header_count("transfer-encoding"), n_cl = req_.header_count("content-length");
  if (n_te > 0 && n_cl > 0) return fail(400, "Content-Length and Transfer-Encoding together are ambiguous");
  body_total_ = 0;
  if (n_te > 0) {
    if (n_te > 1 || lower_ascii(*req_.header("transfer-encoding")) != "chunked")
      return fail(501, "only Transfer-Encoding: chunked is accepted");
    phase_ = Phase::chunk_size;
  } else if (n_cl > 0) {
    const std::string& v = *req_.header("content-length");
    const std::string too_big = "the body (" + v + " bytes) is larger than the server accepts (" +
                                std::to_string(limits_.max_body_bytes) + " bytes; phaselab-cli serve --max-body)";
    if (n_cl > 1) return fail(400, "more than one Content-Length header");
    if (v.empty() || !all_digits(v)) return fail(400, "Content-Length must be a whole number of bytes");
    // More than 19 digits is past any limit (and 19 always fit in 64 bits).
    if (v.size() > 19) return fail(413, too_big);
    const unsigned long long n = std::stoull(v);
    if (n > limits_.max_body_bytes) return fail(413, too_big);
    if (reserve_ && !reserve_(n)) return fail(503, "the server is busy reading other requests' bodies: retry shortly");
    body_left_ = n;
    phase_ = n > 0 ? Phase::body : Phase::done;
  } else {
    phase_ = Phase::done;  // no body
  }
  // (HTTP/1.0 has no 100 Continue.)
  if (phase_ != Phase::done && req_.minor_version == 1)
    if (const std::string* ex = req_.header("expect"); ex && lower_ascii(*ex) == "100-continue") send_continue_ = true;
  return Step::need_more;
}

Request RequestReader::take() {
  Request r = std::move(req_);
  reset();
  return r;
}

bool RequestReader::take_continue() {
  const bool c = send_continue_;
  send_continue_ = false;
  return c;
}

}  // namespace phaselab::http
