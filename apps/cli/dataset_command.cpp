// `troupe dataset JOB --out DIR`: the instances a dynamic model's job trains and is tested on,
// written for other tools (the PyTorch baselines read them), with the resolved job beside them.
// listops: DIR/train.tsv and DIR/test.tsv, lines "label<TAB>expression" (layers/listops.h);
// text-records: DIR/train.jsonl and DIR/test.jsonl, one {"labels": [...], "tokens": [...]}
// line per instance. DIR/config.json is the job as `troupe train` resolves it.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/storage/file_system.h"
#include "apps/cli/commands.h"
#include "layers/listops.h"

namespace troupe::apps {
namespace {

int bad_input(const std::string& message) {
  std::fprintf(stderr, "troupe dataset: %s\n", message.c_str());
  return 2;
}

/// One JSON line per instance: its tokens and its labels.
bool save_json_lines(const std::string& path, const layers::instance_dataset& data,
                     std::string* error) {
  std::ofstream file(path);
  for (const layers::instance& item : data.instances) {
    file << nlohmann::ordered_json{{"tokens", item.tokens}, {"labels", item.labels}}.dump() << '\n';
  }
  file.flush();
  if (!file) *error = "cannot write '" + path + "': " + std::strerror(errno);
  return static_cast<bool>(file);
}

/// Writes `split` to DIR/NAME.tsv (listops) or DIR/NAME.jsonl (text-records); the file's name.
std::string save_split(const actors::job_config& config, const layers::dataset& split,
                       const std::string& directory, const std::string& name, std::string* error) {
  const bool listops = config.data.dataset == actors::dataset_kind::listops;
  const std::string file = name + (listops ? ".tsv" : ".jsonl");
  const std::string path = directory + "/" + file;
  const bool written = listops ? layers::save_listops(path, *split.instances, error)
                               : save_json_lines(path, *split.instances, error);
  return written ? file : "";
}

}  // namespace

int run_dataset(const dataset_options& options) {
  actors::job_error problem;
  auto config = actors::load_job_file(options.job_file, options.overrides, &problem);
  if (!config) return bad_input(problem.message);
  const actors::dataset_kind kind = config->data.dataset;
  if (kind != actors::dataset_kind::listops && kind != actors::dataset_kind::text_records) {
    return bad_input(options.job_file + ": data.dataset is \"" + actors::to_string(kind) +
                     "\"; troupe dataset writes the instances of a graph model's data, "
                     "\"listops\" or \"text-records\"");
  }
  std::string error;
  auto data = actors::load_job_data(*config, &error);
  if (!data) return bad_input(options.job_file + ": " + error);
  actors::file_system& files = actors::posix_files();
  if (!files.create_directories(options.out_directory, &error)) return bad_input(error);
  const std::string train =
      save_split(*config, data->train, options.out_directory, "train", &error);
  if (train.empty()) return bad_input(error);
  const std::string test = save_split(*config, data->test, options.out_directory, "test", &error);
  if (test.empty()) return bad_input(error);
  if (!files.write_atomically(options.out_directory + "/config.json",
                              actors::to_json(*config).dump(2) + "\n", &error)) {
    return bad_input(error);
  }
  std::printf("wrote %lld training and %lld test instances of %s data to %s: %s, %s, config.json\n",
              static_cast<long long>(data->train.instances->count()),
              static_cast<long long>(data->test.instances->count()), actors::to_string(kind),
              options.out_directory.c_str(), train.c_str(), test.c_str());
  return 0;
}

}  // namespace troupe::apps
