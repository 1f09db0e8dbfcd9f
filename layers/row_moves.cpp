#include "layers/row_moves.h"

#include <cstdio>

#include "layers/check.h"

namespace troupe::layers {
namespace {

/// Calls copy(first, source_row, count) for each run of consecutive rows[i] (i from first, the
/// source rows rows[first] onwards), and zero(first, count) for each run of -1.
template <typename Copy, typename Zero>
void for_each_run(const std::vector<int64_t>& rows, Copy copy, Zero zero) {
  size_t first = 0;
  while (first < rows.size()) {
    size_t end = first + 1;
    if (rows[first] < 0) {
      while (end < rows.size() && rows[end] < 0) ++end;
      zero(first, end - first);
    } else {
      while (end < rows.size() && rows[end] == rows[end - 1] + 1) ++end;
      copy(first, rows[first], end - first);
    }
    first = end;
  }
}

void check_block(const tensor& data, int64_t column, int64_t width) {
  TROUPE_CHECK(column >= 0 && width >= 0 && column + width <= data.row_size());
}

}  // namespace

void gather_rows(stream s, const tensor& source, int64_t source_column,
                 const std::vector<int64_t>& rows, tensor& target, int64_t target_column,
                 int64_t width) {
  check_block(source, source_column, width);
  check_block(target, target_column, width);
  TROUPE_CHECK(static_cast<int64_t>(rows.size()) <= target.rows());
  backend& device = target.device();
  const int64_t from_stride = source.row_size(), to_stride = target.row_size();
  for_each_run(
      rows,
      [&](size_t first, int64_t row, size_t count) {
        TROUPE_CHECK(row + static_cast<int64_t>(count) <= source.rows());
        device.copy_matrix(
            s, source.data() + row * from_stride + source_column, static_cast<int>(from_stride),
            target.data() + static_cast<int64_t>(first) * to_stride + target_column,
            static_cast<int>(to_stride), static_cast<int>(count), static_cast<int>(width));
      },
      [&](size_t first, size_t count) {
        float* into = target.data() + static_cast<int64_t>(first) * to_stride + target_column;
        if (width == to_stride) {
          device.fill(s, into, 0.0f, count * static_cast<size_t>(width));
          return;
        }
        for (size_t i = 0; i < count; ++i)
          device.fill(s, into + static_cast<int64_t>(i) * to_stride, 0.0f,
                      static_cast<size_t>(width));
      });
}

void scatter_rows(stream s, const tensor& source, int64_t source_column,
                  const std::vector<int64_t>& rows, tensor& target, int64_t target_column,
                  int64_t width, bool add) {
  check_block(source, source_column, width);
  check_block(target, target_column, width);
  TROUPE_CHECK(static_cast<int64_t>(rows.size()) <= source.rows());
  backend& device = target.device();
  const int64_t from_stride = source.row_size(), to_stride = target.row_size();
  for_each_run(
      rows,
      [&](size_t first, int64_t row, size_t count) {
        TROUPE_CHECK(row + static_cast<int64_t>(count) <= target.rows());
        const float* from =
            source.data() + static_cast<int64_t>(first) * from_stride + source_column;
        float* into = target.data() + row * to_stride + target_column;
        if (!add) {
          device.copy_matrix(s, from, static_cast<int>(from_stride), into,
                             static_cast<int>(to_stride), static_cast<int>(count),
                             static_cast<int>(width));
        } else if (width == from_stride && width == to_stride) {
          device.axpy(s, 1.0f, from, into, count * static_cast<size_t>(width));
        } else {
          for (size_t i = 0; i < count; ++i)
            device.axpy(s, 1.0f, from + static_cast<int64_t>(i) * from_stride,
                        into + static_cast<int64_t>(i) * to_stride, static_cast<size_t>(width));
        }
      },
      [](size_t, size_t) {});
}

}  // namespace troupe::layers
