#include "actors/config/job_config.h"

#include <nlohmann/json.hpp>

#include "layers/gemm_precision.h"

namespace troupe::actors {
namespace {

/// The name `choice_names<E>()` gives `value`.
template <typename E>
const char* name_of(E value) {
  for (const named_choice<E>& choice : choice_names<E>()) {
    if (choice.value == value) return choice.name;
  }
  return "?";  // unreachable: every value has a name
}

}  // namespace

template <>
const std::vector<named_choice<dataset_kind>>& choice_names() {
  static const std::vector<named_choice<dataset_kind>> names = {
      {dataset_kind::fashion_mnist, "fashion-mnist"},
      {dataset_kind::synthetic, "synthetic"},
      {dataset_kind::text, "text"},
      {dataset_kind::text_records, "text-records"},
      {dataset_kind::listops, "listops"}};
  return names;
}

template <>
const std::vector<named_choice<padding_kind>>& choice_names() {
  static const std::vector<named_choice<padding_kind>> names = {{padding_kind::none, "none"},
                                                                {padding_kind::longest, "longest"}};
  return names;
}

template <>
const std::vector<named_choice<pipeline_mode>>& choice_names() {
  static const std::vector<named_choice<pipeline_mode>> names = {{pipeline_mode::sync, "sync"},
                                                                 {pipeline_mode::async, "async"}};
  return names;
}

template <>
const std::vector<named_choice<pipeline_schedule>>& choice_names() {
  static const std::vector<named_choice<pipeline_schedule>> names = {
      {pipeline_schedule::gpipe, "gpipe"},
      {pipeline_schedule::one_f_one_b, "1f1b"},
      {pipeline_schedule::zb_h1, "zb-h1"},
      {pipeline_schedule::interleaved, "interleaved"}};
  return names;
}

template <>
const std::vector<named_choice<staleness_correction_kind>>& choice_names() {
  static const std::vector<named_choice<staleness_correction_kind>> names = {
      {staleness_correction_kind::none, "none"},
      {staleness_correction_kind::pipemare, "pipemare"},
      {staleness_correction_kind::two_bw, "2bw"},
      {staleness_correction_kind::predict, "predict"},
      {staleness_correction_kind::nesterov, "nesterov"}};
  return names;
}

template <>
const std::vector<named_choice<collective_kind>>& choice_names() {
  static const std::vector<named_choice<collective_kind>> names = {
      {collective_kind::ring, "ring"},
      {collective_kind::nccl, "nccl"},
      {collective_kind::shared_memory, "shared_memory"}};
  return names;
}

template <>
const std::vector<named_choice<lr_schedule_kind>>& choice_names() {
  static const std::vector<named_choice<lr_schedule_kind>> names = {
      {lr_schedule_kind::constant, "constant"},
      {lr_schedule_kind::cosine, "cosine"},
      {lr_schedule_kind::step, "step"}};
  return names;
}

template <>
const std::vector<named_choice<node_route>>& choice_names() {
  static const std::vector<named_choice<node_route>> names = {
      {node_route::chain, "chain"}, {node_route::loop, "loop"}, {node_route::tree, "tree"}};
  return names;
}

template <>
const std::vector<named_choice<node_emit>>& choice_names() {
  static const std::vector<named_choice<node_emit>> names = {{node_emit::every, "every"},
                                                             {node_emit::root, "root"}};
  return names;
}

// The layers' own enums keep their own names (layers::to_string).

template <>
const std::vector<named_choice<layers::optimizer_kind>>& choice_names() {
  using layers::optimizer_kind;
  static const std::vector<named_choice<optimizer_kind>> names = {
      {optimizer_kind::sgd, to_string(optimizer_kind::sgd)},
      {optimizer_kind::adam, to_string(optimizer_kind::adam)},
      {optimizer_kind::adamw, to_string(optimizer_kind::adamw)}};
  return names;
}

template <>
const std::vector<named_choice<layers::math_precision>>& choice_names() {
  using layers::math_precision;
  static const std::vector<named_choice<math_precision>> names = {
      {math_precision::fp32, to_string(math_precision::fp32)},
      {math_precision::tf32, to_string(math_precision::tf32)},
      {math_precision::bf16, to_string(math_precision::bf16)}};
  return names;
}

const char* to_string(dataset_kind value) { return name_of(value); }
const char* to_string(padding_kind value) { return name_of(value); }
const char* to_string(pipeline_mode value) { return name_of(value); }
const char* to_string(pipeline_schedule value) { return name_of(value); }
const char* to_string(staleness_correction_kind value) { return name_of(value); }
const char* to_string(collective_kind value) { return name_of(value); }
const char* to_string(lr_schedule_kind value) { return name_of(value); }
const char* to_string(node_route value) { return name_of(value); }
const char* to_string(node_emit value) { return name_of(value); }

void to_json(nlohmann::json& json, dataset_kind value) { json = to_string(value); }
void to_json(nlohmann::json& json, padding_kind value) { json = to_string(value); }
void to_json(nlohmann::json& json, pipeline_mode value) { json = to_string(value); }
void to_json(nlohmann::json& json, pipeline_schedule value) { json = to_string(value); }
void to_json(nlohmann::json& json, staleness_correction_kind value) { json = to_string(value); }
void to_json(nlohmann::json& json, collective_kind value) { json = to_string(value); }
void to_json(nlohmann::json& json, lr_schedule_kind value) { json = to_string(value); }
void to_json(nlohmann::json& json, node_route value) { json = to_string(value); }
void to_json(nlohmann::json& json, node_emit value) { json = to_string(value); }

}  // namespace troupe::actors
