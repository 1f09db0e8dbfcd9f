#include "actors/cluster/worker_peers.h"

#include <algorithm>

namespace troupe::actors {

using json = nlohmann::json;

std::string worker_peer::describe() const {
  std::string text = "worker pid " + std::to_string(pid) + " on " + host + " (stage";
  text += stages.size() == 1 ? " " : "s ";
  for (size_t i = 0; i < stages.size(); ++i) {
    text += (i ? "," : "") + std::to_string(stages[i]);
  }
  return text + ")";
}

worker_peer peer_from_hello(const json& body) {
  worker_peer peer;
  peer.address = body.value("address", "");
  peer.host = body.value("host", "?");
  peer.pid = body.value("pid", int64_t{0});
  peer.public_key = body.value("public_key", "");
  peer.echo = clock_stamps(body);
  return peer;
}

json clock_stamps(const json& body) {
  if (!body.contains("clock_s") || !body["clock_s"].is_number()) return json();
  return {{"sent_s", body["clock_s"]}, {"received_s", body.value("received_s", 0.0)}};
}

json with_stamps(json body, const worker_peer& worker, double now) {
  if (worker.echo.is_null()) return body;
  body["echo"] = worker.echo;
  body["sent_s"] = now;
  return body;
}

worker_peer* find_worker(std::vector<worker_peer>& workers, const std::string& address) {
  for (auto& worker : workers)
    if (worker.address == address) return &worker;
  return nullptr;
}

std::optional<size_t> ended_worker(const std::vector<worker_peer>& workers,
                                   std::vector<exited_worker>* ended, double now, double timeout_s,
                                   std::string* reason) {
  std::optional<size_t> found;
  for (auto process = ended->begin(); process != ended->end();) {
    auto worker = std::find_if(workers.begin(), workers.end(),
                               [&](const worker_peer& peer) { return peer.pid == process->pid; });
    if (worker == workers.end()) {
      process = ended->erase(process);
    } else if (!found) {
      found = static_cast<size_t>(worker - workers.begin());
      *reason = process->how;
      process = ended->erase(process);
    } else {
      ++process;
    }
  }
  if (found) return found;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (now - workers[i].last_heard > timeout_s) {
      *reason = "stopped responding " +
                std::to_string(static_cast<int>(now - workers[i].last_heard)) + " s ago";
      return i;
    }
  }
  return std::nullopt;
}

std::vector<hosting_process> hosting_processes(const std::vector<worker_peer>& workers) {
  std::vector<hosting_process> processes;
  for (const worker_peer& worker : workers) {
    processes.push_back(
        {worker.describe(), worker.host, worker.pid, worker.stages, worker.last_heard});
  }
  return processes;
}

}  // namespace troupe::actors
