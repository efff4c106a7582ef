#include "phaselab/hub.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "phaselab/gguf.h"
#include "phaselab/kv_cache.h"
#include "phaselab/model_config.h"
#include "runtime/request_rules.h"

namespace phaselab::hub {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Rows per pass the estimate assumes: the most the CLI and the window prefill
// with (default_max_batch: 512, fewer for larger models on the CPU).
constexpr int kPassTokens = 512;
constexpr int kMaxRedirects = 5;
constexpr size_t kMaxFiles = 10000;            // GGUF files listed per repository
constexpr uint64_t kMaxFileBytes = 1ull << 50;  // per file
constexpr size_t kMaxErrorBody = 64 * 1024;
constexpr uint64_t kHeaderFirstRead = 1ull << 20;  // then 4, 16, 64 MiB for large vocabularies
constexpr uint64_t kHeaderMaxRead = 64ull << 20;

// ---- URLs -------------------------------------------------------------------

struct Url {
  std::string scheme;  // http or https
  std::string host;
  int port = 0;
  std::string target;  // path and query, starting with '/'
  std::string origin() const {
    const bool default_port = (scheme == "https" && port == 443) || (scheme == "http" && port == 80);
    return scheme + "://" + host + (default_port ? "" : ":" + std::to_string(port));
  }
};

Result<Url> parse_url(const std::string& text) {
  static const std::regex re(R"(^(https?)://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(?::([0-9]{1,5}))?(/[^\s#]*)?$)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    return invalid_argument("'" + text + "' is not an http(s) URL (expected e.g. https://huggingface.co)");
  Url u;
  u.scheme = m[1];
  u.host = m[2];
  u.port = m[3].matched ? std::stoi(m[3]) : (u.scheme == "https" ? 443 : 80);
  if (u.port <= 0 || u.port > 65535) return invalid_argument("'" + text + "': port out of range");
  u.target = m[4].matched ? std::string(m[4]) : "/";
  return u;
}

// Percent-encoding of a query value or of one path segment.
std::string encode(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/')) {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += hex[ch >> 4];
      out += hex[ch & 15];
    }
  }
  return out;
}

// The endpoint without a trailing slash; a path prefix (a mirror under
// /hf) is kept.
std::string base_of(const HubOptions& opt) {
  std::string e = opt.endpoint.empty() ? kDefaultEndpoint : opt.endpoint;
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

bool valid_repo_id(const std::string& repo) {
  static const std::regex re(R"(^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}$)");
  return std::regex_match(repo, re) && repo.find("..") == std::string::npos;
}

// A repository path that may become a file name here: no "..", no absolute
// path, no control characters; the file written is its last component.
bool safe_repo_path(const std::string& p) {
  if (p.empty() || p.size() > 1024 || p.front() == '/') return false;
  for (unsigned char ch : p)
    if (ch < 0x20 || ch == 0x7f || ch == '\\') return false;
  std::string seg;
  for (size_t i = 0; i <= p.size(); i++) {
    if (i == p.size() || p[i] == '/') {
      if (seg.empty() || seg == "." || seg == "..") return false;
      seg.clear();
    } else {
      seg += p[i];
    }
  }
  const std::string base = p.substr(p.rfind('/') == std::string::npos ? 0 : p.rfind('/') + 1);
  return base.front() != '.';
}

std::string base_name(const std::string& p) {
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}
std::string upper(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// ---- HTTP -------------------------------------------------------------------

struct Reply {
  int status = 0;
  httplib::Headers headers;
  std::string error_body;  // a non-2xx answer's body (capped), for its message
  httplib::Error error = httplib::Error::Success;
  bool stopped_by_us = false;  // the sink asked to stop (pause, cancel, enough bytes)
  std::string url;             // the URL that answered (after redirects)
  std::string header(const std::string& k) const {
    auto it = headers.find(k);
    return it == headers.end() ? "" : it->second;
  }
};

std::unique_ptr<httplib::Client> client_for(const HubOptions& opt, const Url& u) {
  auto c = std::make_unique<httplib::Client>(u.origin());
  c->set_follow_location(false);  // redirects are followed here, so that the token stays home
  c->set_connection_timeout(opt.connect_timeout_s, 0);
  c->set_read_timeout(opt.stall_timeout_s, 0);
  c->set_write_timeout(opt.stall_timeout_s, 0);
  c->set_keep_alive(false);
  c->set_url_encode(false);   // paths are encoded here; a CDN's signed query must stay byte for byte
  c->set_decompress(false);   // the bytes and ranges are the file's, never a gzip of it
  return c;
}

// GET url, following redirects (at most kMaxRedirects; never from https to
// http). The token goes only to the endpoint's own origin. A 2xx body goes
// to `sink` (false stops the transfer); the first 2xx/206 response's headers
// are offered to `on_response` first (false stops before the body).
Reply http_get(const HubOptions& opt, const std::string& url, const httplib::Headers& extra,
               const std::function<bool(const Reply&)>& on_response,
               const std::function<bool(const char*, size_t)>& sink) {
  Reply r;
  auto home = parse_url(base_of(opt));
  std::string current = url;
  for (int hop = 0; hop <= kMaxRedirects; hop++) {
    auto u = parse_url(current);
    if (!u) {
      r.error = httplib::Error::Unknown;
      r.error_body = u.status().message();
      return r;
    }
    httplib::Headers headers = extra;
    if (!opt.token.empty() && home && u->origin() == home->origin())
      headers.emplace("Authorization", "Bearer " + opt.token);
    headers.emplace("User-Agent", "PhaseLab (+phaselab-cli pull)");
    auto client = client_for(opt, *u);
    r = Reply{};
    r.url = current;
    bool body_to_sink = false;
    auto result = client->Get(
        u->target, headers,
        [&](const httplib::Response& res) {
          r.status = res.status;
          r.headers = res.headers;
          body_to_sink = res.status >= 200 && res.status < 300;
          if (body_to_sink && on_response && !on_response(r)) {
            r.stopped_by_us = true;
            return false;
          }
          return true;
        },
        [&](const char* data, size_t n) {
          if (!body_to_sink) {
            if (r.error_body.size() < kMaxErrorBody) r.error_body.append(data, std::min(n, kMaxErrorBody - r.error_body.size()));
            return true;
          }
          if (!sink(data, n)) {
            r.stopped_by_us = true;
            return false;
          }
          return true;
        });
    r.error = result.error();
    if (result && r.status == 0) {
      r.status = result->status;
      r.headers = result->headers;
    }
    if (r.status >= 300 && r.status < 400 && r.status != 304) {
      std::string loc = r.header("Location");
      if (loc.empty()) return r;
      if (loc.front() == '/') loc = u->origin() + loc;  // relative to this host
      auto next = parse_url(loc);
      if (!next) {
        r.error = httplib::Error::Unknown;
        r.error_body = "redirected to '" + loc + "', which is not an http(s) URL";
        return r;
      }
      if (u->scheme == "https" && next->scheme == "http") {
        r.error = httplib::Error::Unknown;
        r.error_body = "refused a redirect from https to plain http (" + next->origin() + ")";
        return r;
      }
      current = loc;
      continue;
    }
    return r;
  }
  r.error = httplib::Error::Unknown;
  r.error_body = "more than " + std::to_string(kMaxRedirects) + " redirects";
  return r;
}

std::string host_of(const std::string& url) {
  auto u = parse_url(url);
  return u ? u->host : url;
}

// The server's own words for a failed request: the X-Error-Message header,
// or the "error" field of a JSON body, or the body's first line.
std::string server_words(const Reply& r) {
  std::string s = r.header("X-Error-Message");
  if (s.empty() && !r.error_body.empty()) {
    auto j = json::parse(r.error_body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) s = j["error"].get<std::string>();
    else if (!j.is_discarded()) s = "";
    else s = r.error_body.substr(0, std::min<size_t>(r.error_body.find('\n'), 200));
  }
  return s.empty() ? "" : " (\"" + s.substr(0, 300) + "\")";
}

int retry_after_s(const Reply& r) {
  const std::string v = r.header("Retry-After");
  if (v.empty()) return 1;
  char* end = nullptr;
  const long s = std::strtol(v.c_str(), &end, 10);
  return end && *end == '\0' && s >= 0 ? static_cast<int>(std::min<long>(s, 86400)) : 5;
}

// Whether another attempt can help: the network, a rate limit, a server error.
bool transient(const Reply& r) {
  if (r.stopped_by_us) return false;
  // A certificate that does not verify, or an address that is not one, will
  // not change on a retry.
  if (r.error == httplib::Error::SSLServerVerification || r.error == httplib::Error::SSLConnection ||
      (r.error == httplib::Error::Unknown && !r.error_body.empty()))
    return false;
  if (r.error != httplib::Error::Success && r.error != httplib::Error::Canceled && r.status == 0) return true;
  if (r.error == httplib::Error::Read || r.error == httplib::Error::Write) return true;  // mid-body
  return r.status == 429 || r.status >= 500;
}

// A failed request as a message that says what to do. `what` names the
// thing asked for ("repository x", "file y of x").
Status failure(const HubOptions& opt, const Reply& r, const std::string& what, const std::string& repo) {
  const std::string host = host_of(r.url.empty() ? base_of(opt) : r.url);
  const std::string base = base_of(opt);
  if (r.status == 0 || (r.error != httplib::Error::Success && r.error != httplib::Error::Canceled && r.status < 300)) {
    if (r.error == httplib::Error::SSLServerVerification)
      return io_error("the TLS certificate of " + host +
                      " could not be verified: is the system's ca-certificates package installed, or is a proxy "
                      "intercepting the connection?");
    if (r.error == httplib::Error::Read && r.status != 0)
      return io_error("the transfer of " + what + " from " + host + " was interrupted or stalled (no data for " +
                      std::to_string(opt.stall_timeout_s) + " s): try again to resume (the bytes so far are kept)");
    std::string err = r.error == httplib::Error::Unknown && !r.error_body.empty() ? r.error_body
                                                                                   : httplib::to_string(r.error);
    return io_error("cannot reach " + host + " (" + err +
                    "): is this machine offline? HF_ENDPOINT can name a mirror of Hugging Face; a GGUF file copied "
                    "into the model folder works without a download");
  }
  const std::string words = server_words(r);
  // Hugging Face names the reason (X-Error-Code): a repository that does not
  // exist answers 401 to a request without a token.
  const std::string code = r.header("X-Error-Code");
  if (code == "RepoNotFound" || code == "EntryNotFound" || code == "RevisionNotFound")
    return io_error(what + " was not found at " + host + " (HTTP " + std::to_string(r.status) + words +
                    "): check the name (phaselab-cli pull --search TEXT lists repositories; pull REPO --list its "
                    "files); a private repository is not found without its token either");
  // The CDN a download was redirected to gets no token: its refusal is about
  // the signed link, not about the user's access.
  auto home = parse_url(base);
  auto at = parse_url(r.url);
  if ((r.status == 401 || r.status == 403) && home && at && at->origin() != home->origin())
    return io_error("the download server " + host + " refused the signed link for " + what + " (HTTP " +
                    std::to_string(r.status) + words + "): try again (a new link is made each time)");
  switch (r.status) {
    case 401:
      if (!opt.token.empty())
        return io_error(host + " refused the token for " + what + " (HTTP 401" + words +
                        "): it is invalid or expired; make a new one at " + base + "/settings/tokens");
      return io_error(what + " needs a Hugging Face token (HTTP 401" + words +
                      "): the repository is gated or private. Set HF_TOKEN=hf_... (or enter one under Get Models > "
                      "Token…); make one at " +
                      base + "/settings/tokens");
    case 403:
      return io_error("access to " + what + " is refused for this token (HTTP 403" + words +
                      "): accept the model's terms at " + base + "/" + repo +
                      " while signed in, or use a token with read access");
    case 404:
      return io_error(what + " was not found at " + host + " (HTTP 404" + words +
                      "): check the name (phaselab-cli pull --search TEXT lists repositories; pull REPO --list its "
                      "files); a private repository also answers 404 without its token");
    case 416:
      return io_error(host + " refused the byte range asked for " + what + " (HTTP 416)" + words +
                      ": the partial file does not match; delete it and download again");
    case 429:
      return io_error(host + " is rate-limiting requests (HTTP 429" + words + "): wait " +
                      std::to_string(retry_after_s(r)) +
                      " s and try again; a Hugging Face token (HF_TOKEN) raises the limit");
    default:
      break;
  }
  if (r.status >= 500)
    return io_error(host + " answered HTTP " + std::to_string(r.status) + words + " for " + what +
                    ": the service has a problem; try again later");
  return io_error(host + " answered HTTP " + std::to_string(r.status) + words + " for " + what);
}

// Sleeps before another attempt, in slices, so that a pause or cancel (or
// the options' stop flag) ends the wait at once.
void wait_before_retry(const HubOptions& opt, const Reply& r, int attempt, const DownloadControl* control = nullptr) {
  int s = r.status == 429 ? retry_after_s(r) : std::min(1 << attempt, 8) / 2;
  s = std::min(s, opt.max_retry_wait_s);
  const auto until = Clock::now() + std::chrono::milliseconds(s * 1000 + (r.status == 429 && s == 0 ? 50 : 0));
  while (Clock::now() < until) {
    if (control && control->stop_requested()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// GET a JSON document from the API, with retries; `next` receives the URL of
// the next page when a Link: <...>; rel="next" header is present.
Result<json> get_json(const HubOptions& opt, const std::string& target, const std::string& what,
                      const std::string& repo, std::string* next = nullptr) {
  const std::string url = target.rfind("http", 0) == 0 ? target : base_of(opt) + target;
  Reply r;
  std::string body;
  for (int attempt = 0;; attempt++) {
    body.clear();
    bool too_big = false;
    r = http_get(opt, url, {{"Accept", "application/json"}}, nullptr, [&](const char* d, size_t n) {
      if (body.size() + n > opt.max_json_bytes) {
        too_big = true;
        return false;
      }
      body.append(d, n);
      return true;
    });
    if (too_big)
      return io_error(host_of(url) + " sent more than " + format_bytes(opt.max_json_bytes) + " for " + what +
                      ": refused (is HF_ENDPOINT a Hugging Face API?)");
    if (r.status >= 200 && r.status < 300 && r.error == httplib::Error::Success) break;
    if (!transient(r) || attempt >= opt.max_retries ||
        (r.status == 429 && retry_after_s(r) > opt.max_retry_wait_s))
      return failure(opt, r, what, repo);
    wait_before_retry(opt, r, attempt);
  }
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded())
    return io_error(host_of(url) + " answered " + what + " with something that is not JSON: is HF_ENDPOINT (" +
                    base_of(opt) + ") a Hugging Face API?");
  if (next) {
    next->clear();
    static const std::regex link(R"(<([^>]+)>\s*;\s*rel="?next"?)");
    std::smatch m;
    const std::string l = r.header("Link");
    if (std::regex_search(l, m, link)) *next = m[1];
  }
  return j;
}

std::string json_string(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}
int64_t json_int(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : 0;
}
// "gated": false | "auto" | "manual" (true is read as "manual").
std::string json_gated(const json& j) {
  auto it = j.find("gated");
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_boolean() && it->get<bool>()) return "manual";
  return "";
}
std::string license_from_tags(const json& j) {
  auto it = j.find("tags");
  if (it == j.end() || !it->is_array()) return "";
  for (const auto& t : *it)
    if (t.is_string() && t.get<std::string>().rfind("license:", 0) == 0) return t.get<std::string>().substr(8);
  return "";
}

// ---- GGUF names -----------------------------------------------------------

std::string quant_of(const std::string& file_name) {
  static const std::regex re(
      R"((?:^|[-_.])((?:IQ[1-4]_(?:XXS|XS|NL|S|M))|(?:Q[2-8]_K(?:_(?:XXL|XL|S|M|L))?)|(?:Q[4-8]_[01])|(?:TQ[12]_0)|BF16|F16|F32|MXFP4(?:_MOE)?)(?=[-_.]|$))");
  std::smatch m;
  const std::string u = upper(file_name);
  return std::regex_search(u, m, re) ? std::string(m[1]) : "";
}

struct SplitName {
  std::string stem;  // path without "-0000i-of-0000n.gguf"
  int index = 0, count = 0;
};
bool split_name(const std::string& path, SplitName* out) {
  static const std::regex re(R"(^(.*)-([0-9]{5})-of-([0-9]{5})\.gguf$)", std::regex::icase);
  std::smatch m;
  if (!std::regex_match(path, m, re)) return false;
  out->stem = m[1];
  out->index = std::stoi(m[2]);
  out->count = std::stoi(m[3]);
  return out->index >= 1 && out->count >= 1 && out->index <= out->count;
}

// ---- files ------------------------------------------------------------------

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void reset() { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  void update(const void* d, size_t n) { EVP_DigestUpdate(ctx_, d, n); }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, md, &n);
    static const char* h = "0123456789abcdef";
    std::string s;
    for (unsigned i = 0; i < n; i++) {
      s += h[md[i] >> 4];
      s += h[md[i] & 15];
    }
    return s;
  }

 private:
  EVP_MD_CTX* ctx_;
};

uint64_t file_size_or_zero(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}
bool exists(const std::string& p) {
  struct stat st{};
  return ::lstat(p.c_str(), &st) == 0;
}

Status write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) return io_error("cannot write " + tmp + ": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return io_error("cannot rename " + tmp + ": " + std::strerror(errno));
  return Status::ok();
}

std::string now_iso8601() {
  const auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string source_note_path(const std::string& file) { return file + ".source.json"; }

// The checksum a file's source note records, "" when there is none.
std::string noted_sha256(const std::string& file) {
  std::ifstream f(source_note_path(file));
  if (!f) return "";
  auto j = json::parse(f, nullptr, false);
  return j.is_object() ? json_string(j, "sha256") : "";
}

// Throttled progress with a speed over the last few seconds.
class ProgressMeter {
 public:
  ProgressMeter(const std::function<void(const DownloadProgress&)>& cb, DownloadProgress p) : cb_(cb), p_(std::move(p)) {}
  DownloadProgress& state() { return p_; }
  void stage(const std::string& s) {
    p_.stage = s;
    emit(true);
  }
  void add(uint64_t n) {
    p_.done += n;
    emit(false);
  }
  void emit(bool force) {
    if (!cb_) return;
    const auto now = Clock::now();
    if (!force && now - last_emit_ < std::chrono::milliseconds(100)) return;
    last_emit_ = now;
    if (!samples_.empty() && p_.done < samples_.back().second) samples_.clear();  // started over
    samples_.emplace_back(now, p_.done);
    while (samples_.size() > 2 && now - samples_.front().first > std::chrono::seconds(3)) samples_.pop_front();
    const double dt = std::chrono::duration<double>(now - samples_.front().first).count();
    p_.bytes_per_s = dt > 0.2 ? (p_.done - samples_.front().second) / dt : p_.bytes_per_s;
    cb_(p_);
  }
  void restart_speed() { samples_.clear(); }

 private:
  const std::function<void(const DownloadProgress&)>& cb_;
  DownloadProgress p_;
  Clock::time_point last_emit_{};
  std::deque<std::pair<Clock::time_point, uint64_t>> samples_;
};

struct PartOutcome {
  bool stopped = false;  // paused or cancelled
  uint64_t transferred = 0;
};

// One part: resume or start its partial file, and verify it. The verified
// bytes stay under the partial name; download_model renames the parts once
// every one of them is verified. The partial file is locked (flock) while
// this runs, so that two downloads of one model (two windows, the window and
// the CLI) cannot write into the same file.
Result<PartOutcome> download_part(const HubOptions& opt, const RepoInfo& info, const RepoFile& f,
                                  const std::string& part, ProgressMeter& meter, DownloadControl* control) {
  PartOutcome out;
  const std::string what = "'" + f.path + "' of " + info.id;
  const std::string rev = info.commit.empty() ? info.revision : info.commit;
  const std::string url = base_of(opt) + "/" + info.id + "/resolve/" + encode(rev, false) + "/" + encode(f.path, true);
  auto stop = [&] { return control && control->stop_requested(); };

  const int fd = ::open(part.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot write " + part + ": " + std::strerror(errno) + " (is the model folder writable?)");
  std::unique_ptr<int, void (*)(int*)> guard(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0)
    return io_error(base_name(f.path) + " is being downloaded already (by another Get Models window or phaselab-cli "
                    "pull): wait for that download, or stop it");
  // A request refused before any byte (401, 403, 404, offline) leaves no
  // empty partial file behind (we hold its lock, so it is ours).
  auto fail = [&](Status st) -> Result<PartOutcome> {
    if (file_size_or_zero(part) == 0) std::remove(part.c_str());
    return st;
  };

  Sha256 sha;
  uint64_t have = file_size_or_zero(part);
  if (have > f.size) have = 0;  // not this file (the listing changed): start again
  if (have > 0) {  // the bytes already here count toward the checksum
    meter.stage("checking the partial file");
    std::vector<char> buf(1 << 20);
    uint64_t off = 0;
    while (off < have) {
      if (stop()) {
        out.stopped = true;
        return out;
      }
      const ssize_t n = ::pread(fd, buf.data(), static_cast<size_t>(std::min<uint64_t>(buf.size(), have - off)),
                                static_cast<off_t>(off));
      if (n <= 0) return io_error("cannot read the partial file " + part + ": " + std::strerror(errno));
      sha.update(buf.data(), static_cast<size_t>(n));
      off += static_cast<uint64_t>(n);
    }
  }
  meter.state().done += have;
  meter.restart_speed();

  for (int attempt = 0; have < f.size || (f.size == 0 && attempt == 0); attempt++) {
    meter.stage(have > 0 ? "resuming at " + format_bytes(have) : "downloading");
    if (::ftruncate(fd, static_cast<off_t>(have)) != 0 || ::lseek(fd, static_cast<off_t>(have), SEEK_SET) < 0)
      return io_error("cannot write " + part + ": " + std::strerror(errno));
    httplib::Headers h;
    if (have > 0) h.emplace("Range", "bytes=" + std::to_string(have) + "-");
    bool too_much = false, write_failed = false, bad_range = false;
    int write_errno = 0;
    const uint64_t start_have = have;
    Reply r = http_get(
        opt, url, h,
        [&](const Reply& resp) {
          if (stop()) return false;
          if (have > 0 && resp.status == 200) {  // the server ignored the range: start over
            if (::ftruncate(fd, 0) != 0 || ::lseek(fd, 0, SEEK_SET) < 0) return false;
            meter.state().done -= have;
            have = 0;
            sha.reset();
          } else if (resp.status == 206) {
            static const std::regex cr(R"(bytes\s+([0-9]{1,20})-)");
            std::smatch m;
            const std::string v = resp.header("Content-Range");
            uint64_t start = 0;
            const bool parsed = std::regex_search(v, m, cr) &&
                                std::from_chars(v.data() + m.position(1), v.data() + m.position(1) + m.length(1), start)
                                        .ec == std::errc();
            if (!parsed || start != have) {
              bad_range = true;
              return false;
            }
          }
          return true;
        },
        [&](const char* d, size_t n) {
          if (stop()) return false;
          if (n > f.size - have) {
            too_much = true;
            return false;
          }
          size_t off = 0;
          while (off < n) {
            const ssize_t w = ::write(fd, d + off, n - off);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
              write_failed = true;
              write_errno = errno;
              return false;
            }
            off += static_cast<size_t>(w);
          }
          sha.update(d, n);
          have += n;
          meter.add(n);
          return true;
        });
    if (have >= start_have) out.transferred += have - start_have;
    if (write_failed)
      return io_error("cannot write " + part + ": " + std::strerror(write_errno) + " (disk full?)");
    if (too_much) {
      std::remove(part.c_str());
      return io_error(host_of(r.url) + " sent more than the " + std::to_string(f.size) + " bytes listed for " + what +
                      ": refused and the partial file removed");
    }
    if (bad_range) {
      std::remove(part.c_str());
      return io_error(host_of(r.url) + " answered the range request for " + what +
                      " with other bytes (Content-Range '" + r.header("Content-Range") +
                      "'): the partial file was removed; try again");
    }
    if (stop()) {
      ::fdatasync(fd);
      out.stopped = true;
      return out;
    }
    if (r.status >= 200 && r.status < 300 && r.error == httplib::Error::Success && have == f.size) break;
    const bool short_body = r.status >= 200 && r.status < 300 && r.error == httplib::Error::Success && have < f.size;
    const bool progressed = have > start_have;
    if (!(short_body || transient(r)) || (r.status == 429 && retry_after_s(r) > opt.max_retry_wait_s))
      return fail(failure(opt, r, what, info.id));
    // An interrupted transfer that moved forward does not use up a retry.
    if (progressed) attempt = -1;
    if (attempt >= opt.max_retries) {
      if (short_body)
        return fail(io_error(host_of(r.url) + " ended the transfer of " + what + " at " + format_bytes(have) + " of " +
                             format_bytes(f.size) + "; the bytes are kept: try again to resume"));
      return fail(failure(opt, r, what, info.id)
                      .with_context("after " + std::to_string(opt.max_retries + 1) + " attempts; " +
                                    format_bytes(have) + " of " + format_bytes(f.size) + " kept for a resume"));
    }
    meter.stage(short_body ? "the transfer ended early; resuming"
                           : "retrying: " + failure(opt, r, what, info.id).message());
    if (!progressed) wait_before_retry(opt, r, attempt, control);
  }

  meter.stage("verifying");
  ::fdatasync(fd);
  if (!f.sha256.empty()) {
    const std::string got = sha.hex();
    if (lower(got) != lower(f.sha256)) {
      std::remove(part.c_str());
      return io_error("the checksum of " + what + " does not match: SHA-256 " + got + ", the repository lists " +
                      f.sha256 + ". The bytes were damaged (in transit, or in a partial file an earlier run left "
                      "after a crash) and were removed; download again");
    }
  }
  return out;
}

}  // namespace

// ---- public -----------------------------------------------------------------

HubOptions HubOptions::from_environment() {
  HubOptions o;
  if (const char* e = std::getenv("HF_ENDPOINT"); e && *e) o.endpoint = e;
  if (const char* t = std::getenv("HF_TOKEN"); t && *t) o.token = t;
  return o;
}

const char* to_string(SortBy s) {
  switch (s) {
    case SortBy::downloads: return "downloads";
    case SortBy::likes: return "likes";
    case SortBy::last_modified: return "lastModified";
  }
  return "downloads";
}

std::string format_bytes(uint64_t n) {
  char buf[32];
  if (n >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", n / double(1ull << 30));
  else if (n >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", n / double(1ull << 20));
  else if (n >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

uint64_t GgufChoice::total_size() const {
  uint64_t s = 0;
  for (const auto& p : parts) s += p.size;
  return s;
}

std::string GgufChoice::label() const {
  return parts.size() > 1 ? name + " (" + std::to_string(parts.size()) + " parts)" : name;
}

Result<std::vector<ModelSummary>> search_models(const HubOptions& opt, const std::string& text, SortBy sort,
                                                int limit) {
  if (limit < 1 || limit > 200) return invalid_argument("the number of results must be from 1 to 200");
  if (text.size() > 200) return invalid_argument("the search text is longer than 200 characters");
  std::string target = "/api/models?filter=gguf&sort=" + std::string(to_string(sort)) +
                       "&direction=-1&limit=" + std::to_string(limit);
  if (!text.empty()) target += "&search=" + encode(text, false);
  auto j = get_json(opt, target, "the search for '" + text + "'", "");
  if (!j) return j.status();
  if (!j->is_array()) return io_error(host_of(base_of(opt)) + " answered the search with something other than a list");
  std::vector<ModelSummary> out;
  for (const auto& m : *j) {
    if (!m.is_object()) continue;
    ModelSummary s;
    s.id = json_string(m, "id");
    if (s.id.empty()) s.id = json_string(m, "modelId");
    if (!valid_repo_id(s.id)) continue;
    s.downloads = json_int(m, "downloads");
    s.likes = json_int(m, "likes");
    s.last_modified = json_string(m, "lastModified");
    if (s.last_modified.empty()) s.last_modified = json_string(m, "createdAt");
    s.gated = json_gated(m);
    s.license = license_from_tags(m);
    out.push_back(std::move(s));
  }
  return out;
}

Result<RepoInfo> repo_info(const HubOptions& opt, const std::string& repo) {
  if (!valid_repo_id(repo))
    return invalid_argument("'" + repo + "' is not a repository name (expected owner/name, e.g. unsloth/gemma-3-270m-it-GGUF)");
  RepoInfo info;
  info.id = repo;
  auto meta = get_json(opt, "/api/models/" + repo, "repository " + repo, repo);
  if (!meta) return meta.status();
  if (!meta->is_object()) return io_error("the description of " + repo + " is not a JSON object");
  info.commit = json_string(*meta, "sha");
  if (!std::regex_match(info.commit, std::regex("^[0-9a-f]{40}$"))) info.commit.clear();
  info.gated = json_gated(*meta);
  if (auto cd = meta->find("cardData"); cd != meta->end() && cd->is_object()) {
    auto lic = cd->find("license");
    if (lic != cd->end() && lic->is_string()) info.license = lic->get<std::string>();
    else if (lic != cd->end() && lic->is_array() && !lic->empty() && (*lic)[0].is_string())
      info.license = (*lic)[0].get<std::string>();
    if (info.license == "other") {
      const std::string name = json_string(*cd, "license_name");
      if (!name.empty()) info.license = "other (" + name + ")";
    }
  }
  if (info.license.empty()) info.license = license_from_tags(*meta);

  // Every file of the revision, page after page.
  std::vector<RepoFile> files;
  std::string next = "/api/models/" + repo + "/tree/" + encode(info.commit.empty() ? info.revision : info.commit, false) +
                     "?recursive=true";
  for (int page = 0; !next.empty(); page++) {
    if (page >= 100) return io_error("the file list of " + repo + " has more than 100 pages: refused");
    auto tree = get_json(opt, next, "the file list of " + repo, repo, &next);
    if (!tree) return tree.status();
    if (!tree->is_array()) return io_error("the file list of " + repo + " is not a JSON list");
    for (const auto& e : *tree) {
      if (!e.is_object() || json_string(e, "type") != "file") continue;
      RepoFile f;
      f.path = json_string(e, "path");
      if (!safe_repo_path(f.path)) continue;
      if (lower(f.path).size() < 5 || lower(f.path).substr(f.path.size() - 5) != ".gguf") continue;
      f.size = static_cast<uint64_t>(std::max<int64_t>(0, json_int(e, "size")));
      if (auto lfs = e.find("lfs"); lfs != e.end() && lfs->is_object()) {
        f.sha256 = lower(json_string(*lfs, "oid"));
        if (const int64_t s = json_int(*lfs, "size"); s > 0) f.size = static_cast<uint64_t>(s);
        if (!std::regex_match(f.sha256, std::regex("^[0-9a-f]{64}$"))) f.sha256.clear();
      }
      // Sizes a disk can hold (a PiB): sums of at most kMaxFiles stay in 64 bits.
      if (f.size > kMaxFileBytes) continue;
      if (files.size() >= kMaxFiles)
        return io_error("the file list of " + repo + " has more than " + std::to_string(kMaxFiles) +
                        " GGUF files: refused (is HF_ENDPOINT a Hugging Face API?)");
      files.push_back(std::move(f));
    }
  }

  // Split files are one model; a split with parts missing is left out.
  std::map<std::string, std::vector<RepoFile>> splits;
  std::map<std::string, int> split_count;
  for (auto& f : files) {
    SplitName sn;
    if (split_name(f.path, &sn)) {
      const std::string key = sn.stem + "|" + std::to_string(sn.count);
      splits[key].push_back(f);
      split_count[key] = sn.count;
    } else {
      GgufChoice c;
      c.name = base_name(f.path);
      c.quant = quant_of(c.name);
      c.parts.push_back(f);
      info.models.push_back(std::move(c));
    }
  }
  for (auto& [key, parts] : splits) {
    std::sort(parts.begin(), parts.end(), [](const RepoFile& a, const RepoFile& b) { return a.path < b.path; });
    if (static_cast<int>(parts.size()) != split_count[key]) continue;
    GgufChoice c;
    c.name = base_name(parts.front().path);
    c.quant = quant_of(parts.front().path);
    c.parts = std::move(parts);
    info.models.push_back(std::move(c));
  }
  std::sort(info.models.begin(), info.models.end(), [](const GgufChoice& a, const GgufChoice& b) {
    return a.parts.front().path < b.parts.front().path;
  });
  return info;
}

Result<PullSpec> parse_pull_spec(const std::string& text_in) {
  std::string text = text_in;
  for (const char* prefix : {"https://huggingface.co/", "http://huggingface.co/", "hf.co/", "huggingface.co/"})
    if (text.rfind(prefix, 0) == 0) text = text.substr(std::strlen(prefix));
  PullSpec s;
  const auto colon = text.find(':');
  s.repo = text.substr(0, colon);
  if (colon != std::string::npos) s.selector = text.substr(colon + 1);
  // ".../blob/main/file.gguf" or ".../resolve/main/file.gguf" from a copied link.
  static const std::regex link(R"(^([^/]+/[^/]+)/(?:blob|resolve|tree)/[^/]+/(.+)$)");
  std::smatch m;
  if (s.selector.empty() && std::regex_match(s.repo, m, link)) {
    s.selector = m[2];
    s.repo = m[1];
  }
  if (!valid_repo_id(s.repo))
    return invalid_argument("'" + text_in +
                            "' does not name a repository: expected OWNER/NAME[:QUANT|:FILE], e.g. "
                            "unsloth/gemma-3-270m-it-GGUF:Q4_K_M");
  if (s.selector.size() > 1024) return invalid_argument("the file name is too long");
  return s;
}

Result<GgufChoice> choose_model(const RepoInfo& info, const std::string& selector) {
  auto listing = [&] {
    std::string s;
    for (const auto& m : info.models)
      s += "\n  " + m.label() + "  " + (m.quant.empty() ? "" : m.quant + "  ") + format_bytes(m.total_size());
    return s;
  };
  if (info.models.empty()) return unsupported(info.id + " has no GGUF files (PhaseLab reads GGUF; look for a -GGUF repository)");
  if (selector.empty()) {
    if (info.models.size() == 1) return info.models.front();
    std::vector<const GgufChoice*> q4;
    for (const auto& m : info.models)
      if (m.quant == "Q4_K_M") q4.push_back(&m);
    if (q4.size() == 1) return *q4.front();
    return invalid_argument(info.id + " has " + std::to_string(info.models.size()) +
                            " GGUF models; name one as " + info.id + ":QUANT or " + info.id + ":FILE:" + listing());
  }
  std::vector<const GgufChoice*> hits;
  for (const auto& m : info.models) {
    bool hit = lower(m.quant) == lower(selector);
    for (const auto& p : m.parts) hit = hit || p.path == selector || base_name(p.path) == selector;
    if (hit) hits.push_back(&m);
  }
  if (hits.size() == 1) return *hits.front();
  if (hits.empty()) return invalid_argument("'" + selector + "' is not a quantization or file of " + info.id + ":" + listing());
  std::string s;
  for (auto* h : hits) s += "\n  " + h->label();
  return invalid_argument("'" + selector + "' matches " + std::to_string(hits.size()) + " models of " + info.id +
                          "; name the file:" + s);
}

FitEstimate estimate_fit_from_header(const std::vector<uint8_t>& header, uint64_t file_size, uint64_t total_size,
                                     int n_ctx) {
  FitEstimate e;
  e.available = available_memory_bytes();
  e.need.weights = total_size;
  e.n_ctx = n_ctx;
  auto f = GgufFile::header_from_bytes(header, file_size, "the model's header");
  if (!f) {
    e.note = "the header could not be read: " + f.status().message();
    return e;
  }
  if (auto a = (*f)->get_string("general.architecture")) e.architecture = std::string(*a);
  auto c = ModelConfig::from_gguf(**f);
  if (!c) {
    e.note = c.status().message();
    // The message names "the model's header:"; the reason is what matters.
    if (const auto p = e.note.find(": "); p != std::string::npos) e.note = e.note.substr(p + 2);
    return e;
  }
  e.supported = true;
  auto ctx = resolve_context(*c, n_ctx);
  if (!ctx) {
    e.note = ctx.status().message() + "; estimated for " + std::to_string(c->n_ctx_train);
    ctx = c->n_ctx_train;
  }
  e.n_ctx = *ctx;
  // Weights as Model::weight_bytes counts them: every tensor, the embedding
  // table one row only when a separate output matrix exists (it is looked up,
  // not read whole). A split model's other parts are counted by their size.
  uint64_t weights = 0;
  for (const auto& t : (*f)->tensors()) weights += t.n_bytes;
  const auto* embd = (*f)->find_tensor("token_embd.weight");
  if (embd && (*f)->find_tensor("output.weight") && embd->ne[1] > 0)
    weights -= embd->n_bytes - embd->n_bytes / static_cast<uint64_t>(embd->ne[1]);
  if (total_size > file_size) weights += total_size - file_size;
  const uint64_t kv = KvCache::bytes_for(*c, e.n_ctx, KvType::f16, kPassTokens, KvStorage::host, true);
  e.need = engine_memory_need(*c, weights, kv, kPassTokens, 1);
  return e;
}

Result<FitEstimate> estimate_fit(const HubOptions& opt, const RepoInfo& info, const GgufChoice& model, int n_ctx) {
  if (model.parts.empty()) return invalid_argument("no file to estimate");
  const RepoFile& first = model.parts.front();
  const std::string rev = info.commit.empty() ? info.revision : info.commit;
  const std::string url =
      base_of(opt) + "/" + info.id + "/resolve/" + encode(rev, false) + "/" + encode(first.path, true);
  FitEstimate e;
  for (uint64_t want = std::min(kHeaderFirstRead, first.size);; want = std::min(want * 4, first.size)) {
    std::vector<uint8_t> bytes;
    Reply r;
    for (int attempt = 0;; attempt++) {
      bytes.clear();
      r = http_get(opt, url, {{"Range", "bytes=0-" + std::to_string(want - 1)}}, nullptr, [&](const char* d, size_t n) {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(n, want - bytes.size()));
        bytes.insert(bytes.end(), d, d + take);
        return bytes.size() < want;  // a server that ignores the range is stopped here
      });
      const bool ok = r.status >= 200 && r.status < 300 && (r.error == httplib::Error::Success || r.stopped_by_us);
      if (ok) break;
      if (!transient(r) || attempt >= opt.max_retries ||
          (r.status == 429 && retry_after_s(r) > opt.max_retry_wait_s))
        return failure(opt, r, "'" + first.path + "' of " + info.id, info.id);
      wait_before_retry(opt, r, attempt);
    }
    e = estimate_fit_from_header(bytes, first.size, model.total_size(), n_ctx);
    // A header longer than what was read (a large vocabulary): read more.
    const bool header_unread = e.architecture.empty() && e.note.rfind("the header could not be read", 0) == 0;
    if (!header_unread || want >= first.size) return e;
    if (want >= kHeaderMaxRead) {
      e.note = "the header is larger than " + format_bytes(kHeaderMaxRead) + "; the estimate counts the file only";
      return e;
    }
  }
}

std::string partial_path(const std::string& model_dir, const RepoFile& f) {
  const std::string tag = f.sha256.empty() ? std::to_string(f.size) : f.sha256.substr(0, 12);
  return model_dir + "/" + base_name(f.path) + "." + tag + ".part";
}

Result<DownloadResult> download_model(const HubOptions& opt, const RepoInfo& info, const GgufChoice& model,
                                      const std::string& model_dir,
                                      const std::function<void(const DownloadProgress&)>& on_progress,
                                      DownloadControl* control) {
  DownloadResult res;
  const auto t0 = Clock::now();
  if (model.parts.empty()) return invalid_argument("nothing to download");
  std::error_code ec;
  fs::create_directories(model_dir, ec);
  if (ec) return io_error("cannot make the model folder " + model_dir + ": " + ec.message());

  // What is already there, and what must come.
  std::vector<std::string> finals, parts;
  uint64_t needed = 0, present = 0;
  bool all_present = true;
  for (const auto& p : model.parts) {
    if (!safe_repo_path(p.path)) return invalid_argument("refusing the file name '" + p.path + "'");
    const std::string fin = model_dir + "/" + base_name(p.path);
    finals.push_back(fin);
    parts.push_back(partial_path(model_dir, p));
    if (exists(fin)) {
      // The same file from an earlier download: its note names this checksum
      // (or, where none is listed, this repository path and size).
      const std::string noted = noted_sha256(fin);
      const bool same = file_size_or_zero(fin) == p.size &&
                        (p.sha256.empty() ? exists(source_note_path(fin)) : noted == p.sha256);
      if (same) {
        present += p.size;
        continue;
      }
      return io_error("a different file named " + base_name(p.path) + " is already in the model folder (" + model_dir +
                      "): move or rename it, then download again");
    }
    all_present = false;
    needed += p.size - std::min(file_size_or_zero(parts.back()), p.size);
  }
  if (all_present) {
    res.paths = finals;
    res.already_present = true;
    return res;
  }
  struct statvfs vfs{};
  if (::statvfs(model_dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (needed > free_bytes)
      return io_error("the download needs " + format_bytes(needed) + " but the disk of " + model_dir + " has " +
                      format_bytes(free_bytes) + " free: free some space or choose another folder (--dir, or "
                      "PHASELAB_MODEL_DIR)");
  }

  DownloadProgress p0;
  p0.n_parts = static_cast<int>(model.parts.size());
  p0.total = model.total_size();
  p0.done = present;
  ProgressMeter meter(on_progress, p0);
  for (size_t i = 0; i < model.parts.size(); i++) {
    const RepoFile& f = model.parts[i];
    meter.state().part = static_cast<int>(i) + 1;
    meter.state().file = base_name(f.path);
    if (exists(finals[i])) continue;  // noted as the same file above
    if (f.sha256.empty()) res.verified = false;
    auto out = download_part(opt, info, f, parts[i], meter, control);
    if (!out) return out.status();
    res.bytes_transferred += out->transferred;
    if (out->stopped) {
      res.cancelled = control->cancelled();
      res.paused = !res.cancelled;
      if (res.cancelled)  // every partial file of the model, verified ones too
        for (const auto& part : parts) std::remove(part.c_str());
      res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      meter.stage(res.cancelled ? "cancelled" : "paused");
      return res;
    }
  }

  // Every part verified: the notes first (a note without its file is
  // harmless; a file without its note would look like someone else's), then
  // the renames, the first part last, so that a model file's name appears
  // only when the whole model is there.
  for (size_t i = 0; i < model.parts.size(); i++) {
    if (exists(finals[i])) continue;
    const RepoFile& f = model.parts[i];
    const std::string commit = info.commit.empty() ? info.revision : info.commit;
    json note = {{"repo", info.id},        {"revision", info.revision},
                 {"commit", info.commit},  {"path", f.path},
                 {"url", base_of(opt) + "/" + info.id + "/blob/" + commit + "/" + f.path},
                 {"size", f.size},         {"sha256", f.sha256},
                 {"license", info.license}, {"downloaded", now_iso8601()}};
    PHASELAB_TRY(write_text_atomically(source_note_path(finals[i]), note.dump(2) + "\n"));
  }
  for (size_t k = model.parts.size(); k-- > 0;) {
    if (exists(finals[k])) continue;
    if (std::rename(parts[k].c_str(), finals[k].c_str()) != 0)
      return io_error("cannot rename " + parts[k] + " to " + finals[k] + ": " + std::strerror(errno));
  }
  meter.stage("done");
  res.paths = finals;
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

}  // namespace phaselab::hub
