#include "apps/commands.h"

namespace troupe::apps {

int run_bench_checkpoint(const bench_options&) { return 1; }

}  // namespace troupe::apps
