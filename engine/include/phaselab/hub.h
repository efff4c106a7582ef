// Getting models from Hugging Face (or a mirror that speaks its API): search
// for GGUF repositories, list a repository's GGUF files (split files grouped,
// quantization read from the name), estimate whether one fits this machine
// before downloading it (its header is read with a range request and the same
// memory rule as Session::create is applied), and download it into the model
// folder: resumable (HTTP range requests), verified (the SHA-256 the API gives
// for each LFS file), written under a temporary name and renamed, with its
// source noted beside it (<file>.source.json).
//
// One client for `phaselab-cli pull` and the window's Get Models dialog. The
// endpoint is https://huggingface.co unless HF_ENDPOINT names a mirror; the
// token (HF_TOKEN, or the one the window keeps in the desktop's secret store)
// is sent only to the endpoint's host, never to the CDN a download is
// redirected to.
//
// API shapes used (documented at huggingface.co/docs/hub/api):
//   GET /api/models?search=T&filter=gguf&sort=downloads&direction=-1&limit=N
//   GET /api/models/{repo}                      (cardData.license, gated, tags)
//   GET /api/models/{repo}/tree/{rev}?recursive=true  (path, size, lfs.oid)
//   GET /{repo}/resolve/{rev}/{path}            (302 to the CDN; Range honoured)
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "phaselab/memory.h"
#include "phaselab/status.h"

namespace phaselab::hub {

inline constexpr const char* kDefaultEndpoint = "https://huggingface.co";

struct HubOptions {
  std::string endpoint = kDefaultEndpoint;  // scheme://host[:port], no trailing slash
  std::string token;                        // empty = anonymous
  int connect_timeout_s = 10;
  int stall_timeout_s = 30;    // no byte for this long: the transfer is stalled
  int max_retries = 3;         // per request: interrupted transfers, 429, 5xx
  int max_retry_wait_s = 30;   // a longer Retry-After is reported, not waited for
  uint64_t max_json_bytes = 32ull << 20;  // a larger API answer is refused

  // HF_ENDPOINT (else the default) and HF_TOKEN.
  static HubOptions from_environment();
};

enum class SortBy { downloads, likes, last_modified };
const char* to_string(SortBy s);

struct ModelSummary {
  std::string id;  // "owner/name"
  int64_t downloads = 0;
  int64_t likes = 0;
  std::string last_modified;  // ISO 8601 as the API gives it, may be empty
  std::string gated;          // "" (open), "auto" or "manual"
  std::string license;        // from a "license:..." tag, may be empty
};

// Repositories matching `text` that have GGUF files, most downloaded (or
// liked, or recent) first. limit 1..200.
Result<std::vector<ModelSummary>> search_models(const HubOptions& opt, const std::string& text,
                                                SortBy sort = SortBy::downloads, int limit = 30);

struct RepoFile {
  std::string path;    // inside the repository ("Q4_K_M/x-00001-of-00002.gguf")
  uint64_t size = 0;
  std::string sha256;  // the LFS object id (hex); empty for a non-LFS file
};

// One model to download: a single GGUF file, or all parts of a split one
// (name-00001-of-0000N.gguf ...), in order.
struct GgufChoice {
  std::string name;    // the first part's file name
  std::string quant;   // "Q4_K_M", "IQ4_XS", "F16", "BF16" ... or "" when the name has none
  std::vector<RepoFile> parts;
  uint64_t total_size() const;
  std::string label() const;  // name, plus " (N parts)" for a split file
};

struct RepoInfo {
  std::string id;
  std::string revision = "main";
  std::string commit;   // the revision's commit sha when the API gives it
  std::string license;  // cardData.license, else a license: tag; "" when none is stated
  std::string gated;    // "" (open), "auto" or "manual": needs the user's token
  std::vector<GgufChoice> models;  // sorted by name
};

// The repository's card data and its GGUF files (every folder).
Result<RepoInfo> repo_info(const HubOptions& opt, const std::string& repo);

// "owner/name", "owner/name:Q4_K_M", "owner/name:file.gguf", or a full
// https://huggingface.co/owner/name URL. Repository names are checked
// (letters, digits, '-', '_', '.'; no "..").
struct PullSpec {
  std::string repo;
  std::string selector;  // "" = choose: the only model, else Q4_K_M, else ask
};
Result<PullSpec> parse_pull_spec(const std::string& text);

// The model `selector` names (a quantization, case-insensitive, or a file
// name or path of any part); "" picks the only one, else the Q4_K_M one.
// The error lists what there is.
Result<GgufChoice> choose_model(const RepoInfo& info, const std::string& selector);

// Whether a model fits this machine's memory, before it is downloaded: its
// header is read with range requests (the first MiBs of the first part) and
// the rule of Session::create applied (weights + the KV cache of n_ctx
// positions + a pass's work buffers, engine_memory_need()).
struct FitEstimate {
  std::string architecture;  // general.architecture, "" when the header could not be read
  bool supported = false;    // PhaseLab can run the architecture
  std::string note;          // why not, or what the estimate leaves out
  int n_ctx = 0;             // the context the estimate is for
  MemoryNeed need;           // weights are the model's total size when nothing else is known
  uint64_t available = 0;    // MemAvailable now (0 = unknown)
  bool fits() const { return available == 0 || need.total() <= available; }
};
Result<FitEstimate> estimate_fit(const HubOptions& opt, const RepoInfo& info, const GgufChoice& model, int n_ctx);
// The same from a header already in memory (bytes = the first part's first
// bytes, file_size = its full size, total_size = every part's).
FitEstimate estimate_fit_from_header(const std::vector<uint8_t>& header, uint64_t file_size, uint64_t total_size,
                                     int n_ctx);

struct DownloadProgress {
  std::string file;        // the part being transferred
  int part = 0, n_parts = 1;
  uint64_t done = 0;       // bytes of the whole model present (resumed bytes included)
  uint64_t total = 0;
  double bytes_per_s = 0;  // over the last few seconds
  std::string stage;       // "downloading", "resuming", "verifying", "retrying: ..."
};

// Pause and Cancel from another thread. Pause stops the transfer and keeps
// the partial file (the next download of the same model resumes it); Cancel
// removes it.
class DownloadControl {
 public:
  void pause() {  // never turns a cancel back into a pause
    int running = 0;
    state_.compare_exchange_strong(running, 1);
  }
  void cancel() { state_ = 2; }
  void reset() { state_ = 0; }
  bool stop_requested() const { return state_.load() != 0; }
  bool cancelled() const { return state_.load() == 2; }

 private:
  std::atomic<int> state_{0};
};

struct DownloadResult {
  std::vector<std::string> paths;  // the parts in the model folder, in order (empty when paused/cancelled)
  bool paused = false;
  bool cancelled = false;
  bool already_present = false;  // the same file (size and checksum noted) was there
  bool verified = true;          // every part had a SHA-256 listed and matched it (false: none was listed)
  uint64_t bytes_transferred = 0;
  double seconds = 0;
};

// Downloads every part of `model` into model_dir. Each part is written to
// partial_path() and verified; when every part is, their source notes are
// written and the parts renamed (the first part last), so a model's file
// name appears only when the whole model is there. A partial file left by a
// pause or a crash is resumed with a range request; one being written by
// another download is refused (it is locked). A file already in the folder
// under the same name is kept and the download refused, unless its source
// note names the same checksum (then it is "already present"). Cancel
// removes every partial file of the model.
Result<DownloadResult> download_model(const HubOptions& opt, const RepoInfo& info, const GgufChoice& model,
                                      const std::string& model_dir,
                                      const std::function<void(const DownloadProgress&)>& on_progress = {},
                                      DownloadControl* control = nullptr);

// Where download_model keeps a part until the whole model is verified:
// <model_dir>/<file name>.<first 12 hex digits of its SHA-256>.part (its size
// when no checksum is listed).
std::string partial_path(const std::string& model_dir, const RepoFile& f);

// "1.2 GiB", "640 MiB" for messages.
std::string format_bytes(uint64_t n);

}  // namespace phaselab::hub
