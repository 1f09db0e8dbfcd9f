#pragma once

// ListOps (Nangia & Bowman 2018): nested lists of MAX, MIN, MED (median) and SM (sum modulo
// 10) over the digits 0-9, such as `[MAX 2 9 [MIN 4 7 ] 0 ]`; the label is the expression's
// value, one of 10 classes.
//
// An expression is an instance (instance.h) in the binary form the Tree-LSTM literature uses:
// its tokens are the leaves, combined left-branching within a list, ((([MAX 2) 9) ...) ]),
// where an argument that is itself a list is its own subtree, and each combination is an
// internal part with the token listops_node_token. Parts are in post-order (left subtree,
// right subtree, node), so an expression of T tokens has 2T − 1 parts; one label, the value.
//
// MED follows the original generator (int(np.median(values))): the middle value of an odd
// count, and of an even count the mean of the two middle values rounded down, so
// [MED 1 2 ] is 1 and [MED 3 4 6 9 ] is 5.

#include <cstdint>
#include <optional>
#include <string>

#include "layers/instance.h"

namespace troupe::layers {

/// Token ids: the digits are themselves, then the list openers, the closer and the id of an
/// internal part (a combination, no token of the expression).
constexpr int32_t listops_max_token = 10;
constexpr int32_t listops_min_token = 11;
constexpr int32_t listops_median_token = 12;
constexpr int32_t listops_sum_mod_token = 13;
constexpr int32_t listops_close_token = 14;
constexpr int32_t listops_node_token = 15;
constexpr int listops_vocabulary = 16;
constexpr int listops_classes = 10;

/// What generate_listops draws.
struct listops_options {
  int64_t train_count = 8192;  ///< data.synthetic_train
  int64_t test_count = 1024;   ///< data.synthetic_test
  int max_depth = 4;           ///< most nested lists (1: flat lists of digits)
  int max_arguments = 5;       ///< each list has 2 to max_arguments arguments, uniformly
  int64_t max_tokens = 128;    ///< most tokens of one expression (data.context)
  /// The chance that an argument above max_depth is a list rather than a digit (the original
  /// generator's 0.25).
  double list_probability = 0.25;
  uint64_t seed = 1;
};

/// Draws train_count + test_count distinct expressions from `seed` (the same seed gives the
/// same sets), the first train_count the training set and the rest the test set, so no test
/// expression is also a training one. Each is a list at its top. Options out of range, or more
/// expressions than the bounds allow distinct, give nothing and one line in `error`.
std::optional<instance_splits> generate_listops(const listops_options& options, std::string* error);

/// The expression an instance stands for, its tokens separated by spaces:
/// "[MAX 2 9 [MIN 4 7 ] 0 ]".
std::string listops_text(const instance& item);

/// The instance of an expression's text (tokens separated by white space; parentheses, as in
/// the original data's bracketed form, are ignored), labelled with its value; or nothing and
/// one line in `error` saying what is wrong.
std::optional<instance> parse_listops(const std::string& text, std::string* error);

/// Writes `data` as lines "label<TAB>expression".
bool save_listops(const std::string& path, const instance_dataset& data, std::string* error);

/// Reads lines "label<TAB>expression" (blank lines skipped); a line whose label is not the
/// expression's value, or that does not parse, gives nothing and `error` naming path:line.
std::optional<instance_dataset> load_listops(const std::string& path, std::string* error);

}  // namespace troupe::layers
