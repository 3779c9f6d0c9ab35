// How DeepSpeed's ZeRO stages 1 and 2 split a model (docs/design.md, "DeepSpeed"), shared by
// the strategy (deepspeed.hpp) and the closed forms (harness/predict/deepspeed_forms.hpp).
//
// Every parameter tensor, in torch's order, is one flat group: P elements padded up to a
// multiple of 2·W (DeepSpeed's nccl_start_alignment_factor of 2 elements, times the world),
// Ppad; rank r owns the contiguous partition [r·s, (r + 1)·s), s = Ppad / W. The tensors a
// partition touches (whole or in part) are the ones whose gradients DeepSpeed copies, whole,
// into the rank's grads_in_partition buffer; the partition's elements that are not
// parameters (past P) are the padding its averaged gradient is completed with.
#pragma once

#include <cstdint>
#include <vector>

#include "shardscope/config.hpp"

namespace shardscope {

struct DsPartition {
  std::int64_t elems = 0;   // P
  std::int64_t padded = 0;  // Ppad, a multiple of 2·W
  std::int64_t size = 0;    // s = Ppad / W
  // Rank r's view: the tensors [first_tensor, end_tensor) touch its partition (none when
  // the partition is all padding), `touching` elements together; `offset` is where the
  // partition starts inside the first of them; `real` of its s elements are parameters.
  int first_tensor = 0, end_tensor = 0;
  std::int64_t touching = 0;
  std::int64_t offset = 0;
  std::int64_t real = 0;

  std::int64_t pad() const { return size - real; }
  bool touches(int t) const { return t >= first_tensor && t < end_tensor; }
};

// Rank `rank`'s partition of the tensors `tensor_elems` (in flat order) over `world` ranks.
DsPartition ds_partition(const std::vector<std::int64_t>& tensor_elems, int world, int rank);
// Every rank's, in rank order: O(T + W log T).
std::vector<DsPartition> ds_partitions(const std::vector<std::int64_t>& tensor_elems, int world);

// Every parameter tensor's elements in torch's (and the flat group's) order: the MLP's
// weight, bias, weight, ...; a transformer's transformer_tensor_sizes.
std::vector<std::int64_t> model_tensor_elems(const ModelConfig& model);

// Stage 3 (partition_parameters.py): every tensor partitioned on its own, rank r holding
// elements [r·c, (r + 1)·c) of it, c = ceil(n / W), zero past n (its ds_tensor); the rank's
// partitions concatenated in tensor order are its flat partition of C = Σ c elements (one
// optimizer sub-group: this tool's models stay below 10^9 partition elements). A tensor
// of at most `threshold` elements (stage3_param_persistence_threshold) is persistent: kept
// gathered between steps.
struct Ds3Layout {
  std::vector<std::int64_t> elems;   // n_t
  std::vector<std::int64_t> part;    // c_t
  std::vector<std::int64_t> offset;  // where tensor t's partition starts in the flat partition
  std::vector<bool> persistent;
  std::int64_t flat = 0;             // C
  // Of tensor t, the elements rank r's partition holds that are parameters (c_t, fewer past n_t).
  std::int64_t real(int t, int rank) const;
};
Ds3Layout ds3_layout(const std::vector<std::int64_t>& tensor_elems, int world, std::int64_t threshold);

// DeepSpeed's engine.no_sync asserts it is incompatible with the stages that partition
// gradients (2 and 3): --no-sync with them is a UsageError naming both; stage 1 takes it.
void refuse_deepspeed_no_sync(const RunConfig& cfg);

// The ipg bucket's elements under --bucket-mb (MiB of fp32 gradients): 0 means DeepSpeed's
// default reduce_bucket_size, 5e8 elements, but never more than the model's P (a model
// that small is trained whole in one bucket) nor less than its largest tensor (DeepSpeed
// reduces a tensor above the bucket on its own; one bucket that holds it stands for that).
inline constexpr std::int64_t kDeepSpeedBucketElems = 500'000'000;
std::int64_t ds_bucket_elems(double bucket_mb, const std::vector<std::int64_t>& tensor_elems);

// Stage 0 (ddp under bf16; engine.py's buffered_allreduce_fallback and allreduce_no_retain):
// the gradients in parameter order, a bucket closed as soon as it holds more than `cap`
// elements (elements_per_buffer), the rest one last bucket; bucket b holds the tensors
// [first, end), `elems` elements. The engine passes allreduce_gradients' default,
// MEMORY_OPT_ALLREDUCE_SIZE (5e8; its config has no key for it); --bucket-mb stands for it
// (MiB of fp32, as above; 0: 5e8).
struct DsStage0Bucket {
  int first = 0, end = 0;
  std::int64_t elems = 0;
};
std::vector<DsStage0Bucket> ds_stage0_buckets(const std::vector<std::int64_t>& tensor_elems, double bucket_mb);

}  // namespace shardscope
