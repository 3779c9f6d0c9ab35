// Memory categories (docs/design.md §1): every tracked allocation carries exactly one.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardscope {

enum class Category : std::uint8_t {
  param,            // persistent parameters or their shard
  param_unsharded,  // transient gathered copies of parameters
  grad,             // persistent gradients or their shard
  grad_unsharded,   // transient full gradients before a reduce-scatter
  optim,            // optimizer state (exp_avg, exp_avg_sq, step)
  activation,       // tensors computed by the model and saved for backward
  comm,             // collective and p2p staging buffers
  temp,             // every other transient: unsaved outputs, batch, target, scratch
  workspace,        // a backend's own resident buffers: cuBLAS's workspace on cuda (none on cpu)
  master,           // fp32 master copies of bf16 parameters (--precision bf16 where parameters are bf16)
  param_cast,       // bf16 copies of fp32 parameters: autocast's weight casts, FSDP's bf16 gathered units
};

inline constexpr int kCategoryCount = 11;

// Categories that came after the first result files: a file without one held none of it.
// Files list the first 8 (before workspace), the first 9 (before master and param_cast),
// or all.
inline constexpr int kCategoriesBeforeWorkspace = 8;
inline constexpr int kCategoriesBeforePrecision = 9;

// The categories' names, in Category's order: the JSON's keys, the CSV's rows, the
// timeline's columns and the order every table and chart stacks them in.
inline constexpr std::array<const char*, kCategoryCount> kCategoryNames = {
    "param", "param_unsharded", "grad", "grad_unsharded",
    "optim", "activation",      "comm", "temp", "workspace", "master", "param_cast"};

inline constexpr std::string_view category_name(Category c) {
  return kCategoryNames[static_cast<int>(c)];
}

// Bytes per category; `total()` is their sum.
struct CategoryBytes {
  std::array<std::int64_t, kCategoryCount> bytes{};

  std::int64_t& operator[](Category c) { return bytes[static_cast<int>(c)]; }
  std::int64_t operator[](Category c) const { return bytes[static_cast<int>(c)]; }
  std::int64_t total() const {
    std::int64_t t = 0;
    for (std::int64_t b : bytes) t += b;
    return t;
  }
  bool operator==(const CategoryBytes& o) const { return bytes == o.bytes; }
  bool operator!=(const CategoryBytes& o) const { return !(*this == o); }
};

// What the caller is doing when memory moves; recorded with the peak.
enum class Phase : std::uint8_t { setup, forward, backward, communication, optimizer, idle };

inline constexpr std::string_view phase_name(Phase p) {
  constexpr std::array<std::string_view, 6> names = {
      "setup", "forward", "backward", "communication", "optimizer", "idle"};
  return names[static_cast<int>(p)];
}

// Where in the model: a layer, a unit (FSDP-style group of layers), a micro-batch
// action, or the re-run of a checkpointed block's forward at the start of its backward.
enum class PlaceKind : std::uint8_t { none, layer, unit, tensor, microbatch, recompute };

struct Place {
  PlaceKind kind = PlaceKind::none;
  int index = 0;
  bool operator==(const Place& o) const { return kind == o.kind && index == o.index; }
};

// "layer 3", "unit 3", "tensor 3", "micro-batch 3", "recompute of block 3" (the
// model's block index); "-" for no place.
inline std::string describe_place(const Place& place) {
  switch (place.kind) {
    case PlaceKind::layer: return "layer " + std::to_string(place.index);
    case PlaceKind::unit: return "unit " + std::to_string(place.index);
    case PlaceKind::tensor: return "tensor " + std::to_string(place.index);
    case PlaceKind::microbatch: return "micro-batch " + std::to_string(place.index);
    case PlaceKind::recompute: return "recompute of block " + std::to_string(place.index);
    case PlaceKind::none: break;
  }
  return "-";
}

}  // namespace shardscope
