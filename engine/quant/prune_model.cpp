// prune_layers: streams a copy of a GGUF file without a run of blocks (the
// header rewritten, each kept tensor copied as it is); block_angular_distances:
// the measurement that chooses the run (prune.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "../gguf/gguf_output.h"
#include "phaselab/gguf.h"
#include "phaselab/perplexity.h"
#include "phaselab/prune.h"
#include "phaselab/quant.h"
#include "phaselab/session.h"

namespace phaselab {

namespace {

bool parse_int(std::string_view t, int* v) {
  const auto r = std::from_chars(t.data(), t.data() + t.size(), *v);
  return !t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size();
}

// "blk.12.attn_q.weight" -> 12 and ".attn_q.weight"; -1 for other names.
int block_of(const std::string& name, std::string_view* rest) {
  if (name.rfind("blk.", 0) != 0) return -1;
  const size_t dot = name.find('.', 4);
  int i = -1;
  if (dot == std::string::npos || !parse_int(std::string_view(name).substr(4, dot - 4), &i)) return -1;
  *rest = std::string_view(name).substr(dot);
  return i;
}

// "A" or "A-B" (appended, not "x" + string: GCC 12 warns wrongly on that).
std::string layer_range(int first, int count) {
  std::string s = std::to_string(first);
  if (count > 1) {
    s += '-';
    s += std::to_string(first + count - 1);
  }
  return s;
}

}  // namespace

Result<LayerPrune> parse_prune_spec(std::string_view spec) {
  const std::string hint = "--prune takes layers:A-B (drop layers A..B, from 0), layers:A, layers:nN (N layers "
                           "chosen by measurement) or ffn:P% (keep P% of every FFN's neurons, 1-99), e.g. layers:10-12, "
                           "layers:n2 or ffn:75%";
  std::string bad = "'";  // (appended: GCC 12 warns wrongly on "'" + string)
  bad += spec;
  bad += "': " + hint;
  if (spec.rfind("ffn:", 0) == 0) {
    std::string_view v = spec.substr(4);
    if (!v.empty() && v.back() == '%') v.remove_suffix(1);
    LayerPrune p;
    if (!parse_int(v, &p.ffn_keep_percent) || p.ffn_keep_percent < 1 || p.ffn_keep_percent > 99)
      return invalid_argument(bad);
    return p;
  }
  if (spec.rfind("layers:", 0) != 0) return invalid_argument(bad);
  std::string_view v = spec.substr(7);
  LayerPrune p;
  if (!v.empty() && v[0] == 'n') {
    if (!parse_int(v.substr(1), &p.count) || p.count < 1) return invalid_argument(bad);
    return p;
  }
  const size_t dash = v.find('-');
  int a = 0, b = 0;
  const bool ok = dash == std::string_view::npos ? parse_int(v, &a) && (b = a, true)
                                                 : parse_int(v.substr(0, dash), &a) && parse_int(v.substr(dash + 1), &b);
  if (!ok || a < 0 || b < a) return invalid_argument(bad);
  p.first = a;
  p.count = b - a + 1;
  return p;
}

std::string prune_spec_to_string(const LayerPrune& p) {
  if (p.is_ffn()) {
    std::string f = "ffn:";
    f += std::to_string(p.ffn_keep_percent);
    f += '%';
    return f;
  }
  std::string s = "layers:";
  if (p.first < 0) {
    s += 'n';
    s += std::to_string(p.count);
    return s;
  }
  s += layer_range(p.first, p.count);
  return s;
}

Result<PruneReport> prune_layers(const std::string& in, const std::string& out, const LayerPrune& p, bool overwrite) {
  if (p.is_ffn()) return invalid_argument("ffn:P% prunes widths, not layers: use prune_ffn");
  PHASELAB_TRY(gguf_out::check_output(in, out, overwrite));
  auto opened = GgufFile::open(in);
  if (!opened) return opened.status();
  const GgufFile& f = **opened;
  PruneReport rep;
  const auto arch = f.get_string("general.architecture");
  if (!arch) return invalid_file(in + ": no general.architecture: not a model PhaseLab can prune");
  rep.arch = std::string(*arch);
  const std::string a = rep.arch + ".";
  const auto n_layer = f.get_int(a + "block_count");
  if (!n_layer || *n_layer < 1 || *n_layer > 100000) return invalid_file(in + ": no valid " + a + "block_count");
  const int L = static_cast<int>(*n_layer);
  if (p.first < 0 || p.count < 1 || p.first + p.count > L)
    return invalid_argument("layers " + layer_range(p.first, p.count) + " are not in the model (it has " + std::to_string(L) + " layers: 0-" + std::to_string(L - 1) + ")");
  if (p.count >= L) return invalid_argument("dropping every layer leaves no model");
  const GgufValue* pattern = f.find(a + "attention.sliding_window_pattern");
  const bool pattern_array = pattern && pattern->type == GgufValueType::ARRAY;
  if (rep.arch == "gemma3") {
    if (L == 62)
      return unsupported("Gemma 3 27B is recognised by its 62 layers (its query scale differs): a pruned copy would "
                         "be read as another size; prune a smaller Gemma 3");
    const int period = pattern && pattern->is_integer() && pattern->i > 0 ? static_cast<int>(pattern->i) : 6;
    if (!pattern_array && p.count % period != 0)
      return invalid_argument("Gemma 3 alternates " + std::to_string(period - 1) + " local layers with 1 global one, "
                              "and readers derive which is which from the layer's index: drop a multiple of " +
                              std::to_string(period) + " layers so that the pattern stays");
  }
  // Gemma 2 and gpt-oss alternate local (sliding-window) and global layers
  // by the layer's index too, every other layer by default.
  if (rep.arch == "gemma2" || rep.arch == "gpt-oss") {
    if (rep.arch == "gemma2" && L == 46)
      return unsupported("Gemma 2 27B is recognised by its 46 layers (its query scale differs): a pruned copy would "
                         "be read as another size; prune a smaller Gemma 2");
    const int64_t period = pattern && pattern->is_integer() && pattern->i > 0 ? pattern->i : 2;
    if (p.count % period != 0)
      return invalid_argument(rep.arch + " alternates local (sliding-window) and global layers, and readers derive "
                              "which is which from the layer's index: drop a multiple of " + std::to_string(period) +
                              " layers so that the pattern stays");
  }
  const int drop_end = p.first + p.count;
  rep.n_layer_in = L;
  rep.n_layer_out = L - p.count;
  rep.dropped = p;
  rep.bytes_in = f.file_size();

  // Metadata: every key, with block_count lowered and per-layer arrays cut.
  const uint64_t alignment = f.alignment();
  GgufWriter w(3, 1);
  w.set("general.alignment", GgufWriteValue::u32(static_cast<uint32_t>(alignment)));
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.alignment" || key.rfind("split.", 0) == 0) continue;
    GgufWriteValue v = GgufWriteValue::copy_of(value);
    if (key.rfind(a, 0) == 0 && value.type == GgufValueType::ARRAY && value.count == static_cast<uint64_t>(L) &&
        v.items.size() == static_cast<size_t>(L))
      v.items.erase(v.items.begin() + p.first, v.items.begin() + drop_end);
    w.set(key, std::move(v));
  }
  w.set(a + "block_count", GgufWriteValue::u32(static_cast<uint32_t>(L - p.count)));
  const std::string dropped = layer_range(p.first, p.count);
  const std::string name = std::string(f.get_string("general.name").value_or(rep.arch));
  w.set("general.name", GgufWriteValue::string(name + " (layers " + dropped + " dropped)"));
  w.set("phaselab.pruned_layers", GgufWriteValue::string(dropped + " of " + std::to_string(L)));

  // Tensor infos: the kept tensors in their order, later blocks renumbered.
  struct Kept {
    const GgufTensorInfo* t;
    std::string name;
  };
  std::vector<Kept> kept;
  for (const GgufTensorInfo& t : f.tensors()) {
    rep.n_tensors_in++;
    std::string_view rest;
    const int b = block_of(t.name, &rest);
    if (b >= L) return invalid_file(in + ": tensor " + t.name + " belongs to no layer (block_count " + std::to_string(L) + ")");
    if (b >= p.first && b < drop_end) continue;
    std::string renamed = t.name;
    if (b >= drop_end) {
      renamed = "blk.";
      renamed += std::to_string(b - p.count);
      renamed += rest;
    }
    kept.push_back({&t, std::move(renamed)});
  }
  rep.n_tensors_out = static_cast<int>(kept.size());
  std::vector<uint8_t> h = w.serialize();
  const uint64_t n_tensors = kept.size();
  std::memcpy(h.data() + 8, &n_tensors, 8);
  uint64_t offset = 0;
  for (const Kept& k : kept) {
    gguf_out::put<uint64_t>(h, k.name.size());
    h.insert(h.end(), k.name.begin(), k.name.end());
    gguf_out::put<uint32_t>(h, k.t->n_dims);
    for (uint32_t d = 0; d < k.t->n_dims; d++) gguf_out::put<uint64_t>(h, static_cast<uint64_t>(k.t->ne[d]));
    gguf_out::put<uint32_t>(h, static_cast<uint32_t>(k.t->type));
    gguf_out::put<uint64_t>(h, offset);
    offset += gguf_out::align_up(k.t->n_bytes, alignment);
  }
  h.resize(gguf_out::align_up(h.size(), alignment), 0);

  const std::string tmp = gguf_out::temp_path_beside(out);
  if (tmp.empty()) return io_error(out + ": cannot create a file in its folder");
  auto fail = [&](const Status& st) -> Result<PruneReport> {
    std::remove(tmp.c_str());
    return st;
  };
  {
    std::unique_ptr<FILE, int (*)(FILE*)> fo(std::fopen(tmp.c_str(), "wb"), &std::fclose);
    if (!fo) return fail(io_error(tmp + ": cannot open for writing"));
    auto write = [&](const void* d, size_t n) { return n == 0 || std::fwrite(d, 1, n, fo.get()) == n; };
    const std::vector<uint8_t> zeros(alignment, 0);
    bool ok = write(h.data(), h.size());
    for (size_t i = 0; ok && i < kept.size(); i++) {
      const GgufTensorInfo& t = *kept[i].t;
      ok = write(t.data, t.n_bytes) && write(zeros.data(), gguf_out::align_up(t.n_bytes, alignment) - t.n_bytes);
    }
    if (!ok || std::fflush(fo.get()) != 0) return fail(io_error(tmp + ": write failed (disk full?)"));
  }
  // Read back: the file opens and says what was meant.
  {
    auto back = GgufFile::open(tmp);
    if (!back) return fail(back.status().with_context("the pruned file"));
    if ((*back)->get_int(a + "block_count") != L - p.count || (*back)->tensors().size() != kept.size())
      return fail(internal_error("the pruned file does not read back as written"));
    rep.bytes_out = (*back)->file_size();
  }
  if (Status st = gguf_out::publish(tmp, out); !st) return fail(st);
  return rep;
}

Result<std::vector<double>> block_angular_distances(Session& s, const std::vector<int32_t>& tokens, int count) {
  const ModelConfig& c = s.model().config();
  const int L = c.n_layer, D = c.n_embd;
  if (count < 1 || count >= L)
    return invalid_argument("a run of " + std::to_string(count) + " layers in a model of " + std::to_string(L));
  const int n = std::min<int>(static_cast<int>(tokens.size()), std::min(512, s.n_ctx()));
  if (n < 1) return invalid_argument("no tokens to measure the residual stream on");
  std::vector<double> sum(static_cast<size_t>(L - count + 1), 0.0);
  std::vector<float> res;
  s.kv().clear();
  const int batch = std::max(1, s.backend().max_batch());
  for (int t0 = 0; t0 < n; t0 += batch) {
    const int T = std::min(batch, n - t0);
    SeqChunk ch;
    ch.kv = &s.kv();
    ch.tokens = tokens.data() + t0;
    ch.n_tokens = T;
    ch.mode = LogitsMode::none;
    PHASELAB_TRY(s.backend().forward_residuals(ch, &res));
    for (int t = 0; t < T; t++)
      for (int l = 0; l + count <= L; l++) {
        const float* x = &res[(static_cast<size_t>(l) * T + t) * D];
        const float* y = &res[(static_cast<size_t>(l + count) * T + t) * D];
        double xy = 0, xx = 0, yy = 0;
        for (int i = 0; i < D; i++) xy += double(x[i]) * y[i], xx += double(x[i]) * x[i], yy += double(y[i]) * y[i];
        const double cosv = xx > 0 && yy > 0 ? std::clamp(xy / std::sqrt(xx * yy), -1.0, 1.0) : 1.0;
        sum[static_cast<size_t>(l)] += std::acos(cosv) / M_PI;
      }
  }
  s.kv().clear();
  for (double& v : sum) v /= n;
  return sum;
}

Result<LayerPrune> choose_layer_prune(const std::string& path, const std::string& text, int count, int n_threads,
                                      std::vector<double>* distances) {
  auto model = Model::load(path);
  if (!model) return model.status();
  auto backend = make_cpu_backend(*model, std::max(1, n_threads), 64);
  if (!backend) return backend.status();
  auto s = Session::create(*model, std::move(*backend), 512);
  if (!s) return s.status();
  const auto tokens = perplexity_tokenize((*model)->tokenizer(), text);
  auto d = block_angular_distances(**s, tokens, count);
  if (!d) return d.status();
  LayerPrune p;
  p.count = count;
  p.first = static_cast<int>(std::min_element(d->begin(), d->end()) - d->begin());
  if (distances) *distances = std::move(*d);
  return p;
}

int ffn_kept_width(int n_ff, int keep_percent, int block) {
  if (block < 1 || n_ff < 1) return 0;
  const int want = static_cast<int>(static_cast<int64_t>(n_ff) * keep_percent / 100);
  int w = want / block * block;
  if (w < block) w = block;
  return w < n_ff ? w : 0;
}

namespace {

// The layer's FFN tensor names and their infos.
struct FfnTensors {
  const GgufTensorInfo *gate = nullptr, *up = nullptr, *down = nullptr;
};

Result<std::vector<FfnTensors>> ffn_tensors(const GgufFile& f, const std::string& in, int L) {
  std::vector<FfnTensors> out(static_cast<size_t>(L));
  for (int l = 0; l < L; l++) {
    const std::string b = "blk." + std::to_string(l) + ".ffn_";
    out[l].gate = f.find_tensor(b + "gate.weight");
    out[l].up = f.find_tensor(b + "up.weight");
    out[l].down = f.find_tensor(b + "down.weight");
    if (!out[l].gate || !out[l].up || !out[l].down)
      return unsupported(in + ": layer " + std::to_string(l) +
                         " has no gated feed-forward (ffn_gate, ffn_up, ffn_down): FFN width pruning needs one");
  }
  return out;
}

}  // namespace

Result<FfnPruneReport> prune_ffn_neurons(const std::string& in, const std::string& out,
                                         const std::vector<std::vector<int>>& keep, bool overwrite) {
  PHASELAB_TRY(gguf_out::check_output(in, out, overwrite));
  auto opened = GgufFile::open(in);
  if (!opened) return opened.status();
  const GgufFile& f = **opened;
  FfnPruneReport rep;
  const auto arch = f.get_string("general.architecture");
  if (!arch) return invalid_file(in + ": no general.architecture: not a model PhaseLab can prune");
  rep.arch = std::string(*arch);
  const std::string a = rep.arch + ".";
  const auto n_layer = f.get_int(a + "block_count");
  const auto n_ff = f.get_int(a + "feed_forward_length");
  if (!n_layer || *n_layer < 1 || *n_layer > 100000) return invalid_file(in + ": no valid " + a + "block_count");
  if (!n_ff || *n_ff < 1 || *n_ff > (1 << 24))
    return unsupported(in + ": no single " + a + "feed_forward_length (one width for every layer is needed)");
  const int L = static_cast<int>(*n_layer), F = static_cast<int>(*n_ff);
  auto ffn = ffn_tensors(f, in, L);
  if (!ffn) return ffn.status();
  if (static_cast<int>(keep.size()) != L)
    return invalid_argument("kept neurons for " + std::to_string(keep.size()) + " layers of " + std::to_string(L));
  const int K = keep.empty() ? 0 : static_cast<int>(keep[0].size());
  for (int l = 0; l < L; l++) {
    const FfnTensors& t = (*ffn)[l];
    if (t.gate->ne[1] != F || t.up->ne[1] != F || t.down->ne[0] != F)
      return invalid_file(in + ": layer " + std::to_string(l) + "'s FFN is not " + std::to_string(F) + " wide");
    const int block = static_cast<int>(traits_of(t.down->type).block_size);
    if (K < 1 || K >= F || K % block != 0)
      return invalid_argument("keep a multiple of " + std::to_string(block) + " neurons (ffn_down is " +
                              std::string(tensor_type_name(t.down->type)) + "), more than none and fewer than all " +
                              std::to_string(F) + ", not " + std::to_string(K));
    if (static_cast<int>(keep[l].size()) != K)
      return invalid_argument("every layer must keep the same number of neurons");
    for (int i = 0; i < K; i++)
      if (keep[l][i] < 0 || keep[l][i] >= F || (i > 0 && keep[l][i] <= keep[l][i - 1]))
        return invalid_argument("layer " + std::to_string(l) + "'s kept neurons are not ascending indexes below " +
                                std::to_string(F));
  }
  rep.n_layer = L, rep.n_ff_in = F, rep.n_ff_out = K;
  rep.bytes_in = f.file_size();

  const uint64_t alignment = f.alignment();
  GgufWriter w(3, 1);
  w.set("general.alignment", GgufWriteValue::u32(static_cast<uint32_t>(alignment)));
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.alignment" || key.rfind("split.", 0) == 0) continue;
    w.set(key, GgufWriteValue::copy_of(value));
  }
  w.set(a + "feed_forward_length", GgufWriteValue::u32(static_cast<uint32_t>(K)));
  const std::string name = std::string(f.get_string("general.name").value_or(rep.arch));
  const std::string what = "FFN " + std::to_string(K) + " of " + std::to_string(F);
  w.set("general.name", GgufWriteValue::string(name + " (" + what + ")"));
  w.set("phaselab.pruned_ffn", GgufWriteValue::string(what));

  // Tensor infos: the FFN matrices narrowed, the rest as they were.
  enum class Cut { none, rows, columns };
  struct Out {
    const GgufTensorInfo* t;
    Cut cut;
    int layer;
    int64_t ne[4];
    uint64_t n_bytes;
  };
  std::vector<Out> outs;
  for (const GgufTensorInfo& t : f.tensors()) {
    Out o{&t, Cut::none, -1, {t.ne[0], t.ne[1], t.ne[2], t.ne[3]}, t.n_bytes};
    for (int l = 0; l < L && o.cut == Cut::none; l++) {
      const FfnTensors& ft = (*ffn)[l];
      if (&t == ft.gate || &t == ft.up) {
        o.cut = Cut::rows, o.layer = l, o.ne[1] = K;
        o.n_bytes = row_size(t.type, t.ne[0]) * static_cast<uint64_t>(K);
      } else if (&t == ft.down) {
        o.cut = Cut::columns, o.layer = l, o.ne[0] = K;
        o.n_bytes = row_size(t.type, K) * static_cast<uint64_t>(t.ne[1]);
      }
    }
    outs.push_back(o);
  }
  std::vector<uint8_t> h = w.serialize();
  const uint64_t n_tensors = outs.size();
  std::memcpy(h.data() + 8, &n_tensors, 8);
  uint64_t offset = 0;
  for (const Out& o : outs) {
    gguf_out::put<uint64_t>(h, o.t->name.size());
    h.insert(h.end(), o.t->name.begin(), o.t->name.end());
    gguf_out::put<uint32_t>(h, o.t->n_dims);
    for (uint32_t d = 0; d < o.t->n_dims; d++) gguf_out::put<uint64_t>(h, static_cast<uint64_t>(o.ne[d]));
    gguf_out::put<uint32_t>(h, static_cast<uint32_t>(o.t->type));
    gguf_out::put<uint64_t>(h, offset);
    offset += gguf_out::align_up(o.n_bytes, alignment);
  }
  h.resize(gguf_out::align_up(h.size(), alignment), 0);

  const std::string tmp = gguf_out::temp_path_beside(out);
  if (tmp.empty()) return io_error(out + ": cannot create a file in its folder");
  auto fail = [&](const Status& st) -> Result<FfnPruneReport> {
    std::remove(tmp.c_str());
    return st;
  };
  {
    std::unique_ptr<FILE, int (*)(FILE*)> fo(std::fopen(tmp.c_str(), "wb"), &std::fclose);
    if (!fo) return fail(io_error(tmp + ": cannot open for writing"));
    auto write = [&](const void* d, size_t n) { return n == 0 || std::fwrite(d, 1, n, fo.get()) == n; };
    const std::vector<uint8_t> zeros(alignment, 0);
    std::vector<float> row(static_cast<size_t>(F)), kept(static_cast<size_t>(K));
    std::vector<uint8_t> qrow;
    bool ok = write(h.data(), h.size());
    for (size_t i = 0; ok && i < outs.size(); i++) {
      const Out& o = outs[i];
      const GgufTensorInfo& t = *o.t;
      const std::vector<int>* k = o.layer >= 0 ? &keep[static_cast<size_t>(o.layer)] : nullptr;
      if (o.cut == Cut::none) {
        ok = write(t.data, t.n_bytes);
      } else if (o.cut == Cut::rows) {  // (F rows of ne[0]) -> the K kept rows, bytes as they are
        const size_t rb = row_size(t.type, t.ne[0]);
        for (int j : *k)
          if (ok) ok = write(t.data + static_cast<size_t>(j) * rb, rb);
      } else {  // ffn_down: ne[1] rows of F -> rows of the K kept columns, quantized again
        const size_t rb_in = row_size(t.type, F), rb_out = row_size(t.type, K);
        qrow.resize(rb_out);
        for (int64_t r = 0; ok && r < t.ne[1]; r++) {
          if (Status st = dequantize_row(t.type, t.data + static_cast<size_t>(r) * rb_in, row.data(), F); !st)
            return fail(st.with_context(t.name));
          for (int c = 0; c < K; c++) kept[c] = row[(*k)[c]];
          if (Status st = quantize_row(t.type, kept.data(), qrow.data(), K); !st)
            return fail(st.with_context(t.name + " (quantized again without the dropped columns)"));
          ok = write(qrow.data(), rb_out);
        }
      }
      if (ok) ok = write(zeros.data(), gguf_out::align_up(o.n_bytes, alignment) - o.n_bytes);
    }
    if (!ok || std::fflush(fo.get()) != 0) return fail(io_error(tmp + ": write failed (disk full?)"));
  }
  {
    auto back = GgufFile::open(tmp);
    if (!back) return fail(back.status().with_context("the pruned file"));
    if ((*back)->get_int(a + "feed_forward_length") != K || (*back)->tensors().size() != outs.size())
      return fail(internal_error("the pruned file does not read back as written"));
    rep.bytes_out = (*back)->file_size();
  }
  if (Status st = gguf_out::publish(tmp, out); !st) return fail(st);
  return rep;
}

Result<std::vector<std::vector<double>>> ffn_neuron_importance(Session& s, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = s.model().config();
  const int L = c.n_layer, F = c.n_ff, D = c.n_embd;
  const int n = std::min<int>(static_cast<int>(tokens.size()), std::min(512, s.n_ctx()));
  if (n < 1) return invalid_argument("no tokens to measure the feed-forward activations on");
  std::vector<double> sumsq(static_cast<size_t>(L) * F, 0.0);
  s.kv().clear();
  const int batch = std::max(1, s.backend().max_batch());
  for (int t0 = 0; t0 < n; t0 += batch) {
    SeqChunk ch;
    ch.kv = &s.kv();
    ch.tokens = tokens.data() + t0;
    ch.n_tokens = std::min(batch, n - t0);
    ch.mode = LogitsMode::none;
    PHASELAB_TRY(s.backend().forward_ffn_activations(ch, &sumsq));
  }
  s.kv().clear();
  auto ffn = ffn_tensors(s.model().file(), "the model", L);
  if (!ffn) return ffn.status();
  std::vector<std::vector<double>> score(static_cast<size_t>(L), std::vector<double>(static_cast<size_t>(F), 0.0));
  std::vector<float> row(static_cast<size_t>(F));
  for (int l = 0; l < L; l++) {
    const GgufTensorInfo& down = *(*ffn)[l].down;
    if (down.ne[0] != F || down.ne[1] != D) return invalid_file(down.name + " is not n_ff x n_embd");
    const size_t rb = row_size(down.type, F);
    std::vector<double>& sc = score[l];
    for (int r = 0; r < D; r++) {  // sum_i |W_down[i][j]|: row i of ffn_down holds output i's weights
      PHASELAB_TRY(dequantize_row(down.type, down.data + static_cast<size_t>(r) * rb, row.data(), F));
      for (int j = 0; j < F; j++) sc[j] += std::fabs(row[j]);
    }
    for (int j = 0; j < F; j++) sc[j] *= std::sqrt(sumsq[static_cast<size_t>(l) * F + j]);
  }
  return score;
}

Result<FfnPruneReport> prune_ffn(const std::string& in, const std::string& out, int keep_percent,
                                 const std::string& text, int n_threads, bool overwrite) {
  if (keep_percent < 1 || keep_percent > 99) return invalid_argument("keep 1 to 99 percent of the FFN (ffn:P%)");
  PHASELAB_TRY(gguf_out::check_output(in, out, overwrite));
  auto model = Model::load(in);
  if (!model) return model.status();
  const ModelConfig& c = (*model)->config();
  auto ffn = ffn_tensors((*model)->file(), in, c.n_layer);
  if (!ffn) return ffn.status();
  int block = 32;
  for (const FfnTensors& t : *ffn) block = std::max<int>(block, static_cast<int>(traits_of(t.down->type).block_size));
  const int K = ffn_kept_width(c.n_ff, keep_percent, block);
  if (K == 0)
    return invalid_argument("keeping " + std::to_string(keep_percent) + "% of " + std::to_string(c.n_ff) +
                            " neurons leaves no whole block of " + std::to_string(block) + " to keep or drop");
  auto backend = make_cpu_backend(*model, std::max(1, n_threads), 64);
  if (!backend) return backend.status();
  auto s = Session::create(*model, std::move(*backend), 512);
  if (!s) return s.status();
  const auto tokens = perplexity_tokenize((*model)->tokenizer(), text);
  auto score = ffn_neuron_importance(**s, tokens);
  if (!score) return score.status();
  std::vector<std::vector<int>> keep(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; l++) {
    std::vector<int> idx(static_cast<size_t>(c.n_ff));
    for (int j = 0; j < c.n_ff; j++) idx[j] = j;
    const std::vector<double>& sc = (*score)[l];
    std::stable_sort(idx.begin(), idx.end(), [&](int x, int y) { return sc[x] > sc[y]; });
    idx.resize(static_cast<size_t>(K));
    std::sort(idx.begin(), idx.end());
    keep[l] = std::move(idx);
  }
  s->reset();
  model->reset();
  return prune_ffn_neurons(in, out, keep, overwrite);
}

}  // namespace phaselab
