// Pruning by layer dropping (ShortGPT, Men et al. 2024; Gromov et al., "The
// Unreasonable Ineffectiveness of the Deeper Layers"): a copy of a GGUF model
// without a run of consecutive transformer blocks, the later blocks
// renumbered, {arch}.block_count lowered, per-layer metadata arrays cut to
// match. Every other tensor and key is copied byte for byte, so the file is
// as valid for llama.cpp as the input was.
//
// Which run to drop can be measured: the angular distance between the
// residual stream before block l and after block l + n - 1,
// arccos(cos(x_l, x_{l+n})) / pi, averaged over the tokens of an evaluation
// text; the run whose output is closest to its input changes the model least.
//
// FFN width pruning (structured Wanda, Sun et al. 2023, per neuron): every
// layer keeps the same number of its feed-forward's inner neurons, those of
// the highest importance ||h_j||_2 * sum_i |W_down[i][j]| (h_j the neuron's
// activation over the tokens of an evaluation text, act(gate x) * (up x);
// W_down's column j what it writes to the residual stream). The kept rows of
// ffn_gate and ffn_up are copied byte for byte; ffn_down's rows lose the
// dropped columns and are quantized again to their type (a multiple of the
// type's block is kept: 256 for the K-quants, 32 otherwise);
// {arch}.feed_forward_length is lowered.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "phaselab/status.h"

namespace phaselab {

class Session;

// One pruning: a run of layers dropped, or (ffn_keep_percent > 0) the FFN
// width cut to that percentage.
struct LayerPrune {
  int first = -1;  // the first layer dropped; -1: choose by angular distance
  int count = 0;   // how many consecutive layers
  int ffn_keep_percent = 0;  // 1..99: FFN width pruning, keeping this share of each layer's neurons
  bool is_ffn() const { return ffn_keep_percent > 0; }
};

// "layers:A-B" (drop A..B, counted from 0), "layers:A" (one layer),
// "layers:N" with a leading "n" ("layers:n3": three layers, chosen by
// measurement) or "ffn:P%" (keep P percent of every FFN's neurons, chosen by
// measurement). Refuses anything else with the spelling in the message.
Result<LayerPrune> parse_prune_spec(std::string_view spec);
std::string prune_spec_to_string(const LayerPrune& p);

struct PruneReport {
  std::string arch;
  int n_layer_in = 0, n_layer_out = 0;
  LayerPrune dropped;
  int n_tensors_in = 0, n_tensors_out = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
};

// Writes out: in without layers [p.first, p.first + p.count). Refuses a run
// outside the model, all of its layers, an output that is the input or
// exists (unless overwrite), and a Gemma 3 drop that would shift its pattern
// of local and global layers (which readers derive from the layer index:
// the count must be a multiple of the pattern's period).
Result<PruneReport> prune_layers(const std::string& in, const std::string& out, const LayerPrune& p, bool overwrite);

// The angular distance of every run of count layers on s's model, from the
// residual stream of tokens (at most 512, one pass per batch): element l is
// the run starting at layer l (n_layer - count + 1 of them). Needs a backend
// that gives its residual stream (Backend::forward_residuals: the CPU backend).
Result<std::vector<double>> block_angular_distances(Session& s, const std::vector<int32_t>& tokens, int count);

// layers:nN resolved: the run of count layers of the model at path with the
// smallest angular distance on text (tokenized as perplexity does), measured
// on the CPU backend with n_threads; distances, where given, gets them all.
Result<LayerPrune> choose_layer_prune(const std::string& path, const std::string& text, int count, int n_threads,
                                      std::vector<double>* distances);

// FFN width pruning with the neurons chosen: keep[l] lists layer l's kept
// neurons (ascending, the same count in every layer). Refuses a count that
// is not a multiple of ffn_down's block (or is the whole width or none), a
// model without a gated FFN, and outputs as prune_layers does.
struct FfnPruneReport {
  std::string arch;
  int n_layer = 0, n_ff_in = 0, n_ff_out = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
};
Result<FfnPruneReport> prune_ffn_neurons(const std::string& in, const std::string& out,
                                         const std::vector<std::vector<int>>& keep, bool overwrite);

// Importance of every FFN neuron of s's model (n_layer rows of n_ff):
// ||h_j||_2 over tokens (at most 512) times sum_i |W_down[i][j]|. Needs a
// backend that gives its activations (Backend::forward_ffn_activations: the
// CPU backend).
Result<std::vector<std::vector<double>>> ffn_neuron_importance(Session& s, const std::vector<int32_t>& tokens);

// The width kept for keep_percent of n_ff: rounded down to a multiple of
// block (at least one block, less than n_ff); 0 when none fits.
int ffn_kept_width(int n_ff, int keep_percent, int block);

// ffn:P% resolved and written: importance measured on text (CPU backend,
// n_threads), the top neurons of each layer kept.
Result<FfnPruneReport> prune_ffn(const std::string& in, const std::string& out, int keep_percent,
                                 const std::string& text, int n_threads, bool overwrite);

}  // namespace phaselab
