#include "hub/fake_hub.h"

#include <openssl/evp.h>

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "phaselab/gguf.h"

namespace phaselab::test {

using json = nlohmann::json;

namespace {

constexpr const char* kOwner = "phaselab-test";

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A fixed commit id per repository (40 hex digits).
std::string commit_of(const std::string& repo) {
  return FakeHub::sha256_hex(reinterpret_cast<const uint8_t*>(repo.data()), repo.size()).substr(0, 40);
}

std::vector<uint8_t> moe_header() {
  GgufWriter w;
  w.set("general.architecture", GgufWriteValue::string("deepseek2"));
  w.set("general.name", GgufWriteValue::string("a mixture-of-experts header"));
  w.set("deepseek2.block_count", GgufWriteValue::u32(4));
  w.set("deepseek2.expert_count", GgufWriteValue::u32(8));
  return w.serialize();
}

// Hugging Face's 404: the reason's code and words in headers, the words in JSON.
void not_found(httplib::Response& res, const std::string& code, const std::string& message) {
  res.status = 404;
  res.set_header("X-Error-Code", code);
  res.set_header("X-Error-Message", message);
  res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
}

}  // namespace

std::string FakeHub::sha256_hex(const uint8_t* data, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr);
  static const char* h = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; i++) {
    s += h[md[i] >> 4];
    s += h[md[i] & 15];
  }
  return s;
}

FakeHub::FakeHub(const std::string& gguf_path) {
  std::ifstream f(gguf_path, std::ios::binary);
  if (!f) throw std::runtime_error("FakeHub: cannot read " + gguf_path);
  bytes_.assign(std::istreambuf_iterator<char>(f), {});
  build_repos();
  api_ = std::make_unique<httplib::Server>();
  cdn_ = std::make_unique<httplib::Server>();
  route_api();
  route_cdn();
  api_port_ = api_->bind_to_any_port("127.0.0.1");
  cdn_port_ = cdn_->bind_to_any_port("127.0.0.1");
  if (api_port_ <= 0 || cdn_port_ <= 0) throw std::runtime_error("FakeHub: cannot bind to loopback");
  api_thread_ = std::thread([this] { api_->listen_after_bind(); });
  cdn_thread_ = std::thread([this] { cdn_->listen_after_bind(); });
  while (!api_->is_running() || !cdn_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

FakeHub::~FakeHub() {
  api_->stop();
  cdn_->stop();
  if (api_thread_.joinable()) api_thread_.join();
  if (cdn_thread_.joinable()) cdn_thread_.join();
}

std::string FakeHub::endpoint() const { return "http://127.0.0.1:" + std::to_string(api_port_); }
std::string FakeHub::cdn_origin() const { return "http://localhost:" + std::to_string(cdn_port_); }

void FakeHub::build_repos() {
  auto blob_of = [](std::vector<uint8_t> data) {
    auto b = std::make_shared<Blob>();
    b->sha256 = sha256_hex(data.data(), data.size());
    b->listed_sha256 = b->sha256;
    b->listed_size = data.size();
    b->data = std::move(data);
    return b;
  };
  auto model = blob_of(bytes_);
  {
    Repo r;
    r.license = "mit";
    r.downloads = 12345;
    r.likes = 67;
    r.files["stories260K-Q8_0.gguf"] = model;
    r.files["stories260K-F32.gguf"] = model;
    const std::string readme = "# stories260K\nA tiny model for tests.\n";
    r.files["README.md"] = blob_of(std::vector<uint8_t>(readme.begin(), readme.end()));
    r.hostile_paths = {"../evil.gguf", "sub/../../x.gguf", ".hidden.gguf"};
    repos_[std::string(kOwner) + "/stories260K-GGUF"] = r;
  }
  {
    Repo r;
    r.gated = "manual";
    r.license = "gemma";
    r.downloads = 999;
    r.likes = 5;
    r.files["gated-Q4_K_M.gguf"] = model;
    repos_[std::string(kOwner) + "/gated-GGUF"] = r;
  }
  {
    Repo r;
    r.license = "apache-2.0";
    r.downloads = 500;
    r.likes = 50;
    const size_t half = bytes_.size() / 2;
    r.files["Q8_0/split-Q8_0-00001-of-00002.gguf"] = blob_of({bytes_.begin(), bytes_.begin() + half});
    r.files["Q8_0/split-Q8_0-00002-of-00002.gguf"] = blob_of({bytes_.begin() + half, bytes_.end()});
    repos_[std::string(kOwner) + "/split-GGUF"] = r;
  }
  {
    Repo r;
    r.downloads = 10;
    auto b = std::make_shared<Blob>(*model);
    const std::string other = "not these bytes";
    b->listed_sha256 = sha256_hex(reinterpret_cast<const uint8_t*>(other.data()), other.size());
    r.files["bad-Q8_0.gguf"] = b;
    repos_[std::string(kOwner) + "/bad-checksum-GGUF"] = r;
  }
  {
    Repo r;
    r.downloads = 9;
    auto b = std::make_shared<Blob>(*model);
    b->data.insert(b->data.end(), 4096, 0);  // more than listed
    r.files["oversize-Q8_0.gguf"] = b;
    repos_[std::string(kOwner) + "/oversize-GGUF"] = r;
  }
  {
    Repo r;
    r.license = "apache-2.0";
    r.downloads = 8;
    r.files["moe-Q4_K_M.gguf"] = blob_of(moe_header());
    repos_[std::string(kOwner) + "/moe-GGUF"] = r;
  }
}

void FakeHub::route_api() {
  auto summary = [](const std::string& id, const Repo& r) {
    json tags = json::array({"gguf"});
    if (!r.license.empty()) tags.push_back("license:" + r.license);
    json j = {{"_id", commit_of(id).substr(0, 24)},
              {"id", id},
              {"modelId", id},
              {"likes", r.likes},
              {"downloads", r.downloads},
              {"tags", tags},
              {"private", false},
              {"createdAt", "2026-11-01T12:00:00.000Z"},
              {"lastModified", "2026-11-20T08:30:00.000Z"}};
    if (!r.gated.empty()) j["gated"] = r.gated;
    return j;
  };
  api_->Get("/api/models", [this, summary](const httplib::Request& req, httplib::Response& res) {
    api_requests_++;
    const std::string q = lower(req.get_param_value("search"));
    const std::string sort = req.get_param_value("sort");
    std::vector<std::pair<std::string, const Repo*>> hits;
    for (const auto& [id, r] : repos_)
      if (q.empty() || lower(id).find(q) != std::string::npos) hits.emplace_back(id, &r);
    std::sort(hits.begin(), hits.end(), [&](const auto& a, const auto& b) {
      return sort == "likes" ? a.second->likes > b.second->likes : a.second->downloads > b.second->downloads;
    });
    size_t limit = 30;
    if (req.has_param("limit")) limit = std::stoul(req.get_param_value("limit"));
    json out = json::array();
    for (size_t i = 0; i < hits.size() && i < limit; i++) out.push_back(summary(hits[i].first, *hits[i].second));
    res.set_content(out.dump(), "application/json");
  });
  api_->Get(R"(/api/models/([^/]+/[^/]+)/tree/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    api_requests_++;
    const std::string id = req.matches[1];
    auto it = repos_.find(id);
    if (it == repos_.end()) {
      not_found(res, "RepoNotFound", "Repository not found");
      return;
    }
    json out = json::array();
    out.push_back({{"type", "directory"}, {"oid", commit_of(id + "/dir")}, {"size", 0}, {"path", "Q8_0"}});
    for (const auto& [path, b] : it->second.files) {
      json e = {{"type", "file"}, {"oid", commit_of(path)}, {"size", b->listed_size}, {"path", path}};
      if (path.size() > 5 && path.substr(path.size() - 5) == ".gguf")
        e["lfs"] = {{"oid", b->listed_sha256}, {"size", b->listed_size}, {"pointerSize", 135}};
      out.push_back(e);
    }
    for (const auto& p : it->second.hostile_paths)
      out.push_back({{"type", "file"},
                     {"oid", commit_of(p)},
                     {"size", bytes_.size()},
                     {"path", p},
                     {"lfs", {{"oid", sha256_hex(bytes_.data(), bytes_.size())}, {"size", bytes_.size()}}}});
    res.set_content(out.dump(), "application/json");
  });
  api_->Get(R"(/api/models/([^/]+/[^/]+))", [this, summary](const httplib::Request& req, httplib::Response& res) {
    api_requests_++;
    const std::string id = req.matches[1];
    auto it = repos_.find(id);
    if (it == repos_.end()) {
      not_found(res, "RepoNotFound", "Repository not found");
      return;
    }
    json j = summary(id, it->second);
    j["sha"] = commit_of(id);
    j["gated"] = it->second.gated.empty() ? json(false) : json(it->second.gated);
    j["cardData"] = it->second.license.empty() ? json::object() : json{{"license", it->second.license}};
    json sib = json::array();
    for (const auto& [path, b] : it->second.files) sib.push_back({{"rfilename", path}});
    j["siblings"] = sib;
    res.set_content(j.dump(), "application/json");
  });
  api_->Get(R"(/([^/]+/[^/]+)/resolve/([^/]+)/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    api_requests_++;
    const std::string id = req.matches[1], path = req.matches[3];
    auto it = repos_.find(id);
    if (it == repos_.end() || !it->second.files.count(path)) {
      not_found(res, "EntryNotFound", "Entry not found");
      return;
    }
    if (!it->second.gated.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      if (auth.empty()) {
        res.status = 401;
        res.set_header("X-Error-Message", "Access to model " + id + " is restricted. You must have access to it and be authenticated to access it. Please log in.");
        res.set_content(R"({"error":"Access restricted"})", "application/json");
        return;
      }
      if (auth != std::string("Bearer ") + kToken) {
        res.status = 403;
        res.set_header("X-Error-Message", "Access to model " + id + " is restricted and you are not in the authorized list.");
        res.set_content(R"({"error":"Forbidden"})", "application/json");
        return;
      }
    }
    if (rate_limit_left_.fetch_sub(1) > 0) {
      res.status = 429;
      res.set_header("Retry-After", std::to_string(retry_after_s_.load()));
      res.set_content(R"({"error":"Too many requests"})", "application/json");
      return;
    }
    rate_limit_left_ = std::max(0, rate_limit_left_.load());
    res.status = 302;
    res.set_header("Location", cdn_origin() + "/cdn/" + id + "/" + path + "?X-Signature=fake");
  });
}

void FakeHub::route_cdn() {
  cdn_->Get(R"(/cdn/([^/]+/[^/]+)/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    cdn_requests_++;
    if (req.has_header("Authorization")) cdn_auth_++;
    if (req.has_header("Range")) range_requests_++;
    auto it = repos_.find(req.matches[1]);
    if (it == repos_.end() || !it->second.files.count(req.matches[2])) {
      res.status = 404;
      return;
    }
    std::shared_ptr<Blob> blob = it->second.files.at(req.matches[2]);
    const bool truncate = truncate_left_.fetch_sub(1) > 0;
    if (!truncate) truncate_left_ = std::max(0, truncate_left_.load());
    const bool stall = stall_left_.fetch_sub(1) > 0;
    if (!stall) stall_left_ = std::max(0, stall_left_.load());
    const size_t half = blob->data.size() / 2;
    // httplib serves the requested range of this provider (offset, length).
    res.set_content_provider(
        blob->data.size(), "application/octet-stream",
        [this, blob, truncate, stall, half](size_t offset, size_t length, httplib::DataSink& sink) {
          const size_t chunk = std::min<size_t>(length, 64 * 1024);
          size_t n = chunk;
          if ((truncate || stall) && offset < half) n = std::min(n, half - offset);
          if ((truncate || stall) && offset >= half) {
            if (stall) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms_.load()));
            return false;  // the connection is closed mid-body
          }
          if (const int d = delay_ms_.load(); d > 0) std::this_thread::sleep_for(std::chrono::milliseconds(d));
          return sink.write(reinterpret_cast<const char*>(blob->data.data() + offset), n);
        });
  });
}

}  // namespace phaselab::test
