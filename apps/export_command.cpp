#include "apps/commands.h"

namespace troupe::apps {

int run_export(const export_options&) { return 1; }

}  // namespace troupe::apps
