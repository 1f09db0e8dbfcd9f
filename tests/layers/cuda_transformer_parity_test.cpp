// The CUDA backend's transformer operations against the CPU reference: batched GEMMs read
// through row strides (attention's layout), layer normalization, the causal softmax, the
// embedding gather and its deterministic scatter, and whole transformer blocks. Each test skips
// itself without a CUDA device.

#include "layers/layer.h"
#include "tests/layers/cuda_test_support.h"

namespace troupe::layers {
namespace {

using namespace cuda_testing;

TEST(CudaTransformerParityTest, GemmBatchedThroughRowStrides) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  // Four heads of width 8 side by side in rows of 3 × 32 (queries, keys, values), T = 12.
  const int t = 12, width = 32, heads = 4, head = 8;
  const auto qkv = random_values(size_t(t) * 3 * width, 301);
  for (transpose tb : {transpose::no, transpose::yes}) {
    expect_parity(
        pair,
        [&](backend& device) {
          device_array<float> in(device, qkv), scores(device, size_t(heads) * t * t);
          const stream s = device.default_stream();
          // Q K^T per head (tb = yes), or Q times the first t×t block read as B (tb = no).
          device.gemm_batched(s, transpose::no, tb, t, t, head, 0.5f, in.data(), 3 * width, head,
                              in.data() + width, 3 * width, head, 0.0f, scores.data(), t,
                              int64_t(t) * t, heads);
          return outputs{scores.download()};
        },
        summed(head), "gemm_batched");
  }
}

TEST(CudaTransformerParityTest, LayerNormForwardAndBackward) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const int rows = 37, cols = 96;
  const auto x = random_values(size_t(rows) * cols, 311, -3.0f, 3.0f);
  const auto gamma = random_values(cols, 312, 0.5f, 1.5f);
  const auto beta = random_values(cols, 313);
  const auto dy = random_values(size_t(rows) * cols, 314);
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> in(device, x), g(device, gamma), b(device, beta), y(device, x.size()),
            normalized(device, x.size()), rstd(device, rows), grad(device, dy),
            dx(device, x.size());
        const stream s = device.default_stream();
        device.layer_norm_forward(s, in.data(), g.data(), b.data(), y.data(), normalized.data(),
                                  rstd.data(), rows, cols, 1e-5f);
        device.layer_norm_backward(s, grad.data(), g.data(), normalized.data(), rstd.data(),
                                   dx.data(), rows, cols);
        return outputs{y.download(), normalized.download(), rstd.download(), dx.download()};
      },
      summed(cols), "layer_norm");
}

TEST(CudaTransformerParityTest, CausalSoftmaxAndItsGradient) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const int batch = 6, t = 45;
  const auto scores = random_values(size_t(batch) * t * t, 321, -6.0f, 6.0f);
  const auto dp = random_values(scores.size(), 322);
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> in(device, scores), p(device, scores.size()), grad(device, dp),
            ds(device, scores.size());
        const stream s = device.default_stream();
        device.causal_softmax_forward(s, in.data(), p.data(), batch, t, 0.25f);
        device.softmax_backward(s, p.data(), grad.data(), ds.data(), batch * t, t, 0.25f);
        const std::vector<float> probabilities = p.download();
        for (int r = 0; r < batch * t; ++r) {
          for (int j = r % t + 1; j < t; ++j) EXPECT_EQ(probabilities[size_t(r) * t + j], 0.0f);
        }
        return outputs{probabilities, ds.download()};
      },
      summed(t), "causal_softmax");
}

TEST(CudaTransformerParityTest, EmbeddingGatherAndDeterministicScatter) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const int vocab = 50, dim = 24, count = 300;
  std::vector<float> ids(count);
  random_generator generator(331);
  for (float& id : ids) id = static_cast<float>(generator.below(vocab));
  ids[7] = -1.0f;         // outside the vocabulary: a row of zeros, no gradient
  ids[8] = float(vocab);  // likewise
  const auto table = random_values(size_t(vocab) * dim, 332);
  const auto dout = random_values(size_t(count) * dim, 333);
  const auto previous = random_values(table.size(), 334);
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> id(device, ids), weights(device, table), out(device, dout.size()),
            grad(device, dout), accumulated(device, previous), fresh(device, table.size());
        const stream s = device.default_stream();
        device.embedding_forward(s, id.data(), weights.data(), out.data(), count, dim, vocab);
        device.embedding_backward(s, id.data(), grad.data(), accumulated.data(), count, dim, vocab,
                                  1.0f);
        device.embedding_backward(s, id.data(), grad.data(), fresh.data(), count, dim, vocab, 0.0f);
        const std::vector<float> once = fresh.download();
        device.embedding_backward(s, id.data(), grad.data(), fresh.data(), count, dim, vocab, 0.0f);
        EXPECT_EQ(fresh.download(), once) << "the scatter adds in a fixed order";
        return outputs{out.download(), accumulated.download(), once};
      },
      summed(count / double(vocab)), "embedding");
}

/// Forward and backward of one block type on `device`, from the seed's weights: the output, the
/// input gradient and every parameter gradient. The input holds whole samples; with `segments`,
/// they are packed sequences (run_options::segments).
outputs block_pass(backend& device, const layer_spec& spec, const shape& sample,
                   const std::vector<float>& input, const std::vector<float>& upstream,
                   const std::vector<int64_t>& segments = {}) {
  const stream s = device.default_stream();
  auto layer = make_layer(device, s, spec, sample, 77, 3);
  shape dims{int64_t(input.size()) / element_count(sample)};
  dims.insert(dims.end(), sample.begin(), sample.end());
  run_options options{s, pass_mode::training, 55, 0};
  if (!segments.empty()) options.segments = std::make_shared<const std::vector<int64_t>>(segments);
  auto result = layer->forward(options, tensor::from_host(device, s, dims, input));
  outputs values{result.output.to_host(s)};
  tensor gradient = layer->backward(options, *result.context,
                                    tensor::from_host(device, s, result.output.dims(), upstream),
                                    spec.type != "embedding");
  if (!gradient.empty()) values.push_back(gradient.to_host(s));
  for (parameter* p : layer->parameters()) values.push_back(p->gradient.to_host(s));
  return values;
}

TEST(CudaTransformerParityTest, WholeBlocks) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  layer_spec block;
  block.type = "transformer_block";
  block.heads = 4;
  block.dropout = 0.1f;
  layer_spec head;
  head.type = "lm_head";
  head.vocab = 40;
  head.bias = false;
  layer_spec norm;
  norm.type = "layernorm";
  const shape tokens{16, 32};
  const auto x = random_values(2 * 16 * 32, 341);
  for (const layer_spec& spec : {block, head, norm}) {
    shape out;
    std::string error;
    ASSERT_TRUE(infer_output_shape(spec, tokens, &out, &error)) << error;
    const auto upstream = random_values(2 * size_t(element_count(out)), 342);
    expect_parity(
        pair, [&](backend& device) { return block_pass(device, spec, tokens, x, upstream); },
        summed(128), spec.type);
  }
  layer_spec embedding;
  embedding.type = "embedding";
  embedding.vocab = 30;
  embedding.dim = 32;
  std::vector<float> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = float((i * 7) % 30);
  const auto upstream = random_values(2 * 16 * 32, 343);
  expect_parity(
      pair, [&](backend& device) { return block_pass(device, embedding, {16}, ids, upstream); },
      summed(4), "embedding");
}

TEST(CudaTransformerParityTest, PackedSequences) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  // Four sequences of 5, 1, 16 and 7 tokens, one token per row as a model graph packs them.
  const std::vector<int64_t> segments{0, 5, 6, 22, 29};
  layer_spec block;
  block.type = "transformer_block";
  block.heads = 4;
  block.dropout = 0.1f;
  const auto x = random_values(29 * 32, 344);
  const auto upstream = random_values(29 * 32, 345);
  expect_parity(
      pair,
      [&](backend& device) {
        return block_pass(device, block, {1, 32}, x, upstream, segments);
      },
      summed(128), "packed transformer_block");
  layer_spec embedding;
  embedding.type = "embedding";
  embedding.vocab = 30;
  embedding.dim = 32;
  embedding.positions = 16;
  std::vector<float> ids(29);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = float((i * 7) % 30);
  expect_parity(
      pair,
      [&](backend& device) { return block_pass(device, embedding, {1}, ids, upstream, segments); },
      summed(4), "packed embedding");
}

}  // namespace
}  // namespace troupe::layers
