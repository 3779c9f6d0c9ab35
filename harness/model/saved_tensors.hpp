// The saved-tensor instrument (docs/design.md §2): counts what autograd would save for
// backward. A save of tensor `id` adds one to the live count; the bytes of distinct
// tensors are counted once however many times they are saved (a weight reference
// saves zero bytes). The live storages are the distinct tensors that hold bytes: what
// torch's saved_tensors_hooks see as unique storages, parameters excluded.
#pragma once

#include <cstdint>
#include <unordered_map>

namespace shardscope {

class SavedTensors {
 public:
  void save(const void* id, std::int64_t bytes);
  void release(const void* id);
  // Called when the first backward action starts (for "saved before first backward").
  void begin_backward();
  void reset();  // a new step

  int live() const { return live_; }
  int peak_live() const { return peak_live_; }
  int total() const { return total_; }
  int before_first_backward() const { return before_first_backward_; }
  std::int64_t live_bytes() const { return live_bytes_; }
  int live_storages() const { return live_storages_; }
  std::int64_t peak_live_bytes() const { return peak_live_bytes_; }

 private:
  struct Entry {
    int refs = 0;
    std::int64_t bytes = 0;
  };
  std::unordered_map<const void*, Entry> entries_;
  int live_ = 0;
  int peak_live_ = 0;
  int total_ = 0;
  int before_first_backward_ = -1;
  std::int64_t live_bytes_ = 0;
  int live_storages_ = 0;
  std::int64_t peak_live_bytes_ = 0;
};

}  // namespace shardscope
