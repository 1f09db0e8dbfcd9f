#pragma once

// troupe as a library: the supported API in one header. Installed with
// `cmake --install build --prefix P`, it is found by `find_package(troupe)` (CMAKE_PREFIX_PATH=P)
// and linked as troupe::engine. P/include/troupe holds this header and the ones it includes,
// nothing else: no CAF, ZeroMQ or engine internals, and no test hooks (cmake/install.cmake).
// apps/examples/custom_layer/ is a whole program that uses it.
//
// 1. A job: build an actors::job_config in code (every field has the job file's default), or
//    parse TOML text or a file, with --set style overrides:
//      auto config = troupe::actors::parse_job(toml_text, "my job", {"training.lr=0.05"},
//      &problem); auto config = troupe::actors::load_job_file("job.toml", {}, &problem);
// 2. A layer type of your own: derive from layers::layer (forward() returns the context that
//    backward() gets; gradients accumulate into parameters()) and register it before parsing
//    the jobs that name it; its keys come into layer_spec::options:
//      troupe::layers::register_layer_type("scaled_residual", type, &error);
// 3. Run it in this process, every stage an actor on its own backend:
//      auto data = troupe::actors::load_job_data(*config, &error);
//      troupe::steady_clock clock;  troupe::actors::quiet_observer observer;
//      auto report = troupe::actors::run_pipeline(*config, *data, observer, clock, {}, &error);
//    or across processes: actors::run_coordinator() in one, actors::run_worker() in each of the
//    others (actors/cluster/cluster_host.h), as `troupe coordinator` and `troupe worker` do.
// 4. Read the summary: report->summary.final_test_accuracy, .final_test_loss, .steps,
//    .samples_per_s, .time_to_target_s; report->stages holds each stage's statistics.
// Errors are values: a function that can fail returns an empty optional (or false) and says
// why in its `error` argument, naming the key, file or peer at fault.

#include "actors/cluster/cluster_host.h"
#include "actors/config/job_config.h"
#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/run_reports.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/hosts/steady_clock.h"
#include "layers/layer.h"
#include "layers/layer_registry.h"

namespace troupe {

/// The monotonic clock a real run reads its times from.
using steady_clock = actors::steady_clock;

}  // namespace troupe
