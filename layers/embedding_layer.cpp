#include <algorithm>
#include <cmath>

#include "layers/check.h"
#include "layers/layer_kinds.h"
#include "layers/random.h"

namespace troupe::layers {
namespace {

struct embedding_context final : layer_context {
  tensor ids;
  /// The forward pass's run_options::segments, when its positions counted within them.
  std::shared_ptr<const std::vector<int64_t>> segments;
};

/// Calls each(first, count) for every sequence of `segments`: its first token and how many of
/// its tokens have a learned position (at most `positions`).
template <typename Each>
void for_each_sequence(const std::vector<int64_t>& segments, int positions, Each each) {
  for (size_t i = 0; i + 1 < segments.size(); ++i) {
    const int64_t count = std::min<int64_t>(segments[i + 1] - segments[i], positions);
    if (count > 0) each(segments[i], count);
  }
}

/// Token embeddings plus learned positions: a sample of T token ids (exact integers carried as
/// float32, the payload type of every key) becomes T rows of `dim` features,
/// weight[id] + position[t]. Ids outside [0, vocab) embed as zeros; the job's checks keep
/// them from happening. With run_options::segments and explicit `positions`, t counts from 0 in
/// each sequence (a model graph's instance), and tokens past `positions` get no position (the
/// job's checks keep that from happening too).
class embedding_layer final : public layer {
 public:
  embedding_layer(backend& device, stream s, const layer_spec& spec, const shape& input,
                  const shape& output, uint64_t seed)
      : layer(input, output),
        vocab_(spec.vocab),
        dim_(spec.dim),
        length_(static_cast<int>(input[0])),
        positions_(spec.positions > 0 ? spec.positions : static_cast<int>(input[0])),
        explicit_positions_(spec.positions > 0) {
    // GPT-2's scale, N(0, 0.02^2), as a uniform of the same deviation.
    random_generator generator(seed);
    const float bound = 0.02f * std::sqrt(3.0f);
    weight_ = make_uniform_parameter(device, s, "weight", {vocab_, dim_}, bound, generator);
    position_ = make_uniform_parameter(device, s, "position", {positions_, dim_}, bound, generator);
  }

  const char* type() const override { return "embedding"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    backend& device = input.device();
    const int batch = static_cast<int>(input.rows());
    tensor output(device, batched(batch, output_shape()));
    device.embedding_forward(options.work_stream, input.data(), weight_.value.data(), output.data(),
                             static_cast<int>(input.size()), dim_, vocab_);
    auto context = std::make_unique<embedding_context>();
    if (options.segments && explicit_positions_) {
      TROUPE_CHECK(options.segments->back() == int64_t(batch) * length_);
      for_each_sequence(*options.segments, positions_, [&](int64_t first, int64_t count) {
        device.axpy(options.work_stream, 1.0f, position_.value.data(), output.data() + first * dim_,
                    size_t(count) * dim_);
      });
      context->segments = options.segments;
    } else {
      device.add_row_vector(options.work_stream, output.data(), position_.value.data(), batch,
                            length_ * dim_);
    }
    if (options.mode == pass_mode::training) context->ids = input;
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    const auto& saved = static_cast<embedding_context&>(context);
    const tensor& ids = saved.ids;
    backend& device = ids.device();
    const stream s = options.work_stream;
    device.embedding_backward(s, ids.data(), output_gradient.data(), weight_.gradient.data(),
                              static_cast<int>(ids.size()), dim_, vocab_,
                              weight_.accumulate_beta());
    weight_.has_gradient = true;
    if (saved.segments) {
      position_backward_per_sequence(s, *saved.segments, output_gradient);
    } else {
      position_backward(s, static_cast<int>(ids.rows()), output_gradient);
    }
    position_.has_gradient = true;
    // Token ids have no gradient; a caller that asks gets zeros of the input's shape.
    if (!need_input_gradient) return tensor();
    return tensor::filled(device, s, ids.dims(), 0.0f);
  }

  std::vector<parameter*> parameters() override { return {&weight_, &position_}; }

 private:
  /// Every sample's tokens at positions [0, length).
  void position_backward(stream s, int batch, const tensor& output_gradient) {
    backend& device = output_gradient.device();
    device.sum_rows(s, output_gradient.data(), batch, length_ * dim_, position_.accumulate_beta(),
                    position_.gradient.data());
    if (!position_.has_gradient && positions_ > length_) {
      // Positions past this input's length received nothing.
      device.fill(s, position_.gradient.data() + int64_t(length_) * dim_, 0.0f,
                  size_t(positions_ - length_) * dim_);
    }
  }

  /// Each sequence's tokens at positions counted from 0 in it.
  void position_backward_per_sequence(stream s, const std::vector<int64_t>& segments,
                                      const tensor& output_gradient) {
    backend& device = output_gradient.device();
    if (!position_.has_gradient)
      device.fill(s, position_.gradient.data(), 0.0f, size_t(positions_) * dim_);
    for_each_sequence(segments, positions_, [&](int64_t first, int64_t count) {
      device.axpy(s, 1.0f, output_gradient.data() + first * dim_, position_.gradient.data(),
                  size_t(count) * dim_);
    });
  }

  int vocab_;
  int dim_;
  int length_;
  int positions_;
  bool explicit_positions_;
  parameter weight_;
  parameter position_;
};

}  // namespace

std::unique_ptr<layer> make_embedding_layer(backend& device, stream s, const layer_spec& spec,
                                            const shape& input, const shape& output,
                                            uint64_t seed) {
  return std::make_unique<embedding_layer>(device, s, spec, input, output, seed);
}

}  // namespace troupe::layers
