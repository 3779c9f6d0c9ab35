#include "harness/strategies/deepspeed_layout.hpp"

#include <algorithm>

#include "harness/predict/transformer_forms.hpp"
#include "shardscope/check.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {

namespace {

// Rank r's partition, given where each tensor starts (starts[t], T + 1 entries).
DsPartition partition_of(const std::vector<std::int64_t>& starts, int world, int rank) {
  DsPartition p;
  const int T = static_cast<int>(starts.size()) - 1;
  p.elems = starts[T];
  const std::int64_t align = 2 * static_cast<std::int64_t>(world);
  p.padded = (p.elems + align - 1) / align * align;
  p.size = p.padded / world;
  const std::int64_t begin = p.size * rank, end = begin + p.size;
  p.real = std::max<std::int64_t>(0, std::min(end, p.elems) - begin);
  if (p.real == 0) return p;  // all padding: no tensor touches it
  // The first tensor ending past `begin` and the first starting at or past `end` (empty
  // tensors end where they start, so neither search stops at one).
  p.first_tensor = static_cast<int>(std::upper_bound(starts.begin() + 1, starts.end(), begin) - starts.begin()) - 1;
  p.end_tensor = static_cast<int>(std::lower_bound(starts.begin(), starts.end() - 1, end) - starts.begin());
  p.offset = begin - starts[p.first_tensor];
  p.touching = starts[p.end_tensor] - starts[p.first_tensor];
  return p;
}

std::vector<std::int64_t> starts_of(const std::vector<std::int64_t>& tensor_elems) {
  std::vector<std::int64_t> starts(tensor_elems.size() + 1, 0);
  for (std::size_t t = 0; t < tensor_elems.size(); ++t) starts[t + 1] = starts[t] + tensor_elems[t];
  return starts;
}

}  // namespace

DsPartition ds_partition(const std::vector<std::int64_t>& tensor_elems, int world, int rank) {
  return partition_of(starts_of(tensor_elems), world, rank);
}

std::vector<DsPartition> ds_partitions(const std::vector<std::int64_t>& tensor_elems, int world) {
  const std::vector<std::int64_t> starts = starts_of(tensor_elems);
  std::vector<DsPartition> out;
  out.reserve(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) out.push_back(partition_of(starts, world, r));
  return out;
}

std::vector<std::int64_t> model_tensor_elems(const ModelConfig& model) {
  if (model.is_transformer()) return transformer_tensor_sizes(model.transformer);
  std::vector<std::int64_t> out;
  for (int t = 0; t < model.param_tensors(); ++t) out.push_back(model.tensor_elems(t));
  return out;
}

std::int64_t ds_bucket_elems(double bucket_mb, const std::vector<std::int64_t>& tensor_elems) {
  if (bucket_mb <= 0.0) {
    std::int64_t params = 0, largest = 0;
    for (std::int64_t n : tensor_elems) {
      params += n;
      largest = std::max(largest, n);
    }
    return std::min(params, std::max(kDeepSpeedBucketElems, largest));
  }
  return static_cast<std::int64_t>(bucket_mb * 1024.0 * 1024.0 / 4.0);
}

std::vector<DsStage0Bucket> ds_stage0_buckets(const std::vector<std::int64_t>& tensor_elems, double bucket_mb) {
  const std::int64_t cap =
      bucket_mb <= 0.0 ? kDeepSpeedBucketElems : static_cast<std::int64_t>(bucket_mb * 1024.0 * 1024.0 / 4.0);
  std::vector<DsStage0Bucket> buckets;
  DsStage0Bucket b;
  for (int t = 0; t < static_cast<int>(tensor_elems.size()); ++t) {
    b.elems += tensor_elems[t];
    b.end = t + 1;
    if (b.elems > cap) {  // allreduce_no_retain: `if numel > numel_per_bucket`, after adding
      buckets.push_back(b);
      b = DsStage0Bucket{t + 1, t + 1, 0};
    }
  }
  if (b.end > b.first) buckets.push_back(b);
  return buckets;
}

std::int64_t Ds3Layout::real(int t, int rank) const {
  const std::int64_t begin = part[t] * rank;
  return std::max<std::int64_t>(0, std::min(part[t], elems[t] - begin));
}

Ds3Layout ds3_layout(const std::vector<std::int64_t>& tensor_elems, int world, std::int64_t threshold) {
  Ds3Layout l;
  for (std::int64_t n : tensor_elems) {
    const std::int64_t c = (n + world - 1) / world;
    l.elems.push_back(n);
    l.part.push_back(c);
    l.offset.push_back(l.flat);
    l.persistent.push_back(n <= threshold);
    l.flat += c;
  }
  return l;
}

void refuse_deepspeed_no_sync(const RunConfig& cfg) {
  if (!cfg.no_sync || (cfg.strategy != StrategyKind::zero2 && cfg.strategy != StrategyKind::zero3)) return;
  throw UsageError("--no-sync and --engine deepspeed and --strategy " + std::string(strategy_name(cfg.strategy)) +
                   ": DeepSpeed's no_sync asserts it is incompatible with ZeRO stage 2/3 (they partition gradients as "
                   "backward runs); allowed: --strategy zero1, or --accumulate without --no-sync");
}

}  // namespace shardscope
