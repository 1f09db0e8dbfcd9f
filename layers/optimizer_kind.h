#pragma once

// Which update rule an optimizer applies: a header of its own, so that a job's configuration
// names it without the optimizer itself.

namespace troupe::layers {

/// The update rule: PyTorch's SGD, Adam or AdamW (Adam with decoupled weight decay).
enum class optimizer_kind { sgd, adam, adamw };

/// "sgd", "adam" or "adamw", as a job file names it.
inline const char* to_string(optimizer_kind kind) {
  switch (kind) {
    case optimizer_kind::adam:
      return "adam";
    case optimizer_kind::adamw:
      return "adamw";
    case optimizer_kind::sgd:
      break;
  }
  return "sgd";
}

}  // namespace troupe::layers
