#pragma once

// Layer types beyond the built-in ones, registered by a program that embeds troupe (see
// troupe.h): a job file names them like any other block, with keys of their own, and every
// stage of the process builds them. Built-in types are not in the registry; their names are
// taken.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/layer.h"

namespace troupe::layers {

/// What troupe needs to know of a layer type it does not build in.
struct custom_layer_type {
  /// Keys its blocks take besides `type`, each a number (default 0), read into
  /// layer_spec::options; `out` and `bias` are taken too when `uses_out` is set.
  std::vector<std::string> options;
  bool uses_out = false;
  /// The per-sample output shape for `input`; false with `error` (one line) when the block
  /// does not fit its input.
  std::function<bool(const layer_spec& spec, const shape& input, shape* output, std::string* error)>
      output_shape;
  /// The layer on `device` (its parameters initialized on stream `s`, drawn from `seed`
  /// alone, as the built-in layers do).
  std::function<std::unique_ptr<layer>(backend& device, stream s, const layer_spec& spec,
                                       const shape& input, const shape& output, uint64_t seed)>
      make;
  /// Trainable values for `input` (partitioning balances stages by them); none by default.
  std::function<int64_t(const layer_spec& spec, const shape& input)> parameter_count;
};

/// The names of the built-in layer types.
const std::vector<std::string>& built_in_layer_types();

/// Registers `name` for job files and stages. False, with `error`, when the name is empty, a
/// built-in type's or already registered, or `type` lacks output_shape or make. Register
/// before parsing the jobs that use it; registration is not synchronized with that.
bool register_layer_type(const std::string& name, custom_layer_type type, std::string* error);

/// The registered type `name`, or null.
const custom_layer_type* find_custom_layer_type(const std::string& name);

/// Every name a block's `type` may take: the built-in ones, then the registered ones.
std::vector<std::string> layer_type_names();

}  // namespace troupe::layers
