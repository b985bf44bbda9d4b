#include "ddp/progress.h"

#include <mutex>
#include <utility>

namespace lockstep {
namespace ddp {
namespace {

struct Registry {
  std::mutex mu;
  ProgressSinkFactory factory;
  std::weak_ptr<ProgressSink> sink;
};

Registry& GetRegistry() {
  // Never destroyed: registrations run from other files' static
  // initialisers, in no particular order.
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

void RegisterProgressSinkFactory(ProgressSinkFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factory = std::move(factory);
}

std::shared_ptr<ProgressSink> AcquireProgressSink() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::shared_ptr<ProgressSink> sink = r.sink.lock();
  if (sink == nullptr && r.factory) {
    sink = std::shared_ptr<ProgressSink>(r.factory());
    r.sink = sink;
  }
  return sink;
}

}  // namespace ddp
}  // namespace lockstep
