#pragma once

// The partition a run trains with, chosen once by the command that starts it, so that every
// process of the run (workers, cluster ranks) cuts the model alike.

#include <optional>
#include <string>

#include "actors/config/job_config.h"

namespace troupe::apps {

/// Seconds each block is timed for parallelism.partition = "measured".
inline constexpr double measured_seconds_per_block = 0.05;

/// Resolves parallelism.partition = "measured" in `config` into the cut points that timing every
/// block on the job's first device chooses; with `previous` naming a resolved config.json of the
/// same model on as many stages (the output of the run being resumed), into its cut points
/// instead, so that the run's checkpoints still fit. Returns the line that names the partition
/// and each stage's predicted share of the work, e.g. "partition (measured): stages [0,5)
/// [5,11); predicted share 62.6%, 37.4%", for every partition. Nothing, with `error` naming the
/// key, when the model cannot be cut or timed.
std::optional<std::string> choose_partition(actors::job_config* config, const std::string& previous,
                                            std::string* error);

/// When `config`'s partition is "balanced" and cutting inside layers (by the same estimate)
/// would lower the most costly stage's predicted share by 5 points or more, a line saying so
/// with the cut points to write, e.g. "troupe: cutting inside layers would lower the largest
/// stage's predicted share from 38.2% to 26.6%: parallelism.partition = [4, "4:688", "7:336"]
/// (or "measured", which times the blocks)"; "" otherwise.
std::string layer_cut_hint(const actors::job_config& config);

/// When `config` asks for the interleaved schedule with one chunk per worker (virtual_stages =
/// 1, which runs as 1F1B), a line saying so; "" otherwise.
/// With `in_table`, also when it interleaves (virtual_stages >= 2): a line saying on how many
/// workers its stages run, since the table's other rows give each stage a worker of its own.
std::string interleaving_note(const actors::job_config& config, bool in_table = false);

/// For the commands that predict rather than train (`troupe simulate`): parallelism.partition =
/// "measured" in `config` becomes the cut points that the cost model's estimate chooses, cuts
/// inside linear layers included, as `troupe train` would choose them by timing. Other
/// partitions stay. False, with `error` naming the key, when the model cannot be cut.
bool estimate_measured_partition(actors::job_config* config, std::string* error);

}  // namespace troupe::apps
