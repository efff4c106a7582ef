#include "batch_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "phaselab/files.h"

namespace phaselab::cli {

namespace {

// A result line holds the generated text, JSON-escaped; a 1 GiB one is not a
// record this program wrote, and reading it whole would only exhaust memory.
constexpr size_t kMaxRecordBytes = size_t{1} << 30;

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (const unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- LineReader

Result<std::unique_ptr<LineReader>> LineReader::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer before fstat could refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open: " + errno_text(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    if (S_ISDIR(st.st_mode)) return invalid_argument(path + " is a folder, not a JSONL file");
    return invalid_argument(path + " is not a regular file (a pipe or a device?): give a JSONL file");
  }
  auto r = std::make_unique<LineReader>(fd, path);
  r->owns_fd_ = true;
  return r;
}

LineReader::LineReader(int fd, std::string name) : fd_(fd), name_(std::move(name)), buf_(64 << 10) {}

LineReader::~LineReader() {
  if (owns_fd_) ::close(fd_);
}

void LineReader::seek(uint64_t offset) {
  buf_offset_ = offset;
  at_ = len_ = 0;
}

bool LineReader::next(Line* l, size_t keep_limit) {
  l->offset = position();
  l->hash = kFnv1aBasis;
  l->blank = true;
  l->complete = l->cut = false;
  l->text.clear();
  bool any = false;
  for (;;) {
    if (at_ == len_) {
      buf_offset_ += len_;
      at_ = len_ = 0;
      ssize_t n;
      do n = ::pread(fd_, buf_.data(), buf_.size(), static_cast<off_t>(buf_offset_));
      while (n < 0 && errno == EINTR);
      if (n < 0) {
        error_ = io_error("reading " + name_ + " failed: " + errno_text(errno));
        return false;
      }
      if (n == 0) return any;
      len_ = static_cast<size_t>(n);
    }
    any = true;
    const char* p = buf_.data() + at_;
    const auto* nl = static_cast<const char*>(std::memchr(p, '\n', len_ - at_));
    const size_t n = nl ? static_cast<size_t>(nl - p) : len_ - at_;
    const std::string_view part(p, n);
    l->hash = fnv1a64(part, l->hash);
    if (l->blank && part.find_first_not_of(" \t\r") != std::string_view::npos) l->blank = false;
    const size_t room = keep_limit - std::min(keep_limit, l->text.size());
    l->text.append(p, std::min(n, room));
    if (n > room) l->cut = true;
    at_ += n;
    if (nl) {
      at_++;
      l->complete = true;
      return true;
    }
  }
}

Result<std::vector<InputLine>> index_input(LineReader& reader) {
  std::vector<InputLine> lines;
  LineReader::Line l;
  long long number = 0;
  while (reader.next(&l, 0)) {
    number++;
    if (!l.blank) lines.push_back({l.offset, number, l.hash});
  }
  if (!reader.error().is_ok()) return reader.error();
  return lines;
}

// ---- BatchOutput

Result<std::unique_ptr<BatchOutput>> BatchOutput::open(const std::string& path, const std::string& input_path,
                                                       ExistingOutput existing, const std::vector<InputLine>& input) {
  std::unique_ptr<BatchOutput> o(new BatchOutput);
  o->path_ = path;
  if (path == "-") {
    o->fd_ = STDOUT_FILENO;
    o->path_ = "standard output";
    return o;
  }
  if (same_file(input_path, path))
    return invalid_argument(path + " is the input file itself (or a link to it), whose prompts the results would "
                            "replace: give -o another file");
  const int flags = (existing == ExistingOutput::resume ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND | O_CLOEXEC;
  o->fd_ = ::open(path.c_str(), flags, 0644);
  if (o->fd_ < 0)
    return io_error("cannot write " + path + ": " + errno_text(errno) + ": check the folder exists and is writable");
  o->owns_fd_ = true;
  // Two runs appending to one file would interleave their lines and answer
  // prompts twice. The lock goes with the descriptor: a killed run frees it.
  if (::flock(o->fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return io_error(path + " is locked by another process (another phaselab-cli batch writing it?): wait for that "
                      "run to end, or give -o another file");
    std::fprintf(stderr, "phaselab-cli: warning: cannot lock %s (%s): do not run two batches on it at once\n",
                 path.c_str(), errno_text(errno).c_str());
  }
  struct stat st{};
  if (::fstat(o->fd_, &st) != 0) return io_error("cannot stat " + path + ": " + errno_text(errno));
  o->regular_ = S_ISREG(st.st_mode);
  if (!o->regular_) {
    if (existing == ExistingOutput::resume)
      return invalid_argument("--resume needs -o to be a regular file (" + path + " is a device or a pipe)");
    return o;
  }
  o->size_ = static_cast<uint64_t>(st.st_size);
  if (o->size_ == 0) return o;
  switch (existing) {
    case ExistingOutput::refuse:
      return invalid_argument(path + " already holds " + std::to_string(o->size_) +
                              " bytes: pass --resume to continue it (its finished lines are kept) or --force to "
                              "overwrite it");
    case ExistingOutput::overwrite:
      if (::ftruncate(o->fd_, 0) != 0) return io_error("cannot empty " + path + ": " + errno_text(errno));
      o->size_ = 0;
      return o;
    case ExistingOutput::resume:
      if (Status s = o->resume(input_path, input); !s) return s;
      return o;
  }
  return o;
}

BatchOutput::~BatchOutput() {
  if (owns_fd_) ::close(fd_);
}

Status BatchOutput::resume(const std::string& input_path, const std::vector<InputLine>& input) {
  answered_.assign(input.size(), kMissing);
  LineReader reader(fd_, path_);
  LineReader::Line l;
  uint64_t keep_end = 0;  // after the last whole line
  long long number = 0;
  while (reader.next(&l, kMaxRecordBytes)) {
    number++;
    if (!l.complete) break;  // a torn last line: the write a kill interrupted
    if (!l.blank) PHASELAB_TRY(keep_record(l.text, number, input_path, input));
    keep_end = reader.position();
  }
  if (!reader.error().is_ok()) return reader.error();
  if (keep_end < size_) {
    if (::ftruncate(fd_, static_cast<off_t>(keep_end)) != 0)
      return io_error("cannot cut the torn last line off " + path_ + ": " + errno_text(errno));
    torn_bytes_ = size_ - keep_end;
    size_ = keep_end;
  }
  return Status::ok();
}

Status BatchOutput::keep_record(const std::string& text, long long number, const std::string& input_path,
                                const std::vector<InputLine>& input) {
  const std::string where = "line " + std::to_string(number) + " of " + path_;
  const std::string other_input = path_ + " holds the results of another input than " + input_path +
                                  " (or that file was edited since): give -o another file, or drop --resume and "
                                  "pass --force to overwrite it";
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("index") || !j["index"].is_number_unsigned() || !j.contains("line_fnv1a64") ||
      !j["line_fnv1a64"].is_string())
    return invalid_argument(where + " is not a record of phaselab-cli batch (none before \"line_fnv1a64\" can be "
                            "resumed): give -o another file, or drop --resume and pass --force to overwrite it");
  const uint64_t index = j["index"].get<uint64_t>();
  if (index >= input.size())
    return invalid_argument(where + " answers index " + std::to_string(index) + ", past the " +
                            std::to_string(input.size()) + " requests of " + input_path + ": " + other_input);
  const InputLine& in = input[index];
  if (j["line_fnv1a64"].get<std::string>() != hex64(in.hash))
    return invalid_argument(where + " answers index " + std::to_string(index) + " for another text than line " +
                            std::to_string(in.number) + " of " + input_path + ": " + other_input);
  if (answered_[index] != kMissing)
    return invalid_argument(where + " answers index " + std::to_string(index) +
                            " a second time (two runs wrote it at once?): give -o another file, or drop --resume "
                            "and pass --force to overwrite it");
  const bool error = j.contains("error");
  answered_[index] = error ? kError : kResult;
  n_kept_++;
  if (error) n_kept_errors_++;
  return Status::ok();
}

Status BatchOutput::append(std::string line) {
  line.push_back('\n');
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int err = n < 0 ? errno : ENOSPC;
    std::string cut;
    // O_APPEND: the next write lands at the new end, right after the last whole line.
    if (regular_ && done > 0 && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0)
      cut = " (and cutting its torn last line off failed: --resume will)";
    return io_error("writing " + path_ + " failed: " + errno_text(err) + cut +
                    ": free some disk space (or give -o a file on another disk), then run the same command with "
                    "--resume; the lines written so far are kept");
  }
  size_ += line.size();
  unsynced_ = true;
  return Status::ok();
}

Status BatchOutput::sync(bool now) {
  if (!regular_ || !unsynced_) return Status::ok();
  const auto t = std::chrono::steady_clock::now();
  if (!now && t - last_sync_ < std::chrono::milliseconds(500)) return Status::ok();
  if (::fdatasync(fd_) != 0)
    return io_error("saving " + path_ + " to disk failed: " + errno_text(errno) +
                    ": free some disk space, then run the same command with --resume");
  last_sync_ = t;
  unsynced_ = false;
  return Status::ok();
}

}  // namespace phaselab::cli
