#pragma once

// What travels between the coordinator and the stages, as the state machines see it. The
// hosts translate these to and from transport frames (real runs) or event-queue entries
// (the simulator).

#include <cstdint>
#include <memory>
#include <vector>

#include "actors/engine/ring_all_reduce.h"
#include "layers/instance.h"
#include "layers/tensor.h"

namespace troupe::actors {

/// forward, backward, evaluate: a key's trip. step: in sync mode with global gradient clipping,
/// stage 0 tells the stages after it, one by one, to take the optimizer step they hold since
/// the step's last backward pass, clipped by the norm it carries. reduce: one piece of a ring
/// all-reduce with the same stage of the other replicas (`step`: the ring's round, `key`: its
/// ring step, `sample_offset`: the piece, `values`).
enum class key_kind { forward, backward, evaluate, step, reduce };

/// One key (a micro-batch) at one point of its trip through the pipeline.
struct key_message {
  key_kind kind = key_kind::forward;
  uint64_t key = 0;
  /// The optimizer step whose batch the key belongs to (names its dropout stream).
  int64_t step = 0;
  /// Index of the key's first sample within its step's batch.
  int64_t sample_offset = 0;
  /// forward/evaluate: the stage's input; backward: the gradient of the stage's output.
  layers::tensor payload;
  /// The key's labels, carried along to the last stage.
  std::shared_ptr<const std::vector<int32_t>> labels;
  /// A dynamic model's key (model.nodes): its instances, which every stage routes its rows by
  /// (actors/engine/graph_routes.h); the payload's rows stand for their parts or for them.
  std::shared_ptr<const std::vector<layers::instance>> instances;
  /// Sync mode with global clipping: on a step's last backward message, the squared gradient
  /// norms of the stages after the receiver, summed; on a step message, those of every stage.
  double norm_squared = 0;
  /// reduce: the chunk's values, in host memory.
  float_view values;
  /// Async mode with replicas, on a training key: the weight version that every replica's
  /// every stage had reached when the coordinator admitted it (the slowest replica's stage 0
  /// version; no stage is behind its own stage 0). A stage measures how far it runs ahead of
  /// its slowest replica against it.
  int64_t replica_floor = 0;
};

/// The reduce message that carries `chunk` to the next replica (round in `step`, ring step in
/// `key`, piece in `sample_offset`).
inline key_message reduce_message(const ring_chunk& chunk) {
  key_message message;
  message.kind = key_kind::reduce;
  message.key = static_cast<uint64_t>(chunk.step);
  message.step = chunk.round;
  message.sample_offset = chunk.piece;
  message.values = chunk.values;
  return message;
}

/// The chunk a reduce message carries.
inline ring_chunk chunk_of(const key_message& message) {
  return {message.step, static_cast<int>(message.key), static_cast<int>(message.sample_offset),
          message.values};
}

/// What a stage asks its host to do after handling a message.
struct stage_output {
  /// to_replica_peer: a reduce message for the same stage of the next replica (its ring).
  enum class kind { to_next_stage, to_previous_stage, retired, loss_report, to_replica_peer };
  kind what = kind::to_next_stage;
  key_message message;
  /// loss_report: totals of the key's samples.
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t samples = 0;
};

/// destination_of() for an output that goes to the coordinator.
inline constexpr int output_for_coordinator = -1;
/// destination_of() for an output that goes to the same stage of the next replica.
inline constexpr int output_for_replica_peer = -2;

/// Where an output of stage `stage` goes: the index of the stage it is for (in the same
/// replica), output_for_coordinator (reports: a key's loss, its retirement) or
/// output_for_replica_peer. The one routing rule that every host (the CAF actors, the
/// simulator, the test driver) follows.
inline int destination_of(int stage, const stage_output& output) {
  switch (output.what) {
    case stage_output::kind::to_next_stage:
      return stage + 1;
    case stage_output::kind::to_previous_stage:
      return stage - 1;
    case stage_output::kind::to_replica_peer:
      return output_for_replica_peer;
    default:
      return output_for_coordinator;
  }
}

}  // namespace troupe::actors
