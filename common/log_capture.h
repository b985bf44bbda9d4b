// LogCapture (tests only): collects the lines every Logger writes, without
// their timestamp and level ("[coordinator] job=j-1 rank=2 ..."), while it
// lives, so a test can check what an operator would read.
//
// Thread safety: lines from any thread are collected; construct and destroy
// it on one thread, with no other LogCapture alive.
#ifndef LOCKSTEP_COMMON_LOG_CAPTURE_H_
#define LOCKSTEP_COMMON_LOG_CAPTURE_H_

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include "common/logging.h"

namespace lockstep {

class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    sink_->set_pattern("%v");
    LockstepLogger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = LockstepLogger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Every line so far, each ending in '\n'.
  std::string Lines() {
    sink_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_LOG_CAPTURE_H_
