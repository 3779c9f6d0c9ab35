#include "harness/model/saved_tensors.hpp"

#include <algorithm>

#include "shardscope/check.hpp"

namespace shardscope {

void SavedTensors::save(const void* id, std::int64_t bytes) {
  Entry& e = entries_[id];
  if (e.refs == 0) {
    e.bytes = bytes;
    live_bytes_ += bytes;
    if (bytes > 0) ++live_storages_;
    peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  }
  ++e.refs;
  ++live_;
  ++total_;
  peak_live_ = std::max(peak_live_, live_);
}

void SavedTensors::release(const void* id) {
  auto it = entries_.find(id);
  SHARDSCOPE_REQUIRE(it != entries_.end() && it->second.refs > 0,
                     "saved-tensor release without a save");
  --live_;
  if (--it->second.refs == 0) {
    live_bytes_ -= it->second.bytes;
    if (it->second.bytes > 0) --live_storages_;
    entries_.erase(it);
  }
}

void SavedTensors::begin_backward() {
  if (before_first_backward_ < 0) before_first_backward_ = total_;
}

void SavedTensors::reset() {
  SHARDSCOPE_REQUIRE(live_ == 0, "saved tensors still live at the start of a step");
  *this = SavedTensors{};
}

}  // namespace shardscope
