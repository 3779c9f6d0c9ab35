// GPT-2 and Llama under autocast(bfloat16) through ddp and zero1 on every emulated rank of
// W = 1 to 4: each rank saves what the autocast form says, and rests and communicates
// exactly what the fp32 closed forms predict (autocast keeps parameters, gradients and
// AdamW state fp32, and frees every weight cast by the end of the backward; the
// all-reduce carries the fp32 gradients). The step's peak under bf16 has no closed form
// yet; it is not compared.
#include <gtest/gtest.h>

#include <string>

#include "harness/predict/autocast_forms.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::mode_name;

ModelConfig autocast_model(const char* family, AttentionMode mode) {
  const bool gpt2 = std::string(family) == "gpt2";
  const TransformerShape t = gpt2 ? testing::shape("gpt2", 2, 32, 4, 4, 128, 37, 8, mode)
                                  : testing::shape("llama", 2, 32, 4, 2, 48, 37, 8, mode);
  ModelConfig m = testing::transformer_model(family, t, 2);
  m.autocast = true;
  return m;
}

TEST(AutocastRanks, EveryRankSavesItsFormAndRestsAndCommunicatesAsPredicted) {
  int checked = 0;
  for (const char* family : {"gpt2", "llama"})
    for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash})
      for (const char* strategy : {"ddp", "zero1"})
        for (int world : {1, 2, 3, 4})
          for (int rank = 0; rank < world; ++rank) {
            RunConfig cfg;
            cfg.model = autocast_model(family, mode);
            cfg.steps = 2;
            cfg.strategy = parse_strategy(strategy);
            SCOPED_TRACE(std::string(family) + " " + mode_name(mode) + " " + strategy + " W=" +
                         std::to_string(world) + " r=" + std::to_string(rank));
            CpuBackend backend;
            auto comm = make_fake_communicator(world, rank, &backend);
            const auto r = testing::run_dp(cfg, backend, *comm, false);
            const AutocastSaved form = std::string(family) == "gpt2"
                                           ? gpt2_saved_after_forward_autocast(cfg.model.transformer, 2)
                                           : llama_saved_after_forward_autocast(cfg.model.transformer, 2);
            EXPECT_EQ(r.saved.bytes, form.total().bytes);
            EXPECT_EQ(r.saved.tensors, form.total().tensors);
            const Prediction p = predict_data_parallel(cfg, world, rank);
            EXPECT_EQ(r.resting, p.resting);
            for (int k = 0; k < kCollKindCount; ++k)
              EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]) << kCollKindNames[k];
            // The casts are on the step's peak: it holds at least the saves and the model states.
            EXPECT_GE(r.peak.total, p.resting.total() + form.total().bytes);
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 2 * 2 * 10);
}

}  // namespace
}  // namespace shardscope
