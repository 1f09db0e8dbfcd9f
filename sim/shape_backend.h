#pragma once

// A backend that holds shapes, not numbers: allocation hands out one shared dummy block and
// every kernel does nothing. The simulator's timing-only mode carries its payloads as tensors
// of this backend, so messages keep their real shapes (and byte sizes) at no memory cost.
// Nothing may read a tensor of this backend.

#include "layers/backend.h"

namespace troupe::sim {

/// The process-wide shape backend.
layers::backend& shape_backend();

}  // namespace troupe::sim
