#include "common/ids.h"

#include <cstdio>
#include <random>

namespace lockstep {

std::string NewRandomId(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return prefix + buf;
}

}  // namespace lockstep
