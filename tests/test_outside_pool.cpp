// The device memory outside the pool, part by part (harness/run/records: outside_pool_parts;
// docs/json.md): what the rest ("other") is, when it is known, the JSON it is written as and
// read back from, and the table that shows it. The figures come from a CUDA run; here they
// are made by hand (no GPU), so the arithmetic and the record are what is tested.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "harness/records/json_read.hpp"
#include "harness/records/json_write.hpp"
#include "harness/report/table.hpp"
#include "harness/run/records.hpp"
#include "support/records_of.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

constexpr std::int64_t kContext = 525'336'576;
constexpr std::int64_t kCublas = 8'388'608;
constexpr std::int64_t kNcclInit = 203'423'744;
constexpr std::int64_t kNcclTotal = 413'138'944;
constexpr std::int64_t kOutside = 1'000'000'000;

OutsidePoolBreakdown breakdown(const std::string& source, bool context_measured) {
  OutsidePoolBreakdown b;
  if (context_measured) b.cuda_context = {kContext, source};
  b.cublas = {kCublas, source};
  b.nccl.push_back({"world", 2, {kNcclInit, source}, {kNcclTotal, source}});
  return b;
}

TEST(OutsidePoolParts, OtherIsTheFigureLessEveryPartWithNvml) {
  const OutsidePoolParts p = outside_pool_parts(breakdown("nvml", true), {kOutside, "nvml"});
  ASSERT_EQ(p.cuda_context.bytes, kContext);
  EXPECT_EQ(p.cuda_context.source, "nvml");
  EXPECT_EQ(p.cublas.bytes, kCublas);
  ASSERT_EQ(p.nccl.size(), 1u);
  EXPECT_EQ(p.nccl[0].communicator, "world");
  EXPECT_EQ(p.nccl[0].ranks, 2);
  EXPECT_EQ(p.nccl[0].init_bytes, kNcclInit);
  EXPECT_EQ(p.nccl[0].bytes, kNcclTotal);
  ASSERT_TRUE(p.other.has_value());
  EXPECT_EQ(*p.other, kOutside - kContext - kCublas - kNcclTotal);
}

TEST(OutsidePoolParts, WithCudaMemGetInfoTheContextIsNeitherMeasuredNorInTheFigure) {
  const OutsidePoolParts p =
      outside_pool_parts(breakdown("cuda_mem_get_info_delta", false), {kOutside, "cuda_mem_get_info_delta"});
  EXPECT_FALSE(p.cuda_context.bytes.has_value());
  EXPECT_EQ(p.cuda_context.source, "not measured");
  ASSERT_TRUE(p.other.has_value());
  EXPECT_EQ(*p.other, kOutside - kCublas - kNcclTotal);
}

TEST(OutsidePoolParts, OtherIsUnknownWhenAPartInItIsNotMeasuredOrThePartsExceedIt) {
  // NVML's figure holds the context, but the context was not measured.
  EXPECT_FALSE(outside_pool_parts(breakdown("nvml", false), {kOutside, "nvml"}).other.has_value());
  OutsidePoolBreakdown lost = breakdown("nvml", true);
  lost.nccl[0].total = {};
  const OutsidePoolParts p = outside_pool_parts(lost, {kOutside, "nvml"});
  EXPECT_FALSE(p.nccl[0].bytes.has_value());
  EXPECT_EQ(p.nccl[0].init_bytes, kNcclInit);
  EXPECT_FALSE(p.other.has_value());
  EXPECT_FALSE(outside_pool_parts(breakdown("nvml", true), {kContext, "nvml"}).other.has_value());
  EXPECT_FALSE(outside_pool_parts(breakdown("nvml", true), {}).other.has_value());
}

// A rank record as a CUDA run writes it, with its parts.
json cuda_rank() {
  RankRecord r;
  r.allocator.pool = PoolFigures{1, 2, 3, 4};
  r.allocator.outside_pool_bytes = kOutside;
  r.allocator.outside_pool_source = "nvml";
  r.allocator.outside_pool_parts = outside_pool_parts(breakdown("nvml", true), {kOutside, "nvml"});
  return to_json(r);
}

TEST(OutsidePoolParts, WrittenAndReadBack) {
  const json written = cuda_rank();
  const json& parts = written.at("outside_pool_parts");
  EXPECT_EQ(parts.at("cuda_context"), (json{{"bytes", kContext}, {"source", "nvml"}}));
  EXPECT_EQ(parts.at("cublas"), (json{{"bytes", kCublas}, {"source", "nvml"}}));
  EXPECT_EQ(parts.at("nccl"), json::array({{{"communicator", "world"}, {"ranks", 2}, {"init_bytes", kNcclInit},
                                            {"bytes", kNcclTotal}, {"source", "nvml"}}}));
  EXPECT_EQ(parts.at("other"), kOutside - kContext - kCublas - kNcclTotal);
  const RankRecord back = read_rank_record(written, "rank 0");
  ASSERT_TRUE(back.allocator.outside_pool_parts.has_value());
  EXPECT_EQ(to_json(back), written);
}

TEST(OutsidePoolParts, CpuWritesNullAndOlderFilesMayLeaveItOut) {
  json cpu = to_json(RankRecord{});
  EXPECT_TRUE(cpu.at("outside_pool_parts").is_null());
  EXPECT_FALSE(read_rank_record(cpu, "cpu").allocator.outside_pool_parts.has_value());
  cpu.erase("outside_pool_parts");
  EXPECT_FALSE(read_rank_record(cpu, "older").allocator.outside_pool_parts.has_value());
}

TEST(OutsidePoolParts, ABadSourceOrByteCountIsRefusedNamingTheField) {
  json bad = cuda_rank();
  bad["outside_pool_parts"]["cublas"]["source"] = "guess";
  try {
    (void)read_rank_record(bad, "r.json");
    FAIL() << "a source other than nvml, cuda_mem_get_info_delta or not measured was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("outside_pool_parts.cublas.source"), std::string::npos) << e.what();
  }
  bad = cuda_rank();
  bad["outside_pool_parts"]["nccl"][0]["bytes"] = -5;
  EXPECT_THROW((void)read_rank_record(bad, "r.json"), UsageError);
}

json document(const json& rank) {
  json run = {{"kind", "data_parallel"}, {"strategy", "ddp"},     {"world", 2},
              {"units", 1},              {"layers_per_unit", "all"}, {"prefetch", 1},
              {"steps", 3},              {"timed_steps", 2},       {"ranks", json::array({rank})},
              {"model", {{"layers", 2}, {"width", 8}, {"params", 144}, {"param_tensors", 4}, {"param_bytes", 576},
                         {"activation", "none"}, {"loss", "sum"}, {"batch", 4}}}};
  return {{"schema", "shardscope/1"}, {"backend", "cuda"}, {"comm", "nccl"}, {"emulated", false},
          {"runs", json::array({run})}};
}

TEST(OutsidePoolParts, TheTablesShowThemForCudaAndNothingForCpu) {
  std::ostringstream cuda, cpu;
  print_tables(testing::records_of(document(cuda_rank())), cuda, TableOptions{true, true});
  const std::string text = cuda.str();
  EXPECT_NE(text.find("device memory outside the pool, per rank"), std::string::npos) << text;
  EXPECT_NE(text.find("1,000,000,000"), std::string::npos) << text;
  EXPECT_NE(text.find("525,336,576"), std::string::npos) << text;
  EXPECT_NE(text.find("world (2 ranks) 413,138,944, 203,423,744 at init"), std::string::npos) << text;
  EXPECT_NE(text.find("53,135,872"), std::string::npos) << text;  // other: 1e9 - 525,336,576 - 8,388,608 - 413,138,944

  json cpu_rank = to_json(RankRecord{});
  print_tables(testing::records_of(document(cpu_rank)), cpu, TableOptions{true, true});
  EXPECT_EQ(cpu.str().find("outside the pool"), std::string::npos) << cpu.str();
}

}  // namespace
}  // namespace shardscope
