#include "actors/engine/recovery.h"

namespace troupe::actors {

bool recovery::lost(const nlohmann::json& who, const nlohmann::json& stages, double now_s,
                    nlohmann::json* event, std::string* reason) {
  if (restarts_ >= limit_) {
    *reason = "after " + std::to_string(restarts_) +
              " restarts (checkpoint.max_restarts = " + std::to_string(limit_) + ")";
    return false;
  }
  ++restarts_;
  if (!under_way_) lost_at_s_ = now_s;  // a second loss while recovering extends the same one
  under_way_ = true;
  *event = who.is_object() ? who : nlohmann::json::object();
  (*event)["event"] = "worker_lost";
  (*event)["stages"] = stages;
  (*event)["restart"] = restarts_;
  return true;
}

nlohmann::json recovery::recovered(int64_t step, double now_s) {
  under_way_ = false;
  return {{"event", "recovered"},
          {"restart", restarts_},
          {"resumed_from_step", step},
          {"seconds", now_s - lost_at_s_}};
}

}  // namespace troupe::actors
