#pragma once

// A model is described in the job file as a list of layer blocks; this is one block.

#include <map>
#include <string>

namespace troupe::layers {

/// One block of `model.layers`. Fields a type does not use keep their defaults.
struct layer_spec {
  /// linear, relu, tanh, gelu, conv2d, maxpool2d, flatten, dropout, embedding, layernorm,
  /// transformer_block, lm_head, lstm_cell, tree_lstm_cell; linear_head and linear_tail,
  /// conv2d_head and conv2d_tail where a partition cuts a layer (never written in a job file)
  std::string type;
  /// linear: output features; conv2d: output channels; lstm_cell, tree_lstm_cell: the hidden
  /// size H (a row's output is [h | c], 2 H wide)
  int out = 0;
  int kernel = 0;         ///< conv2d, maxpool2d: window size (maxpool2d default 2)
  int stride = 0;         ///< conv2d default 1; maxpool2d default = kernel
  int padding = 0;        ///< conv2d zero padding
  float probability = 0;  ///< dropout: probability of zeroing an element
  bool bias = true;       ///< linear, conv2d, lm_head, lstm cells: whether to add a bias
  int vocab = 0;          ///< embedding, lm_head: vocabulary size
  int dim = 0;            ///< embedding: width of a token's vector
  int positions = 0;      ///< embedding: learned positions (0: the input's length)
  int heads = 0;          ///< transformer_block: attention heads (must divide the width)
  int mlp_ratio = 4;      ///< transformer_block: MLP width over model width
  float dropout = 0;      ///< transformer_block: residual dropout probability
  /// tree_lstm_cell: children per tree node (N of the N-ary Tree-LSTM). Its rows are
  /// [x | h_1 | c_1 | ... | h_N | c_N] (zeros for a missing child); lstm_cell's are [x | h | c].
  int arity = 2;
  /// linear_head, linear_tail (conv2d_head, conv2d_tail): the two parts of a layer of `out`
  /// outputs (channels) that a partition cuts (actors/config/layer_cuts.h); the head computes
  /// outputs [0, split), the tail the rest.
  int split = 0;
  /// The block's index in model.layers as the job file writes it, where a cut linear layer's two
  /// parts moved it (its weights, dropout stream and parameter names keep that index); -1: its
  /// own index.
  int origin = -1;
  /// A registered layer type's own keys (layers/layer_registry.h), by name.
  std::map<std::string, double> options;
};

/// The head of a cut layer ("linear_head", "conv2d_head").
inline bool is_cut_head(const std::string& type) {
  return type == "linear_head" || type == "conv2d_head";
}
/// The tail of a cut layer ("linear_tail", "conv2d_tail").
inline bool is_cut_tail(const std::string& type) {
  return type == "linear_tail" || type == "conv2d_tail";
}
inline bool is_cut_part(const std::string& type) { return is_cut_head(type) || is_cut_tail(type); }
/// The type of the layer that a cut part belongs to ("linear" for "linear_head"); other types
/// unchanged.
inline std::string uncut_type(const std::string& type) {
  return is_cut_part(type) ? type.substr(0, type.rfind('_')) : type;
}

}  // namespace troupe::layers
