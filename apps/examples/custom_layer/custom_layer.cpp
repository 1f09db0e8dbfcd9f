// A layer type of one's own, trained by troupe as a library: a scaled residual linear layer,
// y = x + scale * (x W^T + b) with W square, between two built-in linear layers, on
// Fashion-MNIST in a 2-stage async pipeline. Builds against an installed troupe:
//   cmake -S apps/examples/custom_layer -B build-example -DCMAKE_PREFIX_PATH=PREFIX
// Usage: custom_layer [FASHION_MNIST_DIR]; prints the final test accuracy.

#include <troupe/troupe.h>
#include <cmath>
#include <cstdio>

namespace {

using namespace troupe;
using layers::tensor;
using layers::transpose;

struct saved_input final : layers::layer_context {
  tensor input;
};

class scaled_residual final : public layers::layer {
 public:
  scaled_residual(layers::backend& device, layers::stream s, const layers::layer_spec& spec,
                  const layers::shape& shape, uint64_t seed)
      : layer(shape, shape), width_(static_cast<int>(shape[0])), scale_(spec.options.at("scale")) {
    std::vector<float> values(size_t(width_) * width_);
    uint64_t state = seed;  // a small LCG: weights from the seed alone, on every stage
    for (float& v : values) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = (float(state >> 40) / float(1 << 24) - 0.5f) * 2.0f / std::sqrt(float(width_));
    }
    weight_ = {"weight", tensor::from_host(device, s, {width_, width_}, values),
               tensor(device, {width_, width_})};
    bias_ = {"bias", tensor::filled(device, s, {width_}, 0.0f), tensor(device, {width_})};
  }
  const char* type() const override { return "scaled_residual"; }

  layers::forward_result forward(const layers::run_options& o, const tensor& x) override {
    auto& device = x.device();
    const int batch = static_cast<int>(x.rows());
    tensor y(device, x.dims());
    device.copy_device_to_device(o.work_stream, y.data(), x.data(), sizeof(float) * x.size());
    device.gemm(o.work_stream, transpose::no, transpose::yes, batch, width_, width_, scale_,
                x.data(), width_, weight_.value.data(), width_, 1.0f, y.data(), width_);
    tensor scaled_bias(device, {width_});
    device.fill(o.work_stream, scaled_bias.data(), 0.0f, width_);
    device.axpy(o.work_stream, scale_, bias_.value.data(), scaled_bias.data(), width_);
    device.add_row_vector(o.work_stream, y.data(), scaled_bias.data(), batch, width_);
    auto context = std::make_unique<saved_input>();
    context->input = x;
    return {y, std::move(context)};
  }

  tensor backward(const layers::run_options& o, layers::layer_context& context, const tensor& dy,
                  bool need_input_gradient) override {
    const tensor& x = static_cast<saved_input&>(context).input;
    auto& device = x.device();
    const int batch = static_cast<int>(x.rows());
    device.gemm(o.work_stream, transpose::yes, transpose::no, width_, width_, batch, scale_,
                dy.data(), width_, x.data(), width_, weight_.accumulate_beta(),
                weight_.gradient.data(), width_);
    tensor bias_gradient(device, {width_});
    device.sum_rows(o.work_stream, dy.data(), batch, width_, 0.0f, bias_gradient.data());
    if (!bias_.has_gradient) device.fill(o.work_stream, bias_.gradient.data(), 0.0f, width_);
    device.axpy(o.work_stream, scale_, bias_gradient.data(), bias_.gradient.data(), width_);
    weight_.has_gradient = bias_.has_gradient = true;
    if (!need_input_gradient) return tensor();
    tensor dx(device, x.dims());  // dy + scale * dy W
    device.copy_device_to_device(o.work_stream, dx.data(), dy.data(), sizeof(float) * dy.size());
    device.gemm(o.work_stream, transpose::no, transpose::no, batch, width_, width_, scale_,
                dy.data(), width_, weight_.value.data(), width_, 1.0f, dx.data(), width_);
    return dx;
  }

  std::vector<layers::parameter*> parameters() override { return {&weight_, &bias_}; }

 private:
  int width_;
  float scale_;
  layers::parameter weight_, bias_;
};

const char* job = R"(
[model]
layers = [{ type = "flatten" }, { type = "linear", out = 256 }, { type = "relu" },
          { type = "scaled_residual", scale = 0.5 }, { type = "relu" },
          { type = "linear", out = 10 }]
[parallelism]
stages = 2
mode = "async"
[training]
batch_size = 64
lr = 0.05
momentum = 0.9
epochs = 1
)";

}  // namespace

int main(int argc, char** argv) {
  layers::custom_layer_type type;
  type.options = {"scale"};
  type.output_shape = [](const layers::layer_spec&, const layers::shape& input,
                         layers::shape* output, std::string* error) {
    if (input.size() != 1) return *error = "needs flat input features", false;
    *output = input;
    return true;
  };
  type.make = [](layers::backend& device, layers::stream s, const layers::layer_spec& spec,
                 const layers::shape& input, const layers::shape&, uint64_t seed) {
    return std::unique_ptr<layers::layer>(new scaled_residual(device, s, spec, input, seed));
  };
  type.parameter_count = [](const layers::layer_spec&, const layers::shape& input) {
    return input[0] * input[0] + input[0];
  };
  std::string error;
  if (!layers::register_layer_type("scaled_residual", type, &error)) {
    std::fprintf(stderr, "custom_layer: %s\n", error.c_str());
    return 1;
  }
  std::vector<std::string> overrides;
  if (argc > 1) overrides.push_back(std::string("data.path=\"") + argv[1] + "\"");
  actors::job_error problem;
  auto config = actors::parse_job(job, "custom_layer", overrides, &problem);
  if (!config) return std::fprintf(stderr, "custom_layer: %s\n", problem.message.c_str()), 2;
  auto data = actors::load_job_data(*config, &error);
  if (!data) return std::fprintf(stderr, "custom_layer: %s\n", error.c_str()), 2;
  steady_clock clock;
  actors::quiet_observer observer;
  auto report = actors::run_pipeline(*config, *data, observer, clock, {}, &error);
  if (!report) return std::fprintf(stderr, "custom_layer: %s\n", error.c_str()), 1;
  std::printf("custom_layer: 2-stage async, %lld steps, final_test_accuracy %.4f\n",
              static_cast<long long>(report->summary.steps), report->summary.final_test_accuracy);
  return 0;
}
