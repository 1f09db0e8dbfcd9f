// ListOps: the seeded generator, the binary tree of an expression, and its text form.

#include "layers/listops.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "layers/random.h"
#include "layers/regular_file.h"

namespace troupe::layers {
namespace {

constexpr const char* token_names[] = {"0", "1", "2",    "3",    "4",    "5",   "6", "7",
                                       "8", "9", "[MAX", "[MIN", "[MED", "[SM", "]"};
constexpr int operator_count = 4;
/// Deeper lists are refused when parsing, so that text from outside cannot exhaust the stack.
constexpr int most_parsed_depth = 4096;

bool is_digit(int32_t token) { return token >= 0 && token < 10; }
bool is_operator(int32_t token) {
  return token >= listops_max_token && token < listops_max_token + operator_count;
}

int apply_operator(int32_t op, std::vector<int> values) {
  std::sort(values.begin(), values.end());
  const size_t count = values.size();
  if (op == listops_max_token) return values.back();
  if (op == listops_min_token) return values.front();
  if (op == listops_median_token)
    return count % 2 == 1 ? values[count / 2] : (values[count / 2 - 1] + values[count / 2]) / 2;
  int sum = 0;
  for (int value : values) sum += value;
  return sum % 10;
}

/// Builds the binary tree of an expression's tokens, in post-order.
class tree_builder {
 public:
  tree_builder(const std::vector<int32_t>& tokens, std::string* error)
      : tokens_(tokens), error_(error) {}

  std::optional<instance> build() {
    int value = -1;
    if (tokens_.empty())
      refuse("the expression is empty");
    else if (!is_operator(tokens_[0]))
      refuse("the expression does not start with a list");
    else if ((value = list(1)) >= 0 && position_ != tokens_.size())
      value = refuse("tokens follow the expression's last ']'");
    if (value < 0) return std::nullopt;
    item_.labels = {value};
    return std::move(item_);
  }

 private:
  int refuse(const std::string& why) {
    *error_ = why;
    return -1;
  }

  int32_t add_part(int32_t token) {
    item_.tokens.push_back(token);
    item_.parent.push_back(-1);
    return static_cast<int32_t>(item_.tokens.size() - 1);
  }

  int32_t combine(int32_t left, int32_t right) {
    const int32_t node = add_part(listops_node_token);
    item_.parent[static_cast<size_t>(left)] = node;
    item_.parent[static_cast<size_t>(right)] = node;
    return node;
  }

  /// The list at position_ (whose subtree's root is then the last part): its value, or -1.
  int list(int depth) {
    if (depth > most_parsed_depth)
      return refuse("lists nest deeper than " + std::to_string(most_parsed_depth));
    const int32_t op = tokens_[position_++];
    int32_t current = add_part(op);
    std::vector<int> values;
    while (position_ < tokens_.size() && tokens_[position_] != listops_close_token) {
      const int32_t token = tokens_[position_];
      int value = token;
      if (is_digit(token)) {
        ++position_;
        add_part(token);
      } else if ((value = list(depth + 1)) < 0) {
        return -1;
      }
      current = combine(current, static_cast<int32_t>(item_.tokens.size() - 1));
      values.push_back(value);
    }
    if (position_ == tokens_.size()) return refuse("a list has no closing ']'");
    if (values.empty()) return refuse("a list has no arguments");
    ++position_;
    combine(current, add_part(listops_close_token));
    return apply_operator(op, std::move(values));
  }

  const std::vector<int32_t>& tokens_;
  std::string* error_;
  size_t position_ = 0;
  instance item_;
};

/// Appends a list at `depth` (1: the top) to `tokens`; its value, or -1 once the expression
/// would pass max_tokens. Each check leaves room for the argument and the ']' of this list and
/// of the depth − 1 lists around it.
int draw_list(random_generator& random, const listops_options& options, int depth,
              std::vector<int32_t>* tokens) {
  const auto op = static_cast<int32_t>(listops_max_token + random.below(operator_count));
  tokens->push_back(op);
  const auto arguments = 2 + static_cast<int>(random.below(options.max_arguments - 1));
  std::vector<int> values;
  for (int i = 0; i < arguments; ++i) {
    if (static_cast<int64_t>(tokens->size()) + 1 + depth > options.max_tokens) return -1;
    int value = 0;
    if (depth < options.max_depth && random.uniform() < options.list_probability) {
      if ((value = draw_list(random, options, depth + 1, tokens)) < 0) return -1;
    } else {
      value = static_cast<int>(random.below(10));
      tokens->push_back(value);
    }
    values.push_back(value);
  }
  tokens->push_back(listops_close_token);
  return apply_operator(op, std::move(values));
}

std::string options_error(const listops_options& options) {
  if (options.max_depth < 1) return "data.max_depth must be at least 1";
  if (options.max_arguments < 2) return "data.max_arguments must be at least 2";
  if (options.max_tokens < 4)
    return "data.context must be at least 4 for ListOps (the shortest list, [MAX 1 2 ])";
  if (options.train_count < 1) return "data.synthetic_train must be at least 1";
  if (options.test_count < 0) return "data.synthetic_test must not be negative";
  if (!(options.list_probability >= 0 && options.list_probability <= 1))
    return "the chance of a nested list must be within [0, 1]";
  return {};
}

instance_dataset empty_listops(const std::string& name) {
  instance_dataset data;
  data.name = name;
  data.vocabulary = listops_vocabulary;
  data.classes = listops_classes;
  data.arity = 2;
  return data;
}

/// One line "label<TAB>expression" whose label is the expression's value.
std::optional<instance> parse_line(const std::string& line, std::string* error) {
  const size_t tab = line.find('\t');
  if (tab == std::string::npos) {
    *error = "no tab after the label";
    return std::nullopt;
  }
  std::optional<instance> item = parse_listops(line.substr(tab + 1), error);
  if (item && line.substr(0, tab) != std::to_string(item->labels[0])) {
    *error = "the label '" + line.substr(0, tab) + "' is not the expression's value " +
             std::to_string(item->labels[0]);
    return std::nullopt;
  }
  return item;
}

std::string exhausted_error(const listops_options& options, int64_t wanted, int64_t found) {
  return "data.synthetic_train + data.synthetic_test = " + std::to_string(wanted) +
         " distinct ListOps expressions are more than data.max_depth = " +
         std::to_string(options.max_depth) +
         ", data.max_arguments = " + std::to_string(options.max_arguments) +
         " and data.context = " + std::to_string(options.max_tokens) + " allow (found " +
         std::to_string(found) + ")";
}

}  // namespace

std::optional<instance_splits> generate_listops(const listops_options& options,
                                                std::string* error) {
  if (std::string why = options_error(options); !why.empty()) {
    *error = why;
    return std::nullopt;
  }
  instance_splits result{empty_listops("listops"), empty_listops("listops test")};
  random_generator random(derive_seed(options.seed, 0x4c6973744f7073ULL));
  std::unordered_set<std::string> drawn;
  const int64_t wanted = options.train_count + options.test_count;
  // Small bounds allow few distinct expressions; give up after this many misses in a row.
  constexpr int64_t most_misses = 1000000;
  std::vector<int32_t> tokens;
  for (int64_t misses = 0; static_cast<int64_t>(drawn.size()) < wanted;) {
    tokens.clear();
    if (draw_list(random, options, 1, &tokens) < 0 ||
        !drawn.insert(std::string(tokens.begin(), tokens.end())).second) {
      if (++misses < most_misses) continue;
      *error = exhausted_error(options, wanted, static_cast<int64_t>(drawn.size()));
      return std::nullopt;
    }
    misses = 0;
    std::optional<instance> item = tree_builder(tokens, error).build();
    if (!item) return std::nullopt;
    auto& split = static_cast<int64_t>(drawn.size()) <= options.train_count ? result.train
                                                                            : result.validation;
    split.instances.push_back(std::move(*item));
  }
  return result;
}

std::string listops_text(const instance& item) {
  std::string text;
  for (int32_t token : item.tokens) {
    if (token == listops_node_token) continue;
    if (!text.empty()) text += ' ';
    text += token >= 0 && token < listops_node_token ? token_names[token] : "?";
  }
  return text;
}

std::optional<instance> parse_listops(const std::string& text, std::string* error) {
  std::istringstream words(text);
  std::vector<int32_t> tokens;
  for (std::string word; words >> word;) {
    if (word == "(" || word == ")") continue;
    const auto* name = std::find_if(std::begin(token_names), std::end(token_names),
                                    [&word](const char* known) { return word == known; });
    if (name == std::end(token_names)) {
      *error = "unknown token '" + word + "'";
      return std::nullopt;
    }
    tokens.push_back(static_cast<int32_t>(name - std::begin(token_names)));
  }
  return tree_builder(tokens, error).build();
}

bool save_listops(const std::string& path, const instance_dataset& data, std::string* error) {
  std::ofstream file(path);
  for (const instance& item : data.instances)
    file << (item.labels.empty() ? -1 : item.labels[0]) << '\t' << listops_text(item) << '\n';
  file.flush();
  if (!file) *error = "cannot write '" + path + "': " + std::strerror(errno);
  return static_cast<bool>(file);
}

std::optional<instance_dataset> load_listops(const std::string& path, std::string* error) {
  const std::string problem = regular_file_problem(path);
  if (!problem.empty()) {
    *error = problem;
    return std::nullopt;
  }
  std::ifstream file(path);
  if (!file) {
    *error = "cannot open '" + path + "': " + std::strerror(errno);
    return std::nullopt;
  }
  instance_dataset data = empty_listops("listops");
  std::string line;
  for (int64_t number = 1; std::getline(file, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string why;
    std::optional<instance> item = parse_line(line, &why);
    if (!item) {
      *error = path + ":" + std::to_string(number) + ": " + why;
      return std::nullopt;
    }
    data.instances.push_back(std::move(*item));
  }
  return data;
}

}  // namespace troupe::layers
