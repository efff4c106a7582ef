// FakeHub: a local stand-in for Hugging Face, for the tests of the hub
// client (test_hub), the Get Models dialog (test_gui_get_models) and the
// screenshots (phaselab-fake-hub). Two HTTP servers on loopback:
//
//   the API  at http://127.0.0.1:<port>   /api/models, /api/models/{repo},
//            /api/models/{repo}/tree/{rev}, and /{repo}/resolve/{rev}/{path},
//            which redirects (302) to
//   the CDN  at http://localhost:<port2>  (another origin: the token must not
//            follow), which serves the bytes with HTTP range requests.
//
// The JSON has the shapes of the documented API (the Hub API reference at
// huggingface.co/docs/hub/api, and the huggingface.js interfaces of the same
// answers: ListFileEntry {type, oid, size, path, lfs{oid, size, pointerSize},
// xetHash?}, ModelEntry): search entries {_id, id, modelId, likes,
// downloads, tags, createdAt, lastModified?, gated?, private}; a repository
// {id, sha, gated, cardData{license}, tags, siblings}; tree entries as above.
// They were written from that documentation, not recorded from the live
// service (the machines these tests run on cannot reach it). The GGUF bytes
// are real (stories260K).
//
// Repositories (owner "phaselab-test"):
//   stories260K-GGUF     stories260K-Q8_0.gguf and stories260K-F32.gguf (the
//                        same real bytes), README.md, and two hostile paths
//                        ("../evil.gguf", "sub/../../x.gguf") a client must skip
//   gated-GGUF           gated "manual": files need "Bearer hf_test_token"
//                        (401 without a token, 403 with another one)
//   split-GGUF           one model in two parts under Q8_0/
//   bad-checksum-GGUF    lists a SHA-256 the bytes do not have
//   oversize-GGUF        lists fewer bytes than the CDN sends
//   moe-GGUF             a header-only GGUF of architecture deepseek2 (not supported yet)
//   missing-GGUF         does not exist (404)
// Knobs: truncate_next(n) closes the next n CDN transfers half-way;
// stall_next(n) stops sending half-way for stall_ms; rate_limit_next(n)
// answers n resolve requests with 429 (Retry-After: retry_after_s);
// set_delay_ms(ms) sleeps between 64 KiB chunks (a slow CDN).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
}

namespace phaselab::test {

class FakeHub {
 public:
  // Serves gguf_path's bytes as every model file. Throws std::runtime_error
  // when the servers cannot start.
  explicit FakeHub(const std::string& gguf_path);
  ~FakeHub();
  FakeHub(const FakeHub&) = delete;
  FakeHub& operator=(const FakeHub&) = delete;

  std::string endpoint() const;      // "http://127.0.0.1:PORT"
  std::string cdn_origin() const;    // "http://localhost:PORT2"
  static constexpr const char* kToken = "hf_test_token";

  void set_delay_ms(int ms) { delay_ms_ = ms; }
  void truncate_next(int n) { truncate_left_ = n; }
  void stall_next(int n, int stall_ms) {
    stall_ms_ = stall_ms;
    stall_left_ = n;
  }
  void rate_limit_next(int n, int retry_after_s = 0) {
    retry_after_s_ = retry_after_s;
    rate_limit_left_ = n;
  }

  // What the servers saw.
  int cdn_requests() const { return cdn_requests_; }
  int cdn_requests_with_authorization() const { return cdn_auth_; }
  int range_requests() const { return range_requests_; }
  int api_requests() const { return api_requests_; }

  const std::vector<uint8_t>& model_bytes() const { return bytes_; }
  static std::string sha256_hex(const uint8_t* data, size_t n);

 private:
  struct Blob {
    std::vector<uint8_t> data;
    std::string sha256;
    uint64_t listed_size = 0;    // what the tree says (oversize: less than data)
    std::string listed_sha256;   // what the tree says (bad checksum: another)
  };
  struct Repo {
    std::string gated;  // "", "manual"
    std::string license;
    int64_t downloads = 0, likes = 0;
    std::map<std::string, std::shared_ptr<Blob>> files;  // path -> bytes
    std::vector<std::string> hostile_paths;              // listed, never served
  };
  void build_repos();
  void route_api();
  void route_cdn();

  std::vector<uint8_t> bytes_;
  std::map<std::string, Repo> repos_;
  std::unique_ptr<httplib::Server> api_, cdn_;
  std::thread api_thread_, cdn_thread_;
  int api_port_ = 0, cdn_port_ = 0;

  std::atomic<int> delay_ms_{0}, truncate_left_{0}, stall_left_{0}, stall_ms_{0}, rate_limit_left_{0},
      retry_after_s_{0};
  std::atomic<int> cdn_requests_{0}, cdn_auth_{0}, range_requests_{0}, api_requests_{0};
};

}  // namespace phaselab::test
