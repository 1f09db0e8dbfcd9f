#include "layers/loss.h"

#include <algorithm>
#include <cmath>

#include "layers/check.h"

namespace troupe::layers {

loss_output softmax_cross_entropy(stream s, const tensor& logits, const int_tensor& labels,
                                  float gradient_scale, bool want_gradient) {
  TROUPE_CHECK(logits.dims().size() >= 2);
  const int64_t classes = logits.dims().back();
  const int64_t rows = logits.size() / classes;
  TROUPE_CHECK(labels.size() == rows && rows % logits.rows() == 0);
  const int64_t rows_per_sample = rows / logits.rows();
  backend& device = logits.device();
  loss_output output;
  output.statistics = tensor(device, {2});
  if (want_gradient) output.gradient = tensor(device, logits.dims());
  device.softmax_cross_entropy(s, logits.data(), labels.data(), static_cast<int>(rows),
                               static_cast<int>(classes),
                               gradient_scale / static_cast<float>(rows_per_sample),
                               want_gradient ? output.gradient.data() : nullptr,
                               output.statistics.data(), output.statistics.data() + 1);
  return output;
}

int64_t counted_labels(const std::vector<int32_t>& labels) {
  return static_cast<int64_t>(labels.size()) -
         std::count(labels.begin(), labels.end(), ignored_label);
}

loss_totals read_totals(stream s, const loss_output& output) {
  std::vector<float> values = output.statistics.to_host(s);
  return {values[0], static_cast<int64_t>(std::lround(values[1]))};
}

}  // namespace troupe::layers
