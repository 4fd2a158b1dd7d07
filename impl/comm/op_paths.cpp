#include "tdc/comm/op_paths.h"

#include <mutex>

namespace tdc::comm {

namespace {
struct Record {
  std::mutex mu;
  std::map<std::string, std::set<std::string>> paths;
};
Record& record() {
  static Record r;
  return r;
}
}  // namespace

void record_op_path(const std::string& backend, const char* op, OpPath path) {
  Record& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  r.paths[backend + (path == OpPath::Native ? ".native" : ".emulated")].insert(op);
}

std::map<std::string, std::set<std::string>> op_paths() {
  Record& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.paths;
}

void reset_op_paths() {
  Record& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  r.paths.clear();
}

}  // namespace tdc::comm
