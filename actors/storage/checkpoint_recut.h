#pragma once

// A checkpoint resumed by a job cut into other stages: parallelism.stages (or the partition's
// cut points) changed since it was written. Every stage's weights and optimizer state are
// joined into whole-model tensors by name (the parts of a layer that a partition cut join in
// stage order, row after row) and cut again at the new partition's points, cuts inside a layer
// included, so that the run goes on as the uninterrupted one would. Replicas need nothing of
// this: a checkpoint holds one copy of each stage, which every replica loads.

#include <optional>
#include <string>

#include "actors/config/job_config.h"
#include "actors/storage/checkpoint_store.h"

namespace troupe::actors {

/// Whether `checkpoint` was written by a partition other than `config`'s (another stage count,
/// or stages that hold other blocks).
bool needs_recut(const loaded_checkpoint& checkpoint, const job_config& config);

/// `checkpoint` with one shard per stage of `config`'s partition (and its manifest's stage
/// count and shard entries to match, checksums included). Only a checkpoint whose stages
/// agree on their weight version and optimizer steps, with no gradients accumulated towards
/// a step, can be re-cut (a sync run's, or an async one with one stage): an async pipeline's
/// stages are at different versions. Nothing, with `error` saying why, otherwise.
std::optional<loaded_checkpoint> recut_checkpoint(const loaded_checkpoint& checkpoint,
                                                  const job_config& config, std::string* error);

}  // namespace troupe::actors
