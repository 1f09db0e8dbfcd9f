#pragma once

// The reference that a dynamic model's pipelined training must reproduce (sync mode, and async
// with one key in flight): the whole graph on one backend, every instance run alone, so that
// nothing of the pipeline's grouping of visits across instances or its cut into stages is in
// it. A key's loss is the mean over its rows (parts or instances); a step applies the mean over
// its keys (parallelism.micro_batches of them) of those means, as stage_settings'
// key_gradient_scale says.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/graph_program.h"
#include "actors/engine/sequential_trainer.h"
#include "layers/dataset.h"
#include "layers/optimizer.h"

namespace troupe::actors {

class graph_oracle {
 public:
  /// Builds every node of `config`'s graph (which must pass check_model_graph) on `device`.
  graph_oracle(const job_config& config, layers::backend& device);
  ~graph_oracle();
  graph_oracle(const graph_oracle&) = delete;
  graph_oracle& operator=(const graph_oracle&) = delete;

  /// One optimizer step on the keys of one batch: `keys` lists each key's instances.
  batch_totals train_step(const std::vector<std::vector<layers::instance>>& keys, int64_t step,
                          float learning_rate);
  /// Trains `steps` steps over `data` in the job's data order (the batches and micro-batches
  /// that training_run admits) with the job's learning-rate schedule.
  void train(const layers::dataset& data, int64_t steps);

  std::vector<layers::parameter*> parameters() { return program_->parameters(); }
  /// "cell.lstm_cell0.weight": each parameter's name, as a stage's checkpoint shard names it.
  std::vector<std::string> parameter_names() { return program_->parameter_names(); }
  layers::stream work_stream() const { return stream_; }

 private:
  /// Forward, loss and backward of one instance; its loss gradient scaled by `scale`.
  batch_totals run_instance(const layers::instance& item, int64_t step, float scale);

  const job_config& config_;
  layers::backend& device_;
  layers::stream stream_;
  std::unique_ptr<graph_program> program_;
  std::unique_ptr<layers::optimizer> optimizer_;
};

}  // namespace troupe::actors
