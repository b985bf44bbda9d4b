#include "common/status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace lockstep {

Status Annotate(const Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace lockstep
