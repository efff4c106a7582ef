// phaselab-cli twin: a "shape twin" of a model, for measuring speed where
// the model itself cannot go (the GPU machine takes at most 64 MiB of files).
//   twin export MODEL SPEC   SPEC: the model's metadata and vocabulary, and
//                            each tensor's name, type and shape; no weights
//   twin build SPEC OUT      OUT: a model with those tensors filled with
//                            random values of the same types and shapes
// A twin runs exactly the work of the original, so its speed is the
// original's; its output is noise.
#include <cstdio>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/gguf.h"
#include "phaselab/quant.h"

namespace phaselab::cli {

namespace {

constexpr const char* kPrefix = "phaselab.twin.";

int twin_export(const std::string& in, const std::string& out) {
  auto f = GgufFile::open(in);
  if (!f) return report(f.status());
  GgufWriter w;
  std::vector<std::string> names;
  std::vector<GgufWriteValue> types, shapes;
  for (const auto& [key, value] : (*f)->metadata())
    if (key != "general.alignment") w.set(key, GgufWriteValue::copy_of(value));
  for (const auto& t : (*f)->tensors()) {
    names.push_back(t.name);
    types.push_back(GgufWriteValue::u32(static_cast<uint32_t>(t.type)));
    std::vector<int32_t> shape(t.ne, t.ne + t.n_dims);
    shapes.push_back(GgufWriteValue::i32_array(shape));
  }
  w.set(std::string(kPrefix) + "names", GgufWriteValue::string_array(names));
  w.set(std::string(kPrefix) + "types", GgufWriteValue::array(GgufValueType::UINT32, std::move(types)));
  w.set(std::string(kPrefix) + "shapes", GgufWriteValue::array(GgufValueType::ARRAY, std::move(shapes)));
  if (Status st = w.write(out); !st) return report(st);
  std::fprintf(stderr, "twin: spec of %zu tensors written to %s\n", names.size(), out.c_str());
  return kExitOk;
}

int twin_build(const std::string& spec, const std::string& out) {
  auto f = GgufFile::open(spec);
  if (!f) return report(f.status());
  const GgufValue* names = (*f)->find(std::string(kPrefix) + "names");
  const GgufValue* types = (*f)->find(std::string(kPrefix) + "types");
  const GgufValue* shapes = (*f)->find(std::string(kPrefix) + "shapes");
  if (!names || !types || !shapes || names->strings.size() != types->count || names->strings.size() != shapes->items.size())
    return report(invalid_argument(spec + " is not a twin spec (make one with: phaselab-cli twin export MODEL SPEC)"));
  GgufWriter w;
  for (const auto& [key, value] : (*f)->metadata())
    if (key.rfind(kPrefix, 0) != 0 && key != "general.alignment") w.set(key, GgufWriteValue::copy_of(value));
  // Marks the file: its outputs are noise (tests compare logits, not tokens).
  w.set("phaselab.twin_of", GgufWriteValue::string(std::string((*f)->get_string("general.name").value_or("a model"))));
  // Rows in chunks of 64, each chunk's values from its own generator
  // (seeded by tensor and chunk), the chunks shared among the cores: the
  // same file whatever the number of threads, and a 30B model's twin in
  // a minute rather than half an hour.
  constexpr int64_t kChunkRows = 64;
  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 0; i < names->strings.size(); i++) {
    const auto type = static_cast<TensorType>(types->int_at(i));
    const GgufValue& sv = shapes->items[i];
    std::vector<int64_t> shape;
    for (uint64_t d = 0; d < sv.count; d++) shape.push_back(sv.int_at(d));
    if (shape.empty()) return report(invalid_argument("tensor without a shape in " + spec));
    int64_t rows = 1;
    for (size_t d = 1; d < shape.size(); d++) rows *= shape[d];
    const bool norm = shape.size() == 1;  // norms near 1, everything else small
    const size_t rb = row_size(type, shape[0]);
    std::vector<uint8_t> data(rb * rows);
    const int64_t n_chunks = (rows + kChunkRows - 1) / kChunkRows;
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    Status first_error = Status::ok();
    std::mutex error_mutex;
    auto work = [&] {
      std::vector<float> row(shape[0]);
      for (int64_t c = next++; c < n_chunks && !failed; c = next++) {
        std::mt19937 rng(static_cast<uint32_t>(i * 1000003 + c * 7919 + 7));
        std::normal_distribution<float> normal(0.f, 0.02f);
        for (int64_t r = c * kChunkRows; r < std::min(rows, (c + 1) * kChunkRows); r++) {
          for (auto& x : row) x = norm ? 1.f + normal(rng) : normal(rng);
          if (Status st = quantize_row(type, row.data(), data.data() + r * rb, shape[0]); !st) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!failed.exchange(true)) first_error = st;
            return;
          }
        }
      }
    };
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < std::min<int64_t>(n_threads, n_chunks); t++) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (failed) return report(first_error.with_context(std::string(names->strings[i])));
    if (Status st = w.add_tensor(std::string(names->strings[i]), type, shape, data.data(), data.size()); !st) return report(st);
  }
  if (Status st = w.write(out); !st) return report(st);
  std::fprintf(stderr, "twin: %zu tensors with random values written to %s\n", names->strings.size(), out.c_str());
  return kExitOk;
}

}  // namespace

int cmd_twin(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {{"--help", "-h", false}});
  if (!args) return report(args.status());
  const auto& p = args->positional();
  if (args->has("--help") || p.size() != 3 || (p[0] != "export" && p[0] != "build")) {
    std::fprintf(args->has("--help") ? stdout : stderr,
                 "usage: phaselab-cli twin export MODEL SPEC   the model's shapes, types, metadata (no weights)\n"
                 "       phaselab-cli twin build SPEC OUT      a model of those shapes with random weights\n");
    return args->has("--help") ? kExitOk : kExitBadInput;
  }
  return p[0] == "export" ? twin_export(p[1], p[2]) : twin_build(p[1], p[2]);
}

}  // namespace phaselab::cli
