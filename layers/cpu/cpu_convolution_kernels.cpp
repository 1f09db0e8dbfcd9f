#include <algorithm>

#include "layers/check.h"
#include "layers/cpu/cpu_kernels.h"

// Convolution and pooling loops of the CPU backend: im2col, its adjoint col2im, and max
// pooling. Each window's valid part is worked out once, so the inner loops copy or add
// without bounds checks.

namespace troupe::layers::cpu {

namespace {

/// The part [begin, end) of a kernel's span [0, k) that falls inside [0, extent) when the span
/// starts at `origin` in image coordinates.
struct kernel_range {
  int begin;
  int end;
};

kernel_range inside(int origin, int k, int extent) {
  const int begin = std::clamp(-origin, 0, k);
  const int end = std::clamp(extent - origin, begin, k);
  return {begin, end};
}

bool covers_kernel(kernel_range range, int k) { return range.begin == 0 && range.end == k; }

/// gather_patch for a window that lies wholly inside the image: plain k×k copies per channel.
template <int K>
void gather_interior(const float* __restrict source, float* __restrict row, int k, int channels,
                     size_t plane, int width) {
  for (int c = 0; c < channels; ++c, source += plane) {
    for (int i = 0; i < k; ++i, row += k) {
      for (int j = 0; j < k; ++j) row[j] = source[ptrdiff_t(i) * width + j];
    }
  }
}

/// One row of the column matrix: the k×k patches of every channel at (top, left).
/// K > 0 fixes the kernel size at compile time so the short inner loops unroll.
template <int K>
void gather_patch(const convolution_geometry& g, const float* __restrict image,
                  float* __restrict row, int top, int left) {
  const int k = K > 0 ? K : g.kernel;
  const size_t plane = size_t(g.height) * g.width;
  const kernel_range rows = inside(top, k, g.height);
  const kernel_range cols = inside(left, k, g.width);
  const ptrdiff_t corner = ptrdiff_t(top) * g.width + left;  // may lie outside the image
  if (covers_kernel(rows, k) && covers_kernel(cols, k)) {
    return gather_interior<K>(image + corner, row, k, g.channels, plane, g.width);
  }
  for (int c = 0; c < g.channels; ++c) {
    for (int i = 0; i < k; ++i, row += k) {
      if (i < rows.begin || i >= rows.end) {
        for (int j = 0; j < k; ++j) row[j] = 0.0f;
        continue;
      }
      const float* line = image + c * plane + corner + ptrdiff_t(i) * g.width;
      for (int j = 0; j < cols.begin; ++j) row[j] = 0.0f;
      for (int j = cols.begin; j < cols.end; ++j) row[j] = line[j];
      for (int j = cols.end; j < k; ++j) row[j] = 0.0f;
    }
  }
}

/// scatter_patch for a window that lies wholly inside the image.
template <int K>
void scatter_interior(const float* __restrict row, float* __restrict target, int k, int channels,
                      size_t plane, int width) {
  for (int c = 0; c < channels; ++c, target += plane) {
    for (int i = 0; i < k; ++i, row += k) {
      for (int j = 0; j < k; ++j) target[ptrdiff_t(i) * width + j] += row[j];
    }
  }
}

/// The adjoint of gather_patch: adds one column-matrix row back into the image.
template <int K>
void scatter_patch(const convolution_geometry& g, const float* __restrict row,
                   float* __restrict image, int top, int left) {
  const int k = K > 0 ? K : g.kernel;
  const size_t plane = size_t(g.height) * g.width;
  const kernel_range rows = inside(top, k, g.height);
  const kernel_range cols = inside(left, k, g.width);
  float* target = image + (ptrdiff_t(top) * g.width + left);  // may lie outside the image
  if (covers_kernel(rows, k) && covers_kernel(cols, k)) {
    return scatter_interior<K>(row, target, k, g.channels, plane, g.width);
  }
  for (int c = 0; c < g.channels; ++c, row += k * k, target += plane) {
    for (int i = rows.begin; i < rows.end; ++i) {
      float* line = target + ptrdiff_t(i) * g.width;
      const float* values = row + i * k;
      for (int j = cols.begin; j < cols.end; ++j) line[j] += values[j];
    }
  }
}

template <int K>
void im2col_fixed(const convolution_geometry& g, const float* image, float* columns) {
  const size_t row_size = size_t(g.channels) * g.kernel * g.kernel;
  const size_t image_size = size_t(g.channels) * g.height * g.width;
  for (int n = 0; n < g.batch; ++n) {
    for (int y = 0; y < g.out_height; ++y) {
      for (int x = 0; x < g.out_width; ++x, columns += row_size) {
        gather_patch<K>(g, image + n * image_size, columns, y * g.stride - g.padding,
                        x * g.stride - g.padding);
      }
    }
  }
}

template <int K>
void col2im_fixed(const convolution_geometry& g, const float* columns, float* image) {
  const size_t row_size = size_t(g.channels) * g.kernel * g.kernel;
  const size_t image_size = size_t(g.channels) * g.height * g.width;
  std::fill_n(image, g.batch * image_size, 0.0f);
  for (int n = 0; n < g.batch; ++n) {
    for (int y = 0; y < g.out_height; ++y) {
      for (int x = 0; x < g.out_width; ++x, columns += row_size) {
        scatter_patch<K>(g, columns, image + n * image_size, y * g.stride - g.padding,
                         x * g.stride - g.padding);
      }
    }
  }
}

}  // namespace

void im2col(const convolution_geometry& g, const float* image, float* columns) {
  switch (g.kernel) {
    case 1:
      return im2col_fixed<1>(g, image, columns);
    case 3:
      return im2col_fixed<3>(g, image, columns);
    case 5:
      return im2col_fixed<5>(g, image, columns);
    default:
      return im2col_fixed<0>(g, image, columns);
  }
}

void col2im(const convolution_geometry& g, const float* columns, float* image) {
  switch (g.kernel) {
    case 1:
      return col2im_fixed<1>(g, columns, image);
    case 3:
      return col2im_fixed<3>(g, columns, image);
    case 5:
      return col2im_fixed<5>(g, columns, image);
    default:
      return col2im_fixed<0>(g, columns, image);
  }
}

namespace {

/// Max of one window of a plane; `index` receives the flat index of its first maximum.
float window_maximum(const pooling_geometry& g, const float* plane, int top, int left,
                     int32_t* index) {
  const int bottom = std::min(top + g.kernel, g.height);
  const int right = std::min(left + g.kernel, g.width);
  int32_t best = top * g.width + left;
  float best_value = plane[best];
  for (int i = top; i < bottom; ++i) {
    for (int j = left; j < right; ++j) {
      const float value = plane[i * g.width + j];
      if (value > best_value) {
        best_value = value;
        best = i * g.width + j;
      }
    }
  }
  *index = best;
  return best_value;
}

}  // namespace

void max_pool_forward(const pooling_geometry& g, const float* x, float* y, int32_t* argmax) {
  const size_t planes = size_t(g.batch) * g.channels;
  const size_t in_plane = size_t(g.height) * g.width;
  for (size_t p = 0; p < planes; ++p) {
    const float* plane = x + p * in_plane;
    for (int oy = 0; oy < g.out_height; ++oy) {
      for (int ox = 0; ox < g.out_width; ++ox, ++y, ++argmax) {
        *y = window_maximum(g, plane, oy * g.stride, ox * g.stride, argmax);
      }
    }
  }
}

void max_pool_backward(const pooling_geometry& g, const float* dy, const int32_t* argmax,
                       float* dx) {
  const size_t planes = size_t(g.batch) * g.channels;
  const size_t in_plane = size_t(g.height) * g.width;
  const size_t out_plane = size_t(g.out_height) * g.out_width;
  std::fill_n(dx, planes * in_plane, 0.0f);
  for (size_t p = 0; p < planes; ++p) {
    float* plane = dx + p * in_plane;
    for (size_t o = 0; o < out_plane; ++o) plane[argmax[o]] += dy[o];
    dy += out_plane;
    argmax += out_plane;
  }
}

}  // namespace troupe::layers::cpu
