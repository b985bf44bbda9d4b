// LogCapture (tests only): collects the lines every Logger writes, without
// their timestamp and level ("[coordinator] job=j-1 rank=2 ..."), while it
// lives, so a test can check what an operator would read.
//
// Thread safety: lines from any thread are collected; construct and destroy
// it on one thread, with no other LogCapture alive.
#ifndef LOCKSTEP_COMMON_LOG_CAPTURE_H_
#define LOCKSTEP_COMMON_LOG_CAPTURE_H_

#include <spdlog/sinks/base_sink.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

#include "common/logging.h"

namespace lockstep {

class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<Sink>()) {
    sink_->set_pattern("%v");
    LockstepLogger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = LockstepLogger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Every line so far, each ending in '\n' (read under the sink's lock, so
  // a thread logging meanwhile is no data race).
  std::string Lines() { return sink_->Text(); }

 private:
  class Sink : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string Text() {
      std::lock_guard<std::mutex> lock(mutex_);
      return text_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      spdlog::memory_buf_t formatted;
      formatter_->format(msg, formatted);
      text_.append(formatted.data(), formatted.size());
    }
    void flush_() override {}

   private:
    std::string text_;
  };
  std::shared_ptr<Sink> sink_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_LOG_CAPTURE_H_
