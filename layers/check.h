#pragma once

// Invariant checks: a broken invariant is a bug, so it aborts with file and line. Bad input
// from outside (files, configs, frames) never reaches these; it is reported as an error value.

#include <cstdio>
#include <cstdlib>

#define TROUPE_CHECK(condition)                                                          \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (false)
