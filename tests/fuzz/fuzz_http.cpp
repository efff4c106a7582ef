// Fuzz target: the HTTP/1.1 request reader the server puts every client's
// bytes through (engine/serve/http_request_reader.cpp). Input: byte 0 sets
// how the rest arrives (the size of each piece, 1 to 64 bytes, or all at
// once), the rest is what a client sends. Requests are taken as they
// complete (pipelining) until an error or the end of the input; every one
// must respect the limits, whatever the bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_common.h"
#include "phaselab/http_server.h"

using namespace phaselab::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Limits limits;
  limits.max_header_bytes = 2048;  // small, so that the fuzzer reaches them
  limits.max_headers = 16;
  limits.max_body_bytes = 4096;
  size_t reserved = 0;
  RequestReader reader(limits, [&](size_t n) {
    if (reserved + n > 3 * limits.max_body_bytes) return false;
    reserved += n;
    return true;
  });
  const size_t piece = data[0] == 0 ? size : 1 + data[0] % 64;
  const std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string in;
  size_t fed = 0;
  int requests = 0;
  for (;;) {
    const RequestReader::Step step = reader.feed(in);
    if (step == RequestReader::Step::error) {
      const RequestReader::Error& e = reader.error();
      FUZZ_CHECK(e.status >= 400 && e.status < 600 && !e.message.empty());
      FUZZ_CHECK(reader.phase() == RequestReader::Phase::failed);
      break;
    }
    if (step == RequestReader::Step::request) {
      const Request r = reader.take();
      FUZZ_CHECK(r.body.size() <= limits.max_body_bytes);
      FUZZ_CHECK(static_cast<int>(r.headers.size()) <= limits.max_headers);
      FUZZ_CHECK(!r.method.empty() && (r.path.empty() || r.path[0] == '/' || r.target == "*"));
      FUZZ_CHECK(r.minor_version == 0 || r.minor_version == 1);
      if (r.minor_version == 1) FUZZ_CHECK(r.header_count("host") == 1);
      FUZZ_CHECK(!(r.header("content-length") && r.header("transfer-encoding")));
      for (const auto& [k, v] : r.headers)
        for (char c : v) FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 || c == '\t');
      FUZZ_CHECK(reader.phase() == RequestReader::Phase::head);
      requests++;
      continue;
    }
    // Waiting for more: what is buffered is bounded by the limits.
    FUZZ_CHECK(reader.phase() != RequestReader::Phase::head || in.size() <= limits.max_header_bytes);
    if (fed >= all.size()) break;
    const size_t n = std::min(piece, all.size() - fed);
    in.append(all.substr(fed, n));
    fed += n;
  }
  FUZZ_CHECK(requests <= static_cast<int>(size));
  return 0;
}
