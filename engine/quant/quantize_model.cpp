// quantize_model: plans every tensor's type with the mix rule
// (quant_mix.cpp), then streams the output file: the header (the input's
// metadata, general.file_type, general.quantization_version, the tensor
// infos with offsets known from the plan) and each tensor in turn, copied
// when its type does not change, else dequantized row by row and quantized
// again on a thread pool. Only one tensor's output is held in memory.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

#include "phaselab/files.h"
#include "phaselab/quant.h"
#include "phaselab/quantize.h"
#include "phaselab/thread_pool.h"
#include "../gguf/gguf_output.h"

namespace phaselab {

namespace {

using gguf_out::align_up;
using gguf_out::check_output;
using gguf_out::put;
using gguf_out::temp_path_beside;

int llama_n_dims(const GgufTensorInfo& t) {
  for (int i = 3; i >= 1; i--)
    if (t.ne[i] > 1) return i + 1;
  return 1;
}

// The header: metadata (serialized by GgufWriter, which pads to its
// alignment, 1 here) followed by the tensor infos, padded to the alignment.
std::vector<uint8_t> build_header(const GgufFile& f, FileType ft, const std::vector<TensorPlan>& plan,
                                  uint32_t alignment) {
  GgufWriter w(3, 1);  // sets general.alignment = 1, replaced below
  w.set("general.alignment", GgufWriteValue::u32(alignment));
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.alignment" || key.rfind("split.", 0) == 0) continue;
    w.set(key, GgufWriteValue::copy_of(value));
  }
  w.set("general.quantization_version", GgufWriteValue::u32(kQuantizationVersion));
  w.set("general.file_type", GgufWriteValue::u32(static_cast<uint32_t>(ft)));
  std::vector<uint8_t> h = w.serialize();
  const uint64_t n_tensors = plan.size();
  std::memcpy(h.data() + 8, &n_tensors, 8);
  uint64_t offset = 0;
  for (size_t i = 0; i < plan.size(); i++) {
    const GgufTensorInfo& t = f.tensors()[i];
    put<uint64_t>(h, t.name.size());
    h.insert(h.end(), t.name.begin(), t.name.end());
    put<uint32_t>(h, t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; d++) put<uint64_t>(h, static_cast<uint64_t>(t.ne[d]));
    put<uint32_t>(h, static_cast<uint32_t>(plan[i].to));
    put<uint64_t>(h, offset);
    offset += align_up(plan[i].bytes_out, alignment);
  }
  h.resize(align_up(h.size(), alignment), 0);
  return h;
}

// Converts one tensor's rows on the pool. scratch[thread] holds a row of F32.
Status convert_tensor(const GgufTensorInfo& t, TensorType to, uint8_t* out, ThreadPool& pool,
                      std::vector<std::vector<float>>& scratch, const std::atomic<bool>* cancel) {
  const int64_t n0 = t.ne[0];
  const int64_t rows = static_cast<int64_t>(t.n_elements) / n0;
  const size_t in_row = row_size(t.type, n0), out_row = row_size(to, n0);
  // Chunks of about 64 KiB of F32 work each, so threads stay balanced.
  const int64_t rows_per_chunk = std::max<int64_t>(1, 16384 / n0);
  const int n_chunks = static_cast<int>((rows + rows_per_chunk - 1) / rows_per_chunk);
  std::mutex mu;
  Status failed;
  std::atomic<bool> stop{false};
  pool.for_chunks(n_chunks, [&](int c, int th) {
    if (stop.load(std::memory_order_relaxed) || (cancel && cancel->load(std::memory_order_relaxed))) return;
    std::vector<float>& row = scratch[th];
    const int64_t r0 = c * rows_per_chunk, r1 = std::min(rows, r0 + rows_per_chunk);
    for (int64_t r = r0; r < r1; r++) {
      Status st = dequantize_row(t.type, t.data + r * in_row, row.data(), n0);
      if (st) st = quantize_row(to, row.data(), out + r * out_row, n0);
      if (!st) {
        std::lock_guard<std::mutex> lock(mu);
        if (failed) failed = st.with_context("tensor " + t.name);
        stop = true;
        return;
      }
    }
  });
  if (!failed) return failed;
  if (cancel && cancel->load()) return cancelled("quantization cancelled");
  return Status::ok();
}

// Reopens the written file and checks that it holds what was planned.
Status verify_written(const std::string& path, FileType ft, const std::vector<TensorPlan>& plan) {
  auto f = GgufFile::open(path);
  if (!f) return f.status().with_context("the written file does not read back");
  const auto& ts = (*f)->tensors();
  if (ts.size() != plan.size())
    return internal_error(path + ": the written file does not read back (tensor count differs)");
  for (size_t i = 0; i < ts.size(); i++)
    if (ts[i].name != plan[i].name || ts[i].type != plan[i].to || ts[i].n_bytes != plan[i].bytes_out)
      return internal_error(path + ": tensor " + plan[i].name + " does not read back as written");
  if ((*f)->get_int("general.file_type") != static_cast<int64_t>(ft))
    return internal_error(path + ": general.file_type does not read back");
  return Status::ok();
}

}  // namespace

std::vector<TypeCount> type_mix_of(const std::vector<TensorPlan>& plan) {
  std::vector<TypeCount> mix;
  for (const auto& p : plan) {
    auto it = std::find_if(mix.begin(), mix.end(), [&](const TypeCount& c) { return c.type == p.to; });
    if (it == mix.end()) {
      mix.push_back({p.to, 0, 0});
      it = mix.end() - 1;
    }
    it->tensors++;
    it->bytes += p.bytes_out;
  }
  std::sort(mix.begin(), mix.end(), [](const TypeCount& a, const TypeCount& b) { return a.bytes > b.bytes; });
  return mix;
}

Result<std::vector<TensorPlan>> plan_quantization(const GgufFile& f, FileType ft) {
  const MixModelInfo m = MixModelInfo::from_gguf(f);
  std::vector<TensorPlan> plan;
  plan.reserve(f.tensors().size());
  for (const auto& t : f.tensors()) {
    TensorPlan p;
    p.name = t.name;
    p.from = t.type;
    p.to = type_for_tensor(ft, {t.name, t.type, llama_n_dims(t), t.ne[0]}, m, &p.fell_back);
    p.bytes_in = t.n_bytes;
    p.bytes_out = row_size(p.to, t.ne[0]) * (t.n_elements / static_cast<uint64_t>(t.ne[0]));
    if (p.converted() && !traits_of(t.type).can_dequantize)
      return unsupported(f.path() + ": tensor " + t.name + " is " + std::string(tensor_type_name(t.type)) +
                         ", which PhaseLab cannot dequantize, and would have to become " +
                         std::string(tensor_type_name(p.to)));
    plan.push_back(std::move(p));
  }
  return plan;
}

Result<QuantizeReport> quantize_model(const std::string& in, const std::string& out, FileType ft,
                                      const QuantizeOptions& opts, const QuantizeProgress& progress,
                                      const std::atomic<bool>* cancel) {
  const auto t0 = std::chrono::steady_clock::now();
  PHASELAB_TRY(check_output(in, out, opts.overwrite));
  auto opened = GgufFile::open(in);
  if (!opened) return opened.status();
  const GgufFile& f = **opened;
  auto planned = plan_quantization(f, ft);
  if (!planned) return planned.status();

  QuantizeReport rep;
  rep.file_type = ft;
  rep.tensors = std::move(*planned);
  rep.type_mix = type_mix_of(rep.tensors);
  if (auto v = f.get_int("general.file_type")) rep.in_file_type = file_type_name_of(static_cast<uint32_t>(*v));
  rep.in_file_bytes = f.file_size();
  uint64_t bytes_total = 0;
  size_t max_row = 1, max_out = 0;
  for (size_t i = 0; i < rep.tensors.size(); i++) {
    const auto& p = rep.tensors[i];
    bytes_total += p.bytes_in;
    if (!p.converted()) continue;
    rep.n_converted++;
    if (p.fell_back) rep.n_fallback++;
    if (traits_of(p.from).block_size > 1) rep.n_requantized++;
    max_row = std::max<size_t>(max_row, static_cast<size_t>(f.tensors()[i].ne[0]));
    max_out = std::max<size_t>(max_out, p.bytes_out);
  }
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  rep.n_threads = std::clamp(opts.n_threads > 0 ? opts.n_threads : hw, 1, 256);

  const uint32_t alignment = static_cast<uint32_t>(f.alignment());
  const std::vector<uint8_t> header = build_header(f, ft, rep.tensors, alignment);

  const std::string tmp = temp_path_beside(out);
  if (tmp.empty()) return io_error(out + ": cannot create a file in its folder");
  auto fail = [&](const Status& st) -> Result<QuantizeReport> {
    std::remove(tmp.c_str());
    return st;
  };
  {
    std::unique_ptr<FILE, int (*)(FILE*)> fo(std::fopen(tmp.c_str(), "wb"), &std::fclose);
    if (!fo) return fail(io_error(tmp + ": cannot open for writing"));
    auto write = [&](const void* p, size_t n) { return n == 0 || std::fwrite(p, 1, n, fo.get()) == n; };
    if (!write(header.data(), header.size())) return fail(io_error(tmp + ": write failed (disk full?)"));

    std::vector<uint8_t> buf;
    std::unique_ptr<ThreadPool> pool;
    std::vector<std::vector<float>> scratch;
    if (rep.n_converted > 0) {
      try {
        buf.resize(max_out);
      } catch (const std::bad_alloc&) {
        return fail(out_of_memory("cannot allocate " + std::to_string(max_out >> 20) + " MiB for one tensor"));
      }
      pool = std::make_unique<ThreadPool>(rep.n_threads);
      scratch.assign(rep.n_threads, std::vector<float>(max_row));
    }
    const std::vector<uint8_t> zeros(alignment, 0);
    uint64_t bytes_done = 0;
    for (size_t i = 0; i < rep.tensors.size(); i++) {
      if (cancel && cancel->load()) return fail(cancelled("quantization cancelled"));
      const GgufTensorInfo& t = f.tensors()[i];
      const TensorPlan& p = rep.tensors[i];
      const uint8_t* data = t.data;
      if (p.converted()) {
        if (Status st = convert_tensor(t, p.to, buf.data(), *pool, scratch, cancel); !st) return fail(st);
        data = buf.data();
      }
      if (!write(data, p.bytes_out) || !write(zeros.data(), align_up(p.bytes_out, alignment) - p.bytes_out))
        return fail(io_error(tmp + ": write failed (disk full?)"));
      bytes_done += p.bytes_in;
      if (progress) progress(i, rep.tensors.size(), bytes_done, bytes_total);
    }
    if (std::fflush(fo.get()) != 0) return fail(io_error(tmp + ": write failed (disk full?)"));
  }
  if (opts.verify)
    if (Status st = verify_written(tmp, ft, rep.tensors); !st) return fail(st);
  if (Status st = gguf_out::publish(tmp, out); !st) return fail(st);
  struct stat so{};
  if (::stat(out.c_str(), &so) == 0) rep.out_file_bytes = static_cast<uint64_t>(so.st_size);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace phaselab
