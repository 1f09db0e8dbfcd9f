#include "layers/cpu/cpu_backend.h"

#include <cblas.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "layers/block_cache.h"
#include "layers/check.h"
#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/cpu_recurrent_kernels.h"
#include "layers/cpu/cpu_thread_pool.h"
#include "layers/cpu/cpu_transformer_kernels.h"
#include "layers/gemm_precision.h"
#include "layers/out_of_memory.h"

namespace troupe::layers {

namespace {

constexpr size_t alignment = 64;

// Events carry no state on the CPU; their handles only need to be non-null.
char event_marker;

/// What a CPU stream remembers: work runs at once, so only settings and reusable scratch.
struct cpu_stream {
  math_precision gemm_precision = math_precision::fp32;
  /// Operands of reduced-precision GEMMs after rounding, reused from call to call.
  std::vector<float> rounded_a;
  std::vector<float> rounded_b;
};

CBLAS_TRANSPOSE to_cblas(transpose t) { return t == transpose::yes ? CblasTrans : CblasNoTrans; }

int resolve_threads(int threads) {
  TROUPE_CHECK(threads >= 0);
  if (threads > 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

void copy_bytes(void* target, const void* source, size_t bytes) {
  if (bytes > 0 && target != source) std::memmove(target, source, bytes);
}

void* allocate_block(size_t bytes) {
  void* pointer = std::aligned_alloc(alignment, bytes);
  if (pointer == nullptr) throw out_of_memory("host memory", bytes);
  return pointer;
}

/// Blocks of at least this many bytes are kept for reuse once freed: glibc maps such blocks
/// afresh from the kernel (above its mmap threshold), so every pass's im2col columns and
/// activations would otherwise fault in their pages again (a third of a CNN run's CPU time).
constexpr size_t cached_block_bytes = size_t(64) << 10;
/// At most this many freed bytes are kept per backend; beyond it blocks go back to malloc.
constexpr size_t cached_bytes_limit = size_t(256) << 20;

/// Below this many multiply-adds a GEMM runs on one thread: splitting costs more than it saves.
constexpr double parallel_gemm_threshold = 1 << 21;
/// Elementwise work is split only when each thread gets at least this many elements.
constexpr size_t parallel_elements_threshold = 1 << 14;

class cpu_backend final : public backend {
 public:
  /// OpenBLAS itself always runs single-threaded (a process-wide setting); this backend's own
  /// pool splits operations over `threads` cores.
  explicit cpu_backend(int threads) : pool_(resolve_threads(threads)) {
    openblas_set_num_threads(1);
  }

  std::string name() const override { return "cpu"; }
  device_kind kind() const override { return device_kind::cpu; }

  ~cpu_backend() override {
    blocks_.drain([](void* block) { std::free(block); });
  }

  /// Large blocks are kept for reuse once freed (see cached_block_bytes); smaller ones come
  /// from malloc, which already reuses them, and never touch the cache's lock.
  void* allocate(size_t bytes) override {
    const size_t rounded = std::max(alignment, (bytes + alignment - 1) / alignment * alignment);
    if (rounded < cached_block_bytes) return allocate_block(rounded);
    if (void* block = blocks_.take(rounded)) return block;
    void* pointer = allocate_block(rounded);
    blocks_.add(pointer, rounded);
    return pointer;
  }
  void deallocate(void* pointer) override {
    if (pointer == nullptr) return;
    // The cache noted every block of cached_block_bytes or more; a smaller one is freed without
    // a lookup (one malloc made a little larger is looked up, not found, and freed).
    if (malloc_usable_size(pointer) < cached_block_bytes || !blocks_.give_back(pointer)) {
      std::free(pointer);
    }
  }
  // Device memory is host memory here: the same allocator, thread-safe as malloc is.
  void* allocate_host(size_t bytes) override { return allocate(bytes); }
  void deallocate_host(void* pointer) override { deallocate(pointer); }
  void copy_host_to_device(stream, void* device, const void* host, size_t bytes) override {
    copy_bytes(device, host, bytes);
  }
  void copy_device_to_host(stream, void* host, const void* device, size_t bytes) override {
    copy_bytes(host, device, bytes);
  }
  void copy_device_to_device(stream, void* target, const void* source, size_t bytes) override {
    copy_bytes(target, source, bytes);
  }
  void fill(stream, float* data, float value, size_t count) override {
    std::fill_n(data, count, value);
  }

  stream default_stream() override { return stream{&default_stream_}; }
  stream create_stream() override { return stream{new cpu_stream}; }
  void destroy_stream(stream s) override {
    if (s.handle != &default_stream_) delete static_cast<cpu_stream*>(s.handle);
  }
  void synchronize(stream) override {}
  event create_event() override { return event{&event_marker}; }
  void destroy_event(event) override {}
  void record_event(event, stream) override {}
  void wait_event(stream, event) override {}
  void synchronize_event(event) override {}
  void set_gemm_precision(stream s, math_precision precision) override {
    state_of(s).gemm_precision = precision;
  }

  void gemm(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
            float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c,
            int ldc) override;

  void add_row_vector(stream, float* matrix, const float* vector, int rows, int cols) override {
    cpu::add_row_vector(matrix, vector, rows, cols);
  }
  void sum_rows(stream, const float* matrix, int rows, int cols, float beta, float* out) override {
    cpu::sum_rows(matrix, rows, cols, beta, out);
  }
  void add_channel_vector(stream, float* data, const float* vector, int batch, int channels,
                          int spatial) override {
    cpu::add_channel_vector(data, vector, batch, channels, spatial);
  }
  void sum_channels(stream, const float* data, int batch, int channels, int spatial, float beta,
                    float* out) override {
    cpu::sum_channels(data, batch, channels, spatial, beta, out);
  }
  void transpose_batched(stream, const float* in, float* out, int batch, int rows,
                         int cols) override {
    cpu::transpose_batched(in, out, batch, rows, cols);
  }
  void copy_matrix(stream, const float* source, int source_stride, float* target, int target_stride,
                   int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(target + int64_t(r) * target_stride, source + int64_t(r) * source_stride,
                  sizeof(float) * static_cast<size_t>(cols));
    }
  }
  void axpy(stream, float alpha, const float* x, float* y, size_t count) override {
    cpu::axpy(alpha, x, y, count);
  }
  void multiply(stream, const float* a, const float* b, float* out, size_t count) override {
    cpu::multiply(a, b, out, count);
  }
  void sum(stream, const float* x, size_t count, float* out) override { cpu::sum(x, count, out); }

  void gemm_batched(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
                    float alpha, const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                    int64_t stride_b, float beta, float* c, int ldc, int64_t stride_c,
                    int batch) override;

  void layer_norm_forward(stream, const float* x, const float* gamma, const float* beta, float* y,
                          float* normalized, float* rstd, int rows, int cols,
                          float epsilon) override {
    for_each_row_range(rows, cols, [&](int first, int last) {
      cpu::layer_norm_forward(x, gamma, beta, y, normalized, rstd, first, last, cols, epsilon);
    });
  }
  void layer_norm_backward(stream, const float* dy, const float* gamma, const float* normalized,
                           const float* rstd, float* dx, int rows, int cols) override {
    for_each_row_range(rows, cols, [&](int first, int last) {
      cpu::layer_norm_backward(dy, gamma, normalized, rstd, dx, first, last, cols);
    });
  }
  void causal_softmax_forward(stream, const float* scores, float* probabilities, int batch, int t,
                              float scale) override {
    for_each_row_range(batch * t, t, [&](int first, int last) {
      cpu::causal_softmax_forward(scores, probabilities, first, last, t, scale);
    });
  }
  void softmax_backward(stream, const float* probabilities, const float* dp, float* dscores,
                        int rows, int cols, float scale) override {
    for_each_row_range(rows, cols, [&](int first, int last) {
      cpu::softmax_backward(probabilities, dp, dscores, first, last, cols, scale);
    });
  }
  void lstm_cell_forward(stream, const lstm_cell_geometry& g, float* gates, const float* input,
                         float* output) override {
    for_each_row_range(g.rows, g.gate_width(), [&](int first, int last) {
      cpu::lstm_cell_forward(g, gates, input, output, first, last);
    });
  }
  void lstm_cell_backward(stream, const lstm_cell_geometry& g, const float* gates,
                          const float* input, const float* output, const float* output_gradient,
                          float* gate_gradient, float* input_gradient) override {
    for_each_row_range(g.rows, g.gate_width(), [&](int first, int last) {
      cpu::lstm_cell_backward(g, gates, input, output, output_gradient, gate_gradient,
                              input_gradient, first, last);
    });
  }
  void embedding_forward(stream, const float* ids, const float* table, float* out, int count,
                         int dim, int vocab) override {
    for_each_row_range(count, dim, [&](int first, int last) {
      cpu::embedding_forward(ids, table, out, first, last, dim, vocab);
    });
  }
  void embedding_backward(stream, const float* ids, const float* dout, float* table_gradient,
                          int count, int dim, int vocab, float beta) override {
    // Split by columns: every part walks the tokens in order, so sums keep their order.
    const int parts = std::min(pool_.threads(), std::max(1, dim / 16));
    if (parts <= 1 || size_t(count) * dim < parallel_elements_threshold) {
      cpu::embedding_backward(ids, dout, table_gradient, count, dim, vocab, beta, 0, dim);
      return;
    }
    pool_.run(parts, [&](int part) {
      cpu::embedding_backward(ids, dout, table_gradient, count, dim, vocab, beta,
                              static_cast<int>(cpu::split_point(dim, parts, part, 16)),
                              static_cast<int>(cpu::split_point(dim, parts, part + 1, 16)));
    });
  }

  void activation_forward(stream, activation f, const float* x, float* y, size_t count) override {
    for_each_range(count, [&](size_t begin, size_t end) {
      cpu::activation_forward(f, x + begin, y + begin, end - begin);
    });
  }
  void activation_backward(stream, activation f, const float* x, const float* y, const float* dy,
                           float* dx, size_t count) override {
    for_each_range(count, [&](size_t begin, size_t end) {
      cpu::activation_backward(f, x + begin, y + begin, dy + begin, dx + begin, end - begin);
    });
  }

  void softmax_cross_entropy(stream, const float* logits, const int32_t* labels, int rows, int cols,
                             float gradient_scale, float* gradient, float* loss_sum,
                             float* correct) override {
    cpu::softmax_cross_entropy(logits, labels, rows, cols, gradient_scale, gradient, loss_sum,
                               correct);
  }

  void im2col(stream, const convolution_geometry& g, const float* image, float* columns) override {
    for_each_sub_batch(g, [&](const convolution_geometry& part, size_t first) {
      cpu::im2col(part, image + first * image_size(g), columns + first * column_size(g));
    });
  }
  void col2im(stream, const convolution_geometry& g, const float* columns, float* image) override {
    for_each_sub_batch(g, [&](const convolution_geometry& part, size_t first) {
      cpu::col2im(part, columns + first * column_size(g), image + first * image_size(g));
    });
  }
  void max_pool_forward(stream, const pooling_geometry& g, const float* x, float* y,
                        int32_t* argmax) override {
    cpu::max_pool_forward(g, x, y, argmax);
  }
  void max_pool_backward(stream, const pooling_geometry& g, const float* dy, const int32_t* argmax,
                         float* dx) override {
    cpu::max_pool_backward(g, dy, argmax, dx);
  }

  void dropout_forward(stream, const float* x, float* y, float* mask, size_t count,
                       float probability, uint64_t seed, uint64_t offset) override {
    // Each element's draw depends only on its counter, so the parts draw what the whole would.
    for_each_range(count, [&](size_t begin, size_t end) {
      cpu::dropout_forward(x + begin, y + begin, mask + begin, end - begin, probability, seed,
                           offset + begin);
    });
  }

  void sgd_step(stream, float* weights, const float* gradient, float* velocity, size_t count,
                const sgd_parameters& p) override {
    for_each_range(count, [&](size_t begin, size_t end) {
      cpu::sgd_step(weights + begin, gradient + begin, velocity ? velocity + begin : nullptr,
                    end - begin, p);
    });
  }
  void adam_step(stream, float* weights, const float* gradient, float* first_moment,
                 float* second_moment, size_t count, const adam_parameters& p) override {
    for_each_range(count, [&](size_t begin, size_t end) {
      if (p.decoupled_decay != 0.0f)
        cpu::axpy(-p.decoupled_decay, weights + begin, weights + begin, end - begin);
      cpu::adam_step(weights + begin, gradient + begin, first_moment + begin, second_moment + begin,
                     end - begin, p);
    });
  }

 private:
  static size_t image_size(const convolution_geometry& g) {
    return size_t(g.channels) * g.height * g.width;
  }
  static size_t column_size(const convolution_geometry& g) {
    return size_t(g.out_height) * g.out_width * g.channels * g.kernel * g.kernel;
  }

  /// Runs f(begin, end) over parts of [0, count) on the pool, or whole when count is small.
  template <typename Function>
  void for_each_range(size_t count, const Function& f) {
    const int parts =
        static_cast<int>(std::min<size_t>(pool_.threads(), count / parallel_elements_threshold));
    if (parts <= 1) return f(0, count);
    pool_.run(parts, [&](int part) {
      f(cpu::split_point(count, parts, part, 16), cpu::split_point(count, parts, part + 1, 16));
    });
  }

  /// Runs f(first row, last row) over parts of [0, rows) of a rows×cols operation, or over all
  /// of it when small.
  template <typename Function>
  void for_each_row_range(int rows, int cols, const Function& f) {
    const size_t elements = size_t(rows) * std::max(cols, 1);
    const int parts = static_cast<int>(std::min<size_t>(
        std::min<size_t>(pool_.threads(), size_t(rows)), elements / parallel_elements_threshold));
    if (parts <= 1) return f(0, rows);
    pool_.run(parts, [&](int part) {
      f(static_cast<int>(cpu::split_point(rows, parts, part, 1)),
        static_cast<int>(cpu::split_point(rows, parts, part + 1, 1)));
    });
  }

  /// Runs f(sub-geometry, first image) over parts of a batch of independent images.
  template <typename Function>
  void for_each_sub_batch(const convolution_geometry& g, const Function& f) {
    const int parts = std::min(pool_.threads(), g.batch);
    if (parts <= 1) return f(g, 0);
    pool_.run(parts, [&](int part) {
      const size_t first = cpu::split_point(g.batch, parts, part, 1);
      convolution_geometry piece = g;
      piece.batch = static_cast<int>(cpu::split_point(g.batch, parts, part + 1, 1) - first);
      f(piece, first);
    });
  }

  /// The state of `s` (a null handle means the default stream, as on CUDA).
  cpu_stream& state_of(stream s) {
    return s.handle == nullptr ? default_stream_ : *static_cast<cpu_stream*>(s.handle);
  }

  /// `target` = the rows×cols matrix at `source` (row stride `stride`) rounded to `precision`,
  /// stored contiguously.
  void round_matrix(const float* source, int rows, int cols, int stride, math_precision precision,
                    std::vector<float>* target);

  /// The fp32 GEMM of k > 0 on OpenBLAS, split over the pool when large enough.
  void gemm_fp32(transpose transpose_a, transpose transpose_b, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);

  cpu::thread_pool pool_;
  block_cache blocks_{cached_bytes_limit};
  cpu_stream default_stream_;
};

void cpu_backend::round_matrix(const float* source, int rows, int cols, int stride,
                               math_precision precision, std::vector<float>* target) {
  const size_t count = size_t(rows) * cols;
  if (target->size() < count) target->resize(count);
  float* into = target->data();
  for_each_range(count, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      const size_t row = i / cols, col = i % cols;
      const size_t run = std::min(end - i, size_t(cols) - col);
      const float* from = source + row * stride + col;
      for (size_t j = 0; j < run; ++j) into[i + j] = round_to_precision(from[j], precision);
      i += run;
    }
  });
}

void cpu_backend::gemm(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
                       float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                       float* c, int ldc) {
  TROUPE_CHECK(gemm_arguments_valid(transpose_a, transpose_b, m, n, k, lda, ldb, ldc));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // Nothing to multiply; C = beta * C without reading C when beta == 0.
    for (int row = 0; row < m; ++row) {
      float* line = c + size_t(row) * ldc;
      for (int col = 0; col < n; ++col) line[col] = beta == 0.0f ? 0.0f : beta * line[col];
    }
    return;
  }
  cpu_stream& state = state_of(s);
  if (state.gemm_precision == math_precision::fp32) {
    gemm_fp32(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Exactly what reduced-precision hardware computes: operands rounded once, then products
  // summed in fp32 (an fp32 product of two tf32 or bf16 values is exact).
  const bool a_plain = transpose_a == transpose::no, b_plain = transpose_b == transpose::no;
  const int a_rows = a_plain ? m : k, a_cols = a_plain ? k : m;
  const int b_rows = b_plain ? k : n, b_cols = b_plain ? n : k;
  round_matrix(a, a_rows, a_cols, lda, state.gemm_precision, &state.rounded_a);
  round_matrix(b, b_rows, b_cols, ldb, state.gemm_precision, &state.rounded_b);
  gemm_fp32(transpose_a, transpose_b, m, n, k, alpha, state.rounded_a.data(), a_cols,
            state.rounded_b.data(), b_cols, beta, c, ldc);
}

void cpu_backend::gemm_fp32(transpose transpose_a, transpose transpose_b, int m, int n, int k,
                            float alpha, const float* a, int lda, const float* b, int ldb,
                            float beta, float* c, int ldc) {
  const int parts = pool_.threads();
  if (parts == 1 || double(m) * n * k < parallel_gemm_threshold) {
    cblas_sgemm(CblasRowMajor, to_cblas(transpose_a), to_cblas(transpose_b), m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
    return;
  }
  // C is cut into blocks of columns (or rows, when C is taller than wide), a few per thread,
  // which the threads take in turn: a thread slowed by something else on the machine takes
  // fewer blocks instead of holding the others up. Each block is a single-threaded GEMM.
  const bool split_columns = n >= m;
  const int total = split_columns ? n : m;
  const int blocks = parts * 4;
  std::atomic<int> next{0};
  pool_.run(parts, [&](int) {
    for (int block = next++; block < blocks; block = next++) {
      const int begin = static_cast<int>(cpu::split_point(total, blocks, block, 16));
      const int end = static_cast<int>(cpu::split_point(total, blocks, block + 1, 16));
      if (begin == end) continue;
      if (split_columns) {
        const float* b_part = transpose_b == transpose::no ? b + begin : b + size_t(begin) * ldb;
        cblas_sgemm(CblasRowMajor, to_cblas(transpose_a), to_cblas(transpose_b), m, end - begin, k,
                    alpha, a, lda, b_part, ldb, beta, c + begin, ldc);
      } else {
        const float* a_part = transpose_a == transpose::no ? a + size_t(begin) * lda : a + begin;
        cblas_sgemm(CblasRowMajor, to_cblas(transpose_a), to_cblas(transpose_b), end - begin, n, k,
                    alpha, a_part, lda, b, ldb, beta, c + size_t(begin) * ldc, ldc);
      }
    }
  });
}

void cpu_backend::gemm_batched(stream s, transpose transpose_a, transpose transpose_b, int m, int n,
                               int k, float alpha, const float* a, int lda, int64_t stride_a,
                               const float* b, int ldb, int64_t stride_b, float beta, float* c,
                               int ldc, int64_t stride_c, int batch) {
  TROUPE_CHECK(batch >= 0);
  TROUPE_CHECK(gemm_arguments_valid(transpose_a, transpose_b, m, n, k, lda, ldb, ldc));
  const bool small = double(m) * n * k < parallel_gemm_threshold;
  if (state_of(s).gemm_precision != math_precision::fp32 || k == 0 || !small ||
      pool_.threads() == 1 || batch < 2) {
    // Large products split themselves over the pool; reduced precision rounds into per-stream
    // scratch, which only one GEMM at a time may use.
    for (int i = 0; i < batch; ++i) {
      gemm(s, transpose_a, transpose_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b,
           ldb, beta, c + i * stride_c, ldc);
    }
    return;
  }
  const int parts = std::min(pool_.threads(), batch);
  pool_.run(parts, [&](int part) {
    const int first = static_cast<int>(cpu::split_point(batch, parts, part, 1));
    const int last = static_cast<int>(cpu::split_point(batch, parts, part + 1, 1));
    for (int i = first; i < last; ++i) {
      cblas_sgemm(CblasRowMajor, to_cblas(transpose_a), to_cblas(transpose_b), m, n, k, alpha,
                  a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
    }
  });
}

}  // namespace

std::unique_ptr<backend> make_cpu_backend(int threads) {
  return std::make_unique<cpu_backend>(threads);
}

}  // namespace troupe::layers
