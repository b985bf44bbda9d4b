// The median the benchmarks report: of an even count, the mean of the two
// middle values; 0 for none.
#ifndef LOCKSTEP_BENCH_MEDIAN_H_
#define LOCKSTEP_BENCH_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace lockstep {

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace lockstep

#endif  // LOCKSTEP_BENCH_MEDIAN_H_
