// phaselab-cli batch's files. The input is read a line at a time, never held
// whole. The output gets one whole line per write(), under an exclusive lock,
// so that after a crash or a kill it holds whole results and at most one torn
// last line, which --resume cuts off before running what is missing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "phaselab/status.h"

namespace phaselab::cli {

// FNV-1a (64-bit) of an input line's exact bytes without its '\n'. Every
// output record carries it as "line_fnv1a64" (16 hex digits) so that --resume
// can tell this input's results from another's. A checksum, not a
// cryptographic hash: it catches a different or edited input, not a forgery.
constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;
uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnv1aBasis);
std::string hex64(uint64_t v);  // 16 lower-case hex digits

// Reads a file line by line through a 64 KiB buffer (pread, so it can share
// the output's descriptor without moving its offset).
class LineReader {
 public:
  struct Line {
    uint64_t offset = 0;          // of its first byte in the file
    uint64_t hash = kFnv1aBasis;  // fnv1a64 of the whole line, however long
    bool blank = true;            // only spaces, tabs and '\r'
    bool complete = false;        // ended by '\n' (else by the end of the file)
    bool cut = false;             // longer than keep_limit: text holds its start
    std::string text;             // without the '\n', at most keep_limit bytes
  };

  // A regular file only: a FIFO cannot be read twice, /dev/zero never ends.
  static Result<std::unique_ptr<LineReader>> open(const std::string& path);
  // Reads a descriptor the caller keeps open.
  LineReader(int fd, std::string name);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line; false at the end of the file or on a read error (error()).
  bool next(Line* line, size_t keep_limit);
  void seek(uint64_t offset);
  uint64_t position() const { return buf_offset_ + at_; }
  const Status& error() const { return error_; }

 private:
  int fd_ = -1;
  bool owns_fd_ = false;
  std::string name_;
  std::vector<char> buf_;    // (64 KiB) the file from buf_offset_ on
  uint64_t buf_offset_ = 0;  // file offset of buf_[0]
  size_t at_ = 0, len_ = 0;  // next byte, bytes read into buf_
  Status error_;
};

// An input line that is a request (blank lines are not). Its output "index"
// is its position among these.
struct InputLine {
  uint64_t offset = 0;
  long long number = 0;  // 1-based among all the file's lines, for messages
  uint64_t hash = 0;
};
// One pass over the file, hashing each line and keeping none.
Result<std::vector<InputLine>> index_input(LineReader& reader);

// What to do with an output file that is not empty.
enum class ExistingOutput { refuse, resume, overwrite };

class BatchOutput {
 public:
  // "-" is standard output: nothing to lock, check or resume. Else the file,
  // created when missing, never the input (through a link neither), locked
  // against a second run; a non-empty one is refused, resumed or emptied as
  // `existing` says. Resuming keeps every whole record that answers its line
  // of `input` and cuts off a torn last line; records of another input are
  // an error.
  static Result<std::unique_ptr<BatchOutput>> open(const std::string& path, const std::string& input_path,
                                                   ExistingOutput existing, const std::vector<InputLine>& input);
  ~BatchOutput();
  BatchOutput(const BatchOutput&) = delete;
  BatchOutput& operator=(const BatchOutput&) = delete;

  // After a resume: whether index i is answered already, by a result or an error.
  bool answered(size_t i) const { return i < answered_.size() && answered_[i] != kMissing; }
  size_t n_kept() const { return n_kept_; }
  size_t n_kept_errors() const { return n_kept_errors_; }
  uint64_t torn_bytes() const { return torn_bytes_; }  // of the last line resume cut off

  // Writes `line` and its '\n' with one write() (looping on a partial one).
  // When that fails the file is cut back to where the line began, so that it
  // never ends in a torn line; the error says what to do (exit 1).
  Status append(std::string line);
  // fdatasync at most every 0.5 s, or now: a crash then keeps what was
  // reported done.
  Status sync(bool now);

 private:
  BatchOutput() = default;
  Status resume(const std::string& input_path, const std::vector<InputLine>& input);
  Status keep_record(const std::string& text, long long number, const std::string& input_path,
                     const std::vector<InputLine>& input);

  static constexpr uint8_t kMissing = 0, kResult = 1, kError = 2;
  std::string path_;
  int fd_ = -1;
  bool owns_fd_ = false;
  bool regular_ = false;      // a regular file: it can be cut back and synced
  uint64_t size_ = 0;         // its length after the last whole line
  bool unsynced_ = false;     // lines written since the last fdatasync
  std::chrono::steady_clock::time_point last_sync_ = std::chrono::steady_clock::now();
  std::vector<uint8_t> answered_;  // (input lines) kMissing, kResult or kError
  size_t n_kept_ = 0, n_kept_errors_ = 0;
  uint64_t torn_bytes_ = 0;
};

}  // namespace phaselab::cli
