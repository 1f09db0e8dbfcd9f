#pragma once

// The device interface every compute backend implements. It carries no CUDA or BLAS types:
// streams and events are opaque handles, device memory is a plain pointer that only the
// backend that allocated it may touch. All matrices are row-major and contiguous unless a
// leading dimension says otherwise.
//
// Stream semantics: every operation is enqueued on the given stream and runs in order with the
// other work of that stream. The CPU backend runs each operation at once on the calling thread,
// so its streams are trivially ordered. Pointers passed to an operation must stay valid until
// the stream has been synchronized past it. A backend object may be used by one thread at a
// time per stream; the stage that owns a stream is its only caller.

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe::layers {

/// An ordered queue of device work; `handle` belongs to the backend that created it.
struct stream {
  void* handle = nullptr;
};

/// A marker in a stream that another stream or the host can wait for.
struct event {
  void* handle = nullptr;
};

enum class device_kind { cpu, cuda };

enum class transpose { no, yes };

enum class activation { relu, tanh, gelu };

/// The label of a row that softmax cross-entropy skips: no loss, no gradient, not counted (a
/// position that padding added).
constexpr int32_t ignored_label = -1;

/// The arithmetic of a GEMM: fp32 throughout, or operands rounded to TensorFloat-32 (10
/// explicit mantissa bits) or bfloat16 (7 bits) with products accumulated in fp32. The output
/// is fp32 in every case, and weights stay fp32 (master weights); only GEMM operands are
/// rounded. See layers/gemm_precision.h for the rounding and its error bound.
enum class math_precision { fp32, tf32, bf16 };

/// Geometry of a 2-D convolution over NCHW images with square kernels.
struct convolution_geometry {
  int batch = 0;
  int channels = 0;
  int height = 0;
  int width = 0;
  int kernel = 0;
  int stride = 1;
  int padding = 0;
  int out_height = 0;
  int out_width = 0;
};

/// Geometry of a 2-D max pooling over NCHW images with square windows.
struct pooling_geometry {
  int batch = 0;
  int channels = 0;
  int height = 0;
  int width = 0;
  int kernel = 0;
  int stride = 0;
  int out_height = 0;
  int out_width = 0;
};

/// The rows of an N-ary LSTM cell's gate arithmetic (N = 1: PyTorch's LSTMCell; N > 1: Tai et
/// al.'s N-ary Tree-LSTM). An input row is [x | h_1 | c_1 | ... | h_N | c_N], a gates row holds
/// (3 + N) blocks of `hidden` values in the order i, f_1 .. f_N, u (LSTMCell's g), o, and an
/// output row is [h | c].
struct lstm_cell_geometry {
  int rows = 0;
  int hidden = 0;
  int children = 1;
  int x_width = 0;

  int input_width() const { return x_width + 2 * children * hidden; }
  int gate_width() const { return (3 + children) * hidden; }
};

/// PyTorch's SGD: g = gradient_scale * grad + weight_decay * w; v = momentum * v + g; w -= lr * v,
/// or with `nesterov` (PyTorch's nesterov=True) w -= lr * (g + momentum * v).
struct sgd_parameters {
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  float gradient_scale = 1.0f;
  bool nesterov = false;
};

/// PyTorch's Adam with L2 weight decay added to the gradient; `step` counts from 1.
struct adam_parameters {
  float learning_rate = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
  float gradient_scale = 1.0f;
  int64_t step = 1;
  /// AdamW's decoupled decay, learning rate × weight decay: first weights -= this × weights
  /// (exactly as axpy(-this, weights, weights) would), then the step. 0: none.
  float decoupled_decay = 0.0f;
  /// NAdam, Nesterov's look-ahead: PyTorch's NAdam with its momentum schedule off (μ = β1 at
  /// every step, as momentum_decay → ∞). With Π the product of β1 over the steps so far, this
  /// one's included (`momentum_product`), and d = sqrt(v / (1 − β2^t)) + ε:
  /// w -= lr (1 − β1) / (1 − Π) · g / d, then w -= lr β1 / (1 − Π β1) · m / d.
  bool nesterov = false;
  double momentum_product = 0;
};

/// What an Adam step multiplies by, computed once on the host for every backend.
struct adam_step_sizes {
  float moment = 0;    ///< of m / d: lr / (1 − β1^t), or NAdam's lr β1 / (1 − Π β1)
  float gradient = 0;  ///< of g / d: 0, or NAdam's lr (1 − β1) / (1 − Π)
  float inverse_sqrt_correction2 = 1;  ///< 1 / sqrt(1 − β2^t)
};

inline adam_step_sizes step_sizes_of(const adam_parameters& p) {
  const double beta1 = p.beta1;
  const double correction2 = 1.0 - std::pow(static_cast<double>(p.beta2), p.step);
  adam_step_sizes sizes;
  sizes.inverse_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(correction2));
  if (p.nesterov) {
    sizes.moment = static_cast<float>(p.learning_rate * beta1 / (1.0 - p.momentum_product * beta1));
    sizes.gradient =
        static_cast<float>(p.learning_rate * (1.0 - beta1) / (1.0 - p.momentum_product));
    return sizes;
  }
  sizes.moment = static_cast<float>(p.learning_rate / (1.0 - std::pow(beta1, p.step)));
  return sizes;
}

/// Whether GEMM sizes are non-negative and the row strides as stored can hold their rows: A
/// is m×k (k×m when transposed), B is k×n (n×k when transposed), C is m×n.
inline bool gemm_arguments_valid(transpose transpose_a, transpose transpose_b, int m, int n, int k,
                                 int lda, int ldb, int ldc) {
  auto at_least = [](int stride, int row) { return stride >= (row > 1 ? row : 1); };
  return m >= 0 && n >= 0 && k >= 0 && at_least(lda, transpose_a == transpose::no ? k : m) &&
         at_least(ldb, transpose_b == transpose::no ? n : k) && at_least(ldc, n);
}

class backend {
 public:
  virtual ~backend() = default;

  /// "cpu" or "cuda:N".
  virtual std::string name() const = 0;

  /// Bytes of tensors on this backend now, and the most there have been since the last
  /// reset_peak_bytes(): what a stage's weights, optimizer state, held activations and
  /// temporaries take. Kept by the tensors themselves (device_buffer), from any thread.
  int64_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  void reset_peak_bytes() { peak_.store(bytes_in_use(), std::memory_order_relaxed); }
  /// Called by device_buffer for each allocation (+bytes) and free (-bytes).
  void count_bytes(int64_t change) {
    const int64_t now = in_use_.fetch_add(change, std::memory_order_relaxed) + change;
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  virtual device_kind kind() const = 0;

  // ---- memory -------------------------------------------------------------------------------
  /// Device memory of `bytes` bytes, aligned to at least 64 bytes; never null (aborts when out
  /// of memory). Contents are unspecified.
  virtual void* allocate(size_t bytes) = 0;
  /// Frees memory from allocate(); waits for nothing, so callers free only after the streams
  /// that used it are synchronized (or the backend orders frees itself, as CUDA's does).
  virtual void deallocate(void* pointer) = 0;
  virtual void copy_host_to_device(stream s, void* device, const void* host, size_t bytes) = 0;
  virtual void copy_device_to_host(stream s, void* host, const void* device, size_t bytes) = 0;
  virtual void copy_device_to_device(stream s, void* target, const void* source, size_t bytes) = 0;
  /// data[i] = value for i < count.
  virtual void fill(stream s, float* data, float value, size_t count) = 0;
  /// Host memory of `bytes` bytes that copies to and from this device move fastest
  /// (page-locked on CUDA: copies are DMA transfers, asynchronous, with no bounce buffer),
  /// aligned to at least 64 bytes; never null. Unlike the rest of the interface, it and
  /// deallocate_host() may be called from any thread at any time: a frame that owns such a
  /// buffer is released wherever ZeroMQ finishes with it.
  virtual void* allocate_host(size_t bytes) = 0;
  /// Returns memory from allocate_host() (null is ignored), once the copies that use it are
  /// synchronized; all of it must be returned before the backend is destroyed.
  virtual void deallocate_host(void* pointer) = 0;

  // ---- streams and events -------------------------------------------------------------------
  /// The stream that work goes to when a caller has none of its own; never destroyed.
  virtual stream default_stream() = 0;
  virtual stream create_stream() = 0;
  virtual void destroy_stream(stream s) = 0;
  /// Blocks the calling thread until all work enqueued on `s` has finished.
  virtual void synchronize(stream s) = 0;
  virtual event create_event() = 0;
  virtual void destroy_event(event e) = 0;
  virtual void record_event(event e, stream s) = 0;
  /// Work enqueued on `s` after this call starts only after `e` has completed.
  virtual void wait_event(stream s, event e) = 0;
  /// Blocks the calling thread until `e` has completed.
  virtual void synchronize_event(event e) = 0;
  /// GEMMs enqueued on `s` after this call use `precision` (every stream starts at fp32). With
  /// tf32 or bf16, A and B are rounded to nearest-even at that precision and the products are
  /// summed in fp32, so each product is within (1 + u)^2 - 1 ~ 2u (u: the precision's unit
  /// roundoff, 2^-11 for tf32, 2^-8 for bf16) of its exact value: |C - C_fp32| <=
  /// (2u + u^2) |alpha| sum_k |a_ik b_kj| plus the fp32 summation error of both. The CPU backend
  /// rounds exactly so; CUDA uses cuBLAS's TF32/BF16 tensor-core modes, whose operand rounding may
  /// differ by one ulp. The caller of `s` owns this setting: it is part of the stream's state, not
  /// of the backend's.
  virtual void set_gemm_precision(stream s, math_precision precision) = 0;

  // ---- linear algebra -----------------------------------------------------------------------
  /// C = alpha * op(A) * op(B) + beta * C with op(A) m×k, op(B) k×n and C m×n, all row-major.
  /// lda, ldb and ldc are the row strides of A, B and C as stored (before op). With beta == 0,
  /// C is not read (it may hold NaN).
  virtual void gemm(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
                    float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                    float* c, int ldc) = 0;
  /// matrix[r][c] += vector[c] for a rows×cols matrix.
  virtual void add_row_vector(stream s, float* matrix, const float* vector, int rows, int cols) = 0;
  /// out[c] = beta * out[c] + sum over r of matrix[r][c]; with beta == 0, out is not read.
  virtual void sum_rows(stream s, const float* matrix, int rows, int cols, float beta,
                        float* out) = 0;
  /// data[n][c][i] += vector[c] for a batch×channels×spatial array (a convolution's bias).
  virtual void add_channel_vector(stream s, float* data, const float* vector, int batch,
                                  int channels, int spatial) = 0;
  /// out[c] = beta * out[c] + sum over n, i of data[n][c][i]; with beta == 0, out is not read.
  virtual void sum_channels(stream s, const float* data, int batch, int channels, int spatial,
                            float beta, float* out) = 0;
  /// out[b][c][r] = in[b][r][c] for `batch` row-major rows×cols matrices (NHWC <-> NCHW).
  virtual void transpose_batched(stream s, const float* in, float* out, int batch, int rows,
                                 int cols) = 0;
  /// target[r][c] = source[r][c] for a rows×cols block of two row-major matrices whose rows are
  /// `source_stride` and `target_stride` floats apart (a block of columns copied out or in).
  virtual void copy_matrix(stream s, const float* source, int source_stride, float* target,
                           int target_stride, int rows, int cols) = 0;
  /// y[i] += alpha * x[i].
  virtual void axpy(stream s, float alpha, const float* x, float* y, size_t count) = 0;
  /// out[i] = a[i] * b[i]; out may alias a or b.
  virtual void multiply(stream s, const float* a, const float* b, float* out, size_t count) = 0;
  /// out[0] = sum of x[i] (device memory; summed in a fixed order for a given count).
  virtual void sum(stream s, const float* x, size_t count, float* out) = 0;

  /// `batch` GEMMs C_i = alpha * op(A_i) * op(B_i) + beta * C_i, where X_i starts stride_x
  /// floats after X_(i-1); otherwise as gemm(). Attention runs its heads through this.
  virtual void gemm_batched(stream s, transpose transpose_a, transpose transpose_b, int m, int n,
                            int k, float alpha, const float* a, int lda, int64_t stride_a,
                            const float* b, int ldb, int64_t stride_b, float beta, float* c,
                            int ldc, int64_t stride_c, int batch) = 0;

  // ---- transformer blocks -------------------------------------------------------------------
  /// Layer normalization of each row of a rows×cols matrix: normalized = (x - mean) * rstd with
  /// rstd = 1 / sqrt(variance + epsilon) (biased variance, as PyTorch), y = normalized * gamma +
  /// beta. `normalized` (rows×cols) and `rstd` (rows) are kept for the backward pass.
  virtual void layer_norm_forward(stream s, const float* x, const float* gamma, const float* beta,
                                  float* y, float* normalized, float* rstd, int rows, int cols,
                                  float epsilon) = 0;
  /// The input gradient of layer_norm_forward: with g = dy * gamma,
  /// dx = rstd * (g - mean(g) - normalized * mean(g * normalized)) row by row.
  virtual void layer_norm_backward(stream s, const float* dy, const float* gamma,
                                   const float* normalized, const float* rstd, float* dx, int rows,
                                   int cols) = 0;
  /// For `batch` T×T score matrices: row i becomes softmax(scale * scores[i][0..i]) over its
  /// first i + 1 entries and 0 beyond (causal attention). `probabilities` may alias `scores`.
  virtual void causal_softmax_forward(stream s, const float* scores, float* probabilities,
                                      int batch, int t, float scale) = 0;
  /// The gradient of causal_softmax_forward with respect to its scores:
  /// dscores = scale * p * (dp - sum_j dp_j p_j) row by row. `dscores` may alias `dp`.
  virtual void softmax_backward(stream s, const float* probabilities, const float* dp,
                                float* dscores, int rows, int cols, float scale) = 0;
  /// out[i][:] = table[ids[i]][:] for `count` token ids stored as floats (exact integers);
  /// an id outside [0, vocab) gives a row of zeros.
  virtual void embedding_forward(stream s, const float* ids, const float* table, float* out,
                                 int count, int dim, int vocab) = 0;
  /// table_gradient[v][:] = beta * table_gradient[v][:] + sum over i with ids[i] == v of
  /// dout[i][:], summed in order of i (ids outside [0, vocab) are skipped).
  virtual void embedding_backward(stream s, const float* ids, const float* dout,
                                  float* table_gradient, int count, int dim, int vocab,
                                  float beta) = 0;

  // ---- recurrent cells ----------------------------------------------------------------------
  /// Replaces each row of `gates` (the pre-activations W [x | h_1 .. h_N] + b) by its
  /// activations, sigmoid of i, f_k and o and tanh of u, and writes output rows [h | c] with
  /// c = i u + sum over k of f_k c_k (c_k read from `input`) and h = o tanh(c).
  virtual void lstm_cell_forward(stream s, const lstm_cell_geometry& g, float* gates,
                                 const float* input, float* output) = 0;
  /// The backward pass of lstm_cell_forward, from its activated `gates`, `input` and `output`
  /// and the output gradient [dh | dc]: writes the gradient of the gates' pre-activations to
  /// `gate_gradient` and, unless `input_gradient` is null, each child's dc_k = f_k dc' (where
  /// dc' = dc + dh o (1 - tanh(c)^2)) to the c_k columns of `input_gradient`, leaving its other
  /// columns as they are.
  virtual void lstm_cell_backward(stream s, const lstm_cell_geometry& g, const float* gates,
                                  const float* input, const float* output,
                                  const float* output_gradient, float* gate_gradient,
                                  float* input_gradient) = 0;

  // ---- activations --------------------------------------------------------------------------
  /// y = f(x); y may alias x.
  virtual void activation_forward(stream s, activation f, const float* x, float* y,
                                  size_t count) = 0;
  /// dx = dy * f'(x), where y = f(x) is also given (ReLU and tanh use it); dx may alias dy.
  virtual void activation_backward(stream s, activation f, const float* x, const float* y,
                                   const float* dy, float* dx, size_t count) = 0;

  // ---- loss ---------------------------------------------------------------------------------
  /// Softmax cross-entropy over rows×cols logits with integer labels in [0, cols), or
  /// ignored_label for a row that is not scored (a padded position).
  /// Writes the sum over scored rows of -log softmax(logits)[label] to loss_sum[0] and the
  /// number of scored rows whose first maximal logit is the label to correct[0] (both device
  /// floats). When `gradient` is not null it receives (softmax(logits) - onehot(label)) *
  /// gradient_scale on scored rows and zeros on ignored ones.
  virtual void softmax_cross_entropy(stream s, const float* logits, const int32_t* labels, int rows,
                                     int cols, float gradient_scale, float* gradient,
                                     float* loss_sum, float* correct) = 0;

  // ---- convolution and pooling --------------------------------------------------------------
  /// columns[(n*oh + y)*ow + x][(c*k + i)*k + j] = image[n][c][y*stride - pad + i][x*stride - pad +
  /// j] (zero outside the image): a (batch*oh*ow) × (channels*k*k) row-major matrix.
  virtual void im2col(stream s, const convolution_geometry& g, const float* image,
                      float* columns) = 0;
  /// The adjoint of im2col: image = sum of every column entry into the pixel it came from
  /// (image is overwritten, not accumulated into).
  virtual void col2im(stream s, const convolution_geometry& g, const float* columns,
                      float* image) = 0;
  /// y = max over each window; argmax receives the flat index (within its n, c plane) of the
  /// first maximal input of each window.
  virtual void max_pool_forward(stream s, const pooling_geometry& g, const float* x, float* y,
                                int32_t* argmax) = 0;
  /// dx = 0, then dx[argmax] += dy for every window.
  virtual void max_pool_backward(stream s, const pooling_geometry& g, const float* dy,
                                 const int32_t* argmax, float* dx) = 0;

  // ---- dropout ------------------------------------------------------------------------------
  /// mask[i] = keep(seed, offset + i) ? 1 / (1 - probability) : 0; y[i] = x[i] * mask[i].
  /// keep() is the counter-based draw in random.h, so every backend draws the same mask and a
  /// batch split into micro-batches (with matching offsets) draws the same mask as a whole.
  virtual void dropout_forward(stream s, const float* x, float* y, float* mask, size_t count,
                               float probability, uint64_t seed, uint64_t offset) = 0;

  // ---- optimizers ---------------------------------------------------------------------------
  /// One SGD step over `count` weights; velocity may be null when momentum == 0.
  virtual void sgd_step(stream s, float* weights, const float* gradient, float* velocity,
                        size_t count, const sgd_parameters& p) = 0;
  /// One Adam step over `count` weights.
  virtual void adam_step(stream s, float* weights, const float* gradient, float* first_moment,
                         float* second_moment, size_t count, const adam_parameters& p) = 0;

 private:
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace troupe::layers
