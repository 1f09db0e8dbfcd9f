#include "actors/config/layer_cuts.h"

#include <algorithm>
#include <charconv>

namespace troupe::actors {
namespace {

using layers::layer_spec;

bool is_part(const layer_spec& spec) { return layers::is_cut_part(spec.type); }

/// Why block `spec` cannot be cut inside, or empty: a linear layer, or a convolution that keeps
/// its image's size (stride 1, padding (kernel - 1) / 2), whose input and output stack.
std::string uncuttable(const layer_spec& spec) {
  if (spec.type == "linear") return {};
  if (spec.type == "conv2d") {
    if (std::max(spec.stride, 1) == 1 && 2 * spec.padding + 1 == spec.kernel) return {};
    return "only a convolution that keeps its image's size (stride 1, padding (kernel - 1) / 2) "
           "can share its channels";
  }
  return "only a linear layer's outputs or a convolution's channels can be shared";
}

/// A whole number >= `least`, spaces around it allowed.
bool parse_number(const std::string& text, int64_t least, int64_t* value) {
  const size_t first = text.find_first_not_of(' ');
  if (first == std::string::npos) return false;
  const char* begin = text.data() + first;
  const char* end = text.data() + text.find_last_not_of(' ') + 1;
  const auto result = std::from_chars(begin, end, *value);
  return result.ec == std::errc() && result.ptr == end && *value >= least;
}

}  // namespace

bool parse_cut_points(const std::string& text, std::vector<cut_point>* cuts) {
  cuts->clear();
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, comma - start);
    const size_t colon = part.find(':');
    cut_point cut;
    if (colon == std::string::npos) {
      if (!parse_number(part, 1, &cut.block)) return false;
    } else if (!parse_number(part.substr(0, colon), 0, &cut.block) ||
               !parse_number(part.substr(colon + 1), 1, &cut.row)) {
      return false;  // a cut inside block 0 is one: the first stage then holds only its head
    }
    cuts->push_back(cut);
    start = comma + 1;
  }
  return !cuts->empty();
}

std::string cut_points_text(const std::vector<cut_point>& cuts) {
  std::string text;
  for (const cut_point& cut : cuts) {
    if (!text.empty()) text += ",";
    text += std::to_string(cut.block);
    if (cut.row > 0) text += ":" + std::to_string(cut.row);
  }
  return text;
}

std::string expand_cut_points(job_config* config) {
  parallelism_config& p = config->parallelism;
  std::vector<cut_point> cuts;
  if (!parse_cut_points(p.partition, &cuts)) return {};  // a named partition
  const std::string label = "parallelism.partition [" + p.partition + "]";
  if (cuts.size() + 1 != static_cast<size_t>(p.stages)) {
    return label + " makes " + std::to_string(cuts.size() + 1) +
           " stages but parallelism.stages is " + std::to_string(p.stages);
  }
  if (!config->model.nodes.empty()) {
    // A graph's cut points are node indices in the order rows visit the nodes; nothing expands.
    const auto nodes = static_cast<int64_t>(config->model.nodes.size());
    int64_t previous = 0;
    for (const cut_point& cut : cuts) {
      if (cut.row > 0 || cut.block <= previous || cut.block >= nodes) {
        return label + " must be increasing node indices in [1, " + std::to_string(nodes - 1) +
               "] (model.nodes has " + std::to_string(nodes) +
               " nodes, counted in the order rows visit them)";
      }
      previous = cut.block;
    }
    return {};
  }
  const std::vector<layer_spec>& written = config->model.layers;
  const auto count = static_cast<int64_t>(written.size());
  std::vector<int64_t> split_row(written.size(), 0);
  for (const cut_point& cut : cuts) {
    if (cut.block >= count || (cut.row == 0 && cut.block < 1)) {
      return label + " must be increasing cut points in [1, " + std::to_string(count - 1) +
             "] (model.layers has " + std::to_string(count) + " layers)";
    }
    if (cut.row == 0) continue;
    const layer_spec& spec = written[static_cast<size_t>(cut.block)];
    const std::string block = "model.layers[" + std::to_string(cut.block) + "] (" + spec.type + ")";
    if (const std::string why = uncuttable(spec); !why.empty()) {
      return label + " cuts inside " + block + ": " + why;
    }
    if (cut.row >= spec.out) {
      return label + " cuts " + block + " at output " + std::to_string(cut.row) +
             ", which has outputs 0 to " + std::to_string(spec.out - 1) + ": cut at 1 to " +
             std::to_string(spec.out - 1);
    }
    if (split_row[static_cast<size_t>(cut.block)] != 0) {
      return label + " cuts inside " + block + " twice: one cut per layer";
    }
    split_row[static_cast<size_t>(cut.block)] = cut.row;
  }
  // Blocks of the expanded model, where each written block begins.
  std::vector<layer_spec> expanded;
  std::vector<int64_t> start(written.size());
  const bool any = std::any_of(split_row.begin(), split_row.end(), [](int64_t r) { return r; });
  for (size_t i = 0; i < written.size(); ++i) {
    start[i] = static_cast<int64_t>(expanded.size());
    layer_spec spec = written[i];
    if (any) spec.origin = static_cast<int>(i);
    if (split_row[i] == 0) {
      expanded.push_back(spec);
      continue;
    }
    spec.split = static_cast<int>(split_row[i]);
    const std::string type = spec.type;
    spec.type = type + "_head";
    expanded.push_back(spec);
    spec.type = type + "_tail";
    expanded.push_back(spec);
  }
  std::string whole;
  int64_t previous = 0;
  for (const cut_point& cut : cuts) {
    const int64_t index = start[static_cast<size_t>(cut.block)] + (cut.row > 0 ? 1 : 0);
    if (index <= previous) {
      return label + " must be increasing cut points in [1, " + std::to_string(count - 1) + "]";
    }
    whole += (whole.empty() ? "" : ",") + std::to_string(index);
    previous = index;
  }
  config->model.layers = std::move(expanded);
  p.partition = whole;
  return {};
}

std::map<std::string, std::pair<int64_t, int64_t>> cut_layer_rows(const job_config& config,
                                                                  size_t first, size_t last) {
  std::map<std::string, std::pair<int64_t, int64_t>> rows;
  const std::vector<layer_spec>& blocks = config.model.layers;
  for (size_t i = first; i < last && i < blocks.size(); ++i) {
    if (!is_part(blocks[i])) continue;
    const int64_t from = layers::is_cut_head(blocks[i].type) ? 0 : blocks[i].split;
    rows[layers::uncut_type(blocks[i].type) + std::to_string(blocks[i].origin)] = {from,
                                                                                   blocks[i].out};
  }
  return rows;
}

std::string written_bound(const job_config& config, size_t index) {
  const std::vector<layer_spec>& blocks = config.model.layers;
  size_t written = index;
  for (size_t i = 0; i < index && i < blocks.size(); ++i) {
    if (layers::is_cut_tail(blocks[i].type)) --written;
  }
  if (index < blocks.size() && layers::is_cut_tail(blocks[index].type)) {
    return std::to_string(written - 1) + ":" + std::to_string(blocks[index].split);
  }
  return std::to_string(written);
}

job_config written_job(const job_config& config) {
  const std::vector<layer_spec>& expanded = config.model.layers;
  if (std::none_of(expanded.begin(), expanded.end(), is_part)) return config;
  job_config written = config;
  written.model.layers.clear();
  for (layer_spec spec : expanded) {
    if (layers::is_cut_tail(spec.type)) continue;
    spec.type = layers::uncut_type(spec.type);
    spec.split = 0;
    spec.origin = -1;
    written.model.layers.push_back(spec);
  }
  std::vector<cut_point> cuts;
  if (!parse_cut_points(config.parallelism.partition, &cuts)) return written;
  for (cut_point& cut : cuts) {
    const layer_spec& spec = expanded[static_cast<size_t>(cut.block)];
    if (layers::is_cut_tail(spec.type)) cut.row = spec.split;
    if (spec.origin >= 0) cut.block = spec.origin;
  }
  written.parallelism.partition = cut_points_text(cuts);
  return written;
}

}  // namespace troupe::actors
