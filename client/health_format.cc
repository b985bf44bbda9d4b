#include "client/health_format.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/text.h"

namespace lockstep {
namespace client {

std::string StepSplitTable(const v1::Job& job) {
  std::string out;
  for (const auto& w : job.workers()) {
    const v1::RankProgress& p = w.progress();
    if (p.step_ms() <= 0) continue;
    if (out.empty()) {
      out = absl::StrFormat("%-5s %-8s %9s %8s %8s %8s %8s %8s\n", "RANK", "STEP", "STEP_MS",
                            "DATA", "FWD", "BWD", "COMM", "OPT");
    }
    absl::StrAppendFormat(&out, "%-5d %-8d %9.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", w.rank(),
                          p.step(), p.step_ms(), p.data_ms(), p.forward_ms(),
                          std::max(0.0, p.backward_ms() - p.exposed_comm_ms()),
                          p.exposed_comm_ms(), p.optimizer_ms());
  }
  return out;
}

std::vector<std::string> HealthLines(const v1::Job& job) {
  std::vector<std::string> lines;
  if (job.state() != v1::JOB_STATE_RUNNING || !job.has_health()) return lines;
  const v1::JobHealth& h = job.health();
  if (h.has_straggler()) {
    const v1::Straggler& s = h.straggler();
    lines.push_back(absl::StrFormat(
        "straggler: rank %d (others wait %.0f ms/step for it, at bucket %d; last %d steps)",
        s.rank(), s.lag_ms(), s.bucket(), s.steps()));
  }
  if (h.has_hang()) {
    const v1::Hang& g = h.hang();
    std::string where = g.bucket() >= 0 ? absl::StrCat("step ", g.step(), ", bucket ", g.bucket())
                                        : absl::StrCat("step ", g.step());
    std::string line = absl::StrFormat(
        "hang: rank%s %s wait%s %.0f s in %s (%s)", g.waiting_ranks_size() > 1 ? "s" : "",
        absl::StrJoin(g.waiting_ranks(), ","), g.waiting_ranks_size() > 1 ? "" : "s", g.wait_s(),
        g.op().empty() ? "a collective" : Printable(g.op()), where);
    for (const auto& c : g.culprits()) {
      if (c.silent_s() < 0) {
        absl::StrAppend(&line, "; rank ", c.rank(), " never reported");
      } else if (c.silent_s() > 0) {
        absl::StrAppendFormat(&line, "; rank %d silent for %.0f s (last: step %d%s)", c.rank(),
                              c.silent_s(), c.last_step(),
                              c.in_collective() ? ", in a collective" : "");
      } else if (c.in_collective()) {
        absl::StrAppendFormat(&line, "; rank %d in another collective (step %d)", c.rank(),
                              c.last_step());
      } else {
        absl::StrAppendFormat(&line, "; rank %d not in the collective (step %d)", c.rank(),
                              c.last_step());
      }
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace client
}  // namespace lockstep
