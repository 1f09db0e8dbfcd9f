#include "apps/commands.h"

namespace troupe::apps {

int run_inspect(const inspect_options&) { return 1; }

}  // namespace troupe::apps
