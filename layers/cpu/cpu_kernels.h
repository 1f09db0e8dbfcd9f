#pragma once

// The loops behind the CPU backend, one free function per backend operation (see backend.h
// for each contract). They run at once on the calling thread, use no threads of their own
// (OpenBLAS owns the cores) and sum in a fixed order, so results are reproducible.

#include <cstddef>
#include <cstdint>

#include "layers/backend.h"

namespace troupe::layers::cpu {

void add_row_vector(float* matrix, const float* vector, int rows, int cols);
void sum_rows(const float* matrix, int rows, int cols, float beta, float* out);
void add_channel_vector(float* data, const float* vector, int batch, int channels, int spatial);
void sum_channels(const float* data, int batch, int channels, int spatial, float beta, float* out);
void transpose_batched(const float* in, float* out, int batch, int rows, int cols);
void axpy(float alpha, const float* x, float* y, size_t count);
void multiply(const float* a, const float* b, float* out, size_t count);
void sum(const float* x, size_t count, float* out);

void activation_forward(activation f, const float* x, float* y, size_t count);
void activation_backward(activation f, const float* x, const float* y, const float* dy, float* dx,
                         size_t count);

void softmax_cross_entropy(const float* logits, const int32_t* labels, int rows, int cols,
                           float gradient_scale, float* gradient, float* loss_sum, float* correct);

void im2col(const convolution_geometry& g, const float* image, float* columns);
void col2im(const convolution_geometry& g, const float* columns, float* image);
void max_pool_forward(const pooling_geometry& g, const float* x, float* y, int32_t* argmax);
void max_pool_backward(const pooling_geometry& g, const float* dy, const int32_t* argmax,
                       float* dx);

void dropout_forward(const float* x, float* y, float* mask, size_t count, float probability,
                     uint64_t seed, uint64_t offset);

void sgd_step(float* weights, const float* gradient, float* velocity, size_t count,
              const sgd_parameters& p);
void adam_step(float* weights, const float* gradient, float* first_moment, float* second_moment,
               size_t count, const adam_parameters& p);

}  // namespace troupe::layers::cpu
