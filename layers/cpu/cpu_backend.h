#pragma once

#include <memory>

#include "layers/backend.h"

namespace troupe::layers {

/// The reference backend on OpenBLAS. `threads` BLAS threads (0: every core). Streams and
/// events are no-ops: every operation has finished when its call returns.
std::unique_ptr<backend> make_cpu_backend(int threads);

}  // namespace troupe::layers
