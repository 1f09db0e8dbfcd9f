#include "layers/loss.h"

#include <cmath>

#include "layers/check.h"

namespace troupe::layers {

loss_output softmax_cross_entropy(stream s, const tensor& logits, const int_tensor& labels,
                                  float gradient_scale, bool want_gradient) {
  TROUPE_CHECK(logits.dims().size() == 2);
  TROUPE_CHECK(labels.size() == logits.rows());
  backend& device = logits.device();
  loss_output output;
  output.statistics = tensor(device, {2});
  if (want_gradient) output.gradient = tensor(device, logits.dims());
  device.softmax_cross_entropy(s, logits.data(), labels.data(), static_cast<int>(logits.rows()),
                               static_cast<int>(logits.row_size()), gradient_scale,
                               want_gradient ? output.gradient.data() : nullptr,
                               output.statistics.data(), output.statistics.data() + 1);
  return output;
}

loss_totals read_totals(stream s, const loss_output& output) {
  std::vector<float> values = output.statistics.to_host(s);
  return {values[0], static_cast<int64_t>(std::lround(values[1]))};
}

}  // namespace troupe::layers
