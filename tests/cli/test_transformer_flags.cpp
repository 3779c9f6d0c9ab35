// The transformer's command line: --model gpt2|llama, --hf-config FILE (Hugging Face's
// config.json of gpt2, llama, mistral and qwen2) and the shape flags that override it.
// The published configs (tests/data/hf/) give the published parameter counts through the
// real binary; every refusal is exit 2 with one line naming the flag or the config's field.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/cli/cli.hpp"
#include "harness/cli/hf_config.hpp"
#include "harness/records/json_read.hpp"
#include "harness/records/json_write.hpp"
#include "harness/run/records.hpp"
#include "harness/predict/transformer_forms.hpp"
#include "shardscope/check.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

std::string hf(const std::string& name) { return testing::env("SHARDSCOPE_TEST_DATA_DIR") + "/hf/" + name; }

// The UsageError's message of parsing `args` as run's flags ("" when accepted).
std::string refusal(const std::vector<std::string>& args) {
  try {
    (void)parse_run_args(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// The same for a config.json's text.
std::string config_refusal(const std::string& text) {
  try {
    (void)parse_hf_config(text, "c.json");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

class TransformerFlags : public testing::BinaryTest {
 protected:
  void SetUp() override {
    BinaryTest::SetUp();
    if (testing::env("SHARDSCOPE_TEST_DATA_DIR").empty()) GTEST_SKIP() << "run through ctest";
  }
  int shardscope(const std::string& args) {
    const int rc = testing::shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' " + args + " > out.txt 2> err.txt");
    std::ifstream in(dir_ + "/out.txt");
    out_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::ifstream e(dir_ + "/err.txt");
    err_.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
    return rc;
  }
  std::string out_, err_;
};

// The three counts the issue holds, from the published config.json files, as the plan
// prints them and writes them.
TEST_F(TransformerFlags, PlanPrintsThePublishedParameterCounts) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gpt2.json", "124,439,808"}, {"llama-2-7b.json", "6,738,415,616"}, {"llama-3-8b.json", "8,030,261,248"}};
  for (const auto& [file, count] : cases) {
    SCOPED_TRACE(file);
    ASSERT_EQ(shardscope("plan --hf-config '" + hf(file) + "' --worlds 8 --strategies ddp --json plan.json"), 0) << err_;
    EXPECT_NE(out_.find("P = " + count + " params"), std::string::npos) << out_;
    std::ifstream in(dir_ + "/plan.json");
    const json plan = json::parse(in);
    const json& model = plan["plans"][0]["model"];
    std::string digits = count;
    digits.erase(std::remove(digits.begin(), digits.end(), ','), digits.end());
    EXPECT_EQ(model["params"].get<std::int64_t>(), std::stoll(digits));
    EXPECT_EQ(model["param_bytes"].get<std::int64_t>(), 4 * std::stoll(digits));
    EXPECT_EQ(model["family"], file == "gpt2.json" ? "gpt2" : "llama");
    EXPECT_EQ(model["shape"]["seq"], 1024);
    // ddp at rest: 16P + 4T; the peak from each family's activation forms.
    const json& rank = plan["plans"][0]["rank_groups"][0]["predicted"];
    EXPECT_EQ(rank["resting_total"].get<std::int64_t>(),
              16 * std::stoll(digits) + 4 * model["param_tensors"].get<std::int64_t>());
    EXPECT_GT(rank["peak_total"].get<std::int64_t>(), rank["resting_total"].get<std::int64_t>());
  }
}

// The issue's plan at real scale: every strategy, two worlds, --memory; in well under a
// second (the closed forms are O(tensors + units + world)).
TEST_F(TransformerFlags, Llama3PlanAtEightThousandTokensAnswersAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(shardscope("plan --hf-config '" + hf("llama-3-8b.json") +
                       "' --seq 8192 --batch 1 --worlds 8,64 --strategies ddp,zero1,zero2,zero3 --memory 80GiB "
                       "--json plan.json"),
            0)
      << err_;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);  // under a second alone; room for a loaded machine
  EXPECT_NE(out_.find("seq 8192"), std::string::npos) << out_;
  EXPECT_NE(out_.find("forward, layer 33"), std::string::npos) << out_;  // ddp's peak: forward's end
  // The default tables fit 120 columns (characters: "×" is two bytes).
  std::istringstream lines(out_);
  for (std::string line; std::getline(lines, line);) {
    std::size_t columns = 0;
    for (const unsigned char c : line) columns += (c & 0xC0) != 0x80;
    EXPECT_LE(columns, 120u) << line;
  }
  std::ifstream in(dir_ + "/plan.json");
  const json plan = json::parse(in);
  ASSERT_EQ(plan["plans"].size(), 8u);
  // ddp's model states alone (120 GiB) exceed 80 GiB: "does not fit" is known without a peak.
  EXPECT_EQ(plan["plans"][0]["fits_every_rank"], false);
  // zero3 at W = 64 rests far below it (1.87 GiB) but peaks above it: 8192 tokens' fp32
  // activations of 32 layers are 86 GiB.
  EXPECT_EQ(plan["plans"][7]["fits_every_rank"], false);
  EXPECT_LT(plan["plans"][7]["rank_groups"][0]["predicted"]["resting_total"].get<std::int64_t>(), 2LL << 30);
}

TEST_F(TransformerFlags, RefusalsAreExitTwoWithOneLineNamingTheField) {
  std::ofstream(dir_ + "/bert.json") << R"({"model_type": "bert", "hidden_size": 768})";
  EXPECT_EQ(shardscope("plan --hf-config bert.json"), 2);
  EXPECT_EQ(err_, "shardscope: error: --hf-config bert.json: model_type: 'bert' is not a family shardscope models; "
                  "allowed: gpt2, llama, mistral, qwen2\n");
  EXPECT_EQ(shardscope("plan --hf-config '" + hf("gpt2.json") + "' --width 64"), 2);
  EXPECT_NE(err_.find("--width is the MLP's flag"), std::string::npos) << err_;
  EXPECT_EQ(shardscope("run --hidden 64"), 2);
  EXPECT_NE(err_.find("--hidden is a transformer's flag"), std::string::npos) << err_;
  // Each size within its cap, the whole beyond 64 bits (head_dim set by the config).
  std::ofstream(dir_ + "/big.json") << R"({"model_type": "llama", "hidden_size": 1048576, "intermediate_size": 64,
      "num_hidden_layers": 10000, "num_attention_heads": 65536, "head_dim": 65536, "vocab_size": 100,
      "max_position_embeddings": 64})";
  EXPECT_EQ(shardscope("plan --hf-config big.json"), 2);
  EXPECT_NE(err_.find("make more than 2^62 bytes of model states"), std::string::npos) << err_;
  EXPECT_EQ(shardscope("run --hf-config missing.json"), 2);
  EXPECT_NE(err_.find("--hf-config missing.json: cannot read it"), std::string::npos) << err_;
}

// Each family runs data parallel, every figure of the record equal to its prediction.
class TransformerRuns : public TransformerFlags {
 protected:
  // The run's record (rank 1 of 2, emulated): its saves, peak and resting bytes equal
  // their predictions.
  void expect_record_as_predicted(const std::string& run) {
    ASSERT_EQ(shardscope(run + " --emulate 2:1 --json g.json"), 0) << run << ": " << err_;
    std::ifstream in(dir_ + "/g.json");
    const json rank = json::parse(in)["runs"][0]["ranks"][0];
    EXPECT_EQ(rank["saved"], rank["predicted"]["saved"]) << run;
    EXPECT_EQ(rank["peak"]["total"], rank["predicted"]["peak_total"]) << run;
    EXPECT_EQ(rank["peak"]["by_category"], rank["predicted"]["peak_by_category"]) << run;
    EXPECT_EQ(rank["peak"]["where"], rank["predicted"]["peak_where"]) << run;
    EXPECT_EQ(rank["resting"]["total"], rank["predicted"]["resting_total"]) << run;
  }
  void expect_runs_as_predicted(const std::string& run, const char* const (&settings)[3]) {
    for (const char* s : settings) expect_record_as_predicted(run + s);
  }
};

TEST_F(TransformerRuns, Gpt2RunsDataParallelAsPredicted) {
  expect_runs_as_predicted("run --model gpt2 --layers 2 --hidden 32 --heads 2 --vocab 50 --seq 8 --batch 2 --steps 2 ",
                           {"--strategy ddp", "--strategy zero1", "--strategy zero3 --units 1 --attention math"});
}

// GPT-2 and Llama pipelined, every figure of a stage's record equal to its prediction (the
// last stage with its copy of a tied embedding, the all-reduce of its gradient in
// comm_bytes); zb-h1's split of a transformer's blocks is refused.
TEST_F(TransformerRuns, TransformersRunPipelinedAsPredicted) {
  const std::string g = "run --model gpt2 --layers 4 --hidden 32 --heads 2 --vocab 50 --seq 8 --batch 2 --steps 2 ";
  const std::string l = "run --model llama --layers 4 --hidden 32 --heads 4 --kv-heads 2 --ffn 48 --vocab 50 --seq 8 "
                        "--batch 2 --steps 2 ";
  struct Case {
    std::string run;
    std::int64_t tied_bytes;  // the all-reduce on the first and last stage
  };
  for (const Case& c : {Case{g + "--schedule gpipe --emulate 2:0", 6400},
                        Case{g + "--schedule 1f1b --emulate 2:1 --attention math", 6400},
                        Case{g + "--schedule interleaved-1f1b --chunks 2 --emulate 2:1", 6400},
                        Case{l + "--schedule 1f1b --emulate 2:1", 0},
                        Case{l + "--schedule gpipe --emulate 2:0 --attention math", 0},
                        Case{g + "--schedule zb-h1 --microbatches 2 --emulate 2:1", 6400},
                        Case{l + "--schedule zb-h1 --microbatches 2 --emulate 2:0 --attention math", 0}}) {
    ASSERT_EQ(shardscope(c.run + " --json p.json"), 0) << c.run << ": " << err_;
    std::ifstream in(dir_ + "/p.json");
    const json stage = json::parse(in)["runs"][0]["stages"][0];
    const json& p = stage["predicted"];
    for (const char* k : {"peak_live_tensors", "peak_live_bytes", "total_tensors", "before_first_backward"})
      EXPECT_EQ(stage["saved"][k], p[k]) << c.run << " " << k;
    EXPECT_EQ(stage["peak"]["by_category"], p["peak_by_category"]) << c.run;
    EXPECT_EQ(stage["resting"]["total"], p["resting_total"]) << c.run;
    EXPECT_EQ(stage["p2p"]["sent_bytes"], p["p2p_sent_bytes"]) << c.run;
    EXPECT_EQ(stage["comm_bytes"], p["comm_bytes"]) << c.run;
    // The p2p both ways, and GPT-2's tied wte all-reduced (4 x 50 x 32 B).
    EXPECT_EQ(stage["comm_bytes"].get<std::int64_t>(),
              2 * stage["p2p"]["sent_bytes"].get<std::int64_t>() + c.tied_bytes)
        << c.run;
  }
}

TEST_F(TransformerRuns, LlamaRunsDataParallelAsPredicted) {
  expect_runs_as_predicted("run --model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 48 --vocab 50 "
                           "--seq 8 --batch 2 --steps 2 ",
                           {"--strategy ddp --attention math", "--strategy zero1", "--strategy zero3 --units 1"});
}

// The published Llama-3-8B and Qwen2-0.5B configs (rope_theta, rms_norm_eps; qwen2's q,
// k, v biases and tied head) run at a small shape the flags give, as predicted.
TEST_F(TransformerRuns, PublishedLlamaFamilyConfigsRunAsPredicted) {
  for (const char* file : {"llama-3-8b.json", "qwen2-0.5b.json"})
    expect_record_as_predicted("run --hf-config '" + hf(file) +
                               "' --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 101 --seq 8 "
                               "--batch 2 --steps 2 --strategy zero3 --units 1");
}

TEST_F(TransformerFlags, HelpListsTheFlags) {
  ASSERT_EQ(shardscope("run --help"), 0);
  for (const char* flag : {"--model", "--hf-config", "--hidden", "--heads", "--kv-heads", "--ffn", "--vocab", "--seq",
                           "--positions", "--attention"})
    EXPECT_NE(out_.find(flag), std::string::npos) << flag;
}

// Flags beside --hf-config override it; sizes that follow others follow them.
TEST(TransformerShapeFlags, FlagsOverrideTheConfigAndDefaultsFollow) {
  if (testing::env("SHARDSCOPE_TEST_DATA_DIR").empty()) GTEST_SKIP() << "run through ctest";
  RunConfig c = parse_run_args({"--hf-config", hf("llama-3-8b.json")});
  EXPECT_EQ(c.model.name, "llama");
  const TransformerShape& s = c.model.transformer;
  EXPECT_EQ(s.layers, 32);
  EXPECT_EQ(s.kv_heads, 8);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.ffn, 14336);
  EXPECT_EQ(s.vocab, 128256);
  EXPECT_EQ(s.positions, 8192);
  EXPECT_EQ(s.seq, 1024);  // min(1024, positions)
  EXPECT_FLOAT_EQ(s.rope_theta, 500000.0f);
  EXPECT_FALSE(s.tied_embeddings);
  EXPECT_EQ(s.attention, AttentionMode::flash);
  EXPECT_EQ(c.model.batch, 1);

  c = parse_run_args({"--hf-config", hf("llama-3-8b.json"), "--layers", "2", "--seq", "8192", "--attention", "math",
                      "--batch", "4"});
  EXPECT_EQ(c.model.transformer.layers, 2);
  EXPECT_EQ(c.model.layers, 2);
  EXPECT_EQ(c.model.transformer.seq, 8192);
  EXPECT_EQ(c.model.transformer.attention, AttentionMode::math);
  EXPECT_EQ(c.model.batch, 4);
  EXPECT_EQ(transformer_params(c.model.transformer), 2 * 218'112'000LL + 2 * 525'336'576LL + 4096);

  // --heads: the config's own kv heads (8) stay; with kv == heads they follow the heads.
  c = parse_run_args({"--hf-config", hf("llama-3-8b.json"), "--heads", "16"});
  EXPECT_EQ(c.model.transformer.kv_heads, 8);
  EXPECT_EQ(c.model.transformer.head_dim, 256);
  c = parse_run_args({"--hf-config", hf("llama-2-7b.json"), "--heads", "16"});
  EXPECT_EQ(c.model.transformer.kv_heads, 16);

  // gpt2's inner width is 4 x hidden unless given; positions bound the default seq.
  c = parse_run_args({"--model", "gpt2", "--hidden", "256", "--heads", "4", "--positions", "128"});
  EXPECT_EQ(c.model.transformer.ffn, 1024);
  EXPECT_EQ(c.model.transformer.seq, 128);
  EXPECT_TRUE(c.model.transformer.tied_embeddings);
  c = parse_run_args({"--hf-config", hf("gpt2.json"), "--hidden", "256", "--heads", "4", "--ffn", "300"});
  EXPECT_EQ(c.model.transformer.ffn, 300);

  // qwen2: q, k, v biases; tied; mistral and qwen2 are the llama family.
  c = parse_run_args({"--hf-config", hf("qwen2-0.5b.json")});
  EXPECT_EQ(c.model.name, "llama");
  EXPECT_EQ(c.model.transformer.model_type, "qwen2");
  EXPECT_TRUE(c.model.transformer.qkv_bias);
  EXPECT_FALSE(c.model.transformer.out_bias);
  EXPECT_EQ(transformer_params(c.model.transformer), 494'032'768);
  EXPECT_EQ(parse_run_args({"--hf-config", hf("llama-2-70b.json")}).model.transformer.layers, 80);

  // The MLP is unchanged by default.
  c = parse_run_args({});
  EXPECT_EQ(c.model.name, "mlp");
  EXPECT_FALSE(c.model.is_transformer());
  EXPECT_EQ(c.model.batch, 32);
}

TEST(TransformerShapeFlags, EveryRefusalNamesItsFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model", "gpt2", "--width", "64"}, "--width is the MLP's flag"},
      {{"--model", "llama", "--activation", "relu"}, "--activation is the MLP's flag"},
      {{"--model", "llama", "--loss", "mse"}, "--loss is the MLP's flag"},
      {{"--seq", "16"}, "--seq is a transformer's flag"},
      {{"--attention", "math"}, "--attention is a transformer's flag"},
      {{"--model", "gpt3"}, "--model: unknown 'gpt3'; allowed: mlp, gpt2, llama"},
      {{"--model", "gpt2", "--attention", "fast"}, "--attention: unknown 'fast'; allowed: math, flash"},
      {{"--model", "gpt2", "--hidden", "0"}, "--hidden: '0' is not a positive integer"},
      {{"--model", "gpt2", "--hidden", "100", "--heads", "12"}, "heads --heads 12 do not divide the hidden size --hidden 100"},
      {{"--model", "gpt2", "--heads", "5"}, "heads --heads 5 do not divide the hidden size 768 (the gpt2 default)"},
      {{"--model", "gpt2", "--kv-heads", "4"}, "--kv-heads 4: gpt2 has no grouped-query attention"},
      {{"--model", "llama", "--kv-heads", "5"}, "kv heads --kv-heads 5 do not divide the heads 32"},
      {{"--model", "llama", "--kv-heads", "64"}, "kv heads --kv-heads 64 do not divide the heads"},
      {{"--model", "gpt2", "--seq", "2048"}, "--seq 2048 is above the model's positions 1024"},
      {{"--model", "llama", "--layers", "10001"}, "--layers: 10001 is above the largest allowed, 10000"},
      {{"--model", "llama", "--vocab", "99999999"}, "--vocab: 99999999 is above the largest allowed"},
      {{"--model", "gpt2", "--hidden", "2000000"}, "--hidden: 2000000 is above the largest allowed"},
      {{"--model", "llama", "--batch", "10000000", "--positions", "65536", "--seq", "65536"},
       "tokens make more than 2^62 bytes"},
  };
  for (const auto& [args, expected] : cases) {
    const std::string what = refusal(args);
    EXPECT_NE(what.find(expected), std::string::npos) << "got: '" << what << "', wanted: '" << expected << "'";
  }
}

TEST(TransformerShapeFlags, ConfigsWithTheWrongFamilyOrShapesAreRefused) {
  if (testing::env("SHARDSCOPE_TEST_DATA_DIR").empty()) GTEST_SKIP() << "run through ctest";
  EXPECT_NE(refusal({"--model", "gpt2", "--hf-config", hf("llama-3-8b.json")}).find("is a llama (model_type llama)"),
            std::string::npos);
  EXPECT_NE(refusal({"--model", "mlp", "--hf-config", hf("gpt2.json")}).find("--model mlp: --hf-config"), std::string::npos);
  EXPECT_NE(refusal({"--hf-config", hf("llama-3-8b.json"), "--heads", "12"})
                .find("heads --heads 12 do not divide the hidden size 4096 (hidden_size of --hf-config"),
            std::string::npos);
  EXPECT_NE(refusal({"--hf-config", hf("llama-3-8b.json"), "--heads", "12", "--hidden", "1536"})
                .find("kv heads 8 (num_key_value_heads of --hf-config"),
            std::string::npos);
  EXPECT_NE(refusal({"--hf-config", hf("llama-2-7b.json"), "--seq", "4097"}).find("--seq 4097 is above the model's positions 4096 (max_position_embeddings"),
            std::string::npos);
}

// Each field of a config.json: missing, null, of the wrong JSON type, out of range.
TEST(HfConfig, EveryFieldIsCheckedByName) {
  const std::string gpt2 = R"("model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128)";
  const std::string llama =
      R"("model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 256)";
  EXPECT_EQ(config_refusal("{" + gpt2 + R"(, "vocab_size": 100})"), "");
  EXPECT_EQ(config_refusal("{" + llama + "}"), "");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "--hf-config c.json: an array, expected a JSON object"},
      {"{", "--hf-config c.json: not JSON"},
      {"{}", "--hf-config c.json: model_type: missing; expected a string"},
      {R"({"model_type": 7})", "model_type: an integer; expected a string"},
      {R"({"model_type": "t5"})", "model_type: 't5' is not a family shardscope models"},
      {"{" + gpt2 + "}", "vocab_size: missing; expected a positive integer"},
      {"{" + gpt2 + R"(, "vocab_size": null})", "vocab_size: null; expected a positive integer"},
      {"{" + gpt2 + R"(, "vocab_size": "100"})", "vocab_size: a string; expected a positive integer"},
      {"{" + gpt2 + R"(, "vocab_size": 100.5})", "vocab_size: a number with a fraction (100.5)"},
      {"{" + gpt2 + R"(, "vocab_size": -3})", "vocab_size: -3 is not a positive integer"},
      {"{" + gpt2 + R"(, "vocab_size": 0})", "vocab_size: 0 is not a positive integer"},
      {"{" + gpt2 + R"(, "vocab_size": 99999999999})", "vocab_size: 99999999999 is above the largest allowed"},
      {"{" + gpt2 + R"(, "vocab_size": 100, "n_inner": "x"})", "n_inner: a string; expected a positive integer"},
      {"{" + gpt2 + R"(, "vocab_size": 100, "tie_word_embeddings": 1})", "tie_word_embeddings: an integer; expected true or false"},
      {"{" + gpt2 + R"(, "vocab_size": 100, "layer_norm_epsilon": "1e-5"})", "layer_norm_epsilon: a string; expected a positive number"},
      {"{" + llama + R"(, "num_key_value_heads": [2]})", "num_key_value_heads: an array; expected a positive integer"},
      {"{" + llama + R"(, "head_dim": 0})", "head_dim: 0 is not a positive integer"},
      {"{" + llama + R"(, "rope_theta": -1})", "rope_theta: -1 is out of range"},
      {"{" + llama + R"(, "attention_bias": "no"})", "attention_bias: a string; expected true or false"},
      {"{" + llama + R"(, "mlp_bias": true})", "mlp_bias: true is not modelled"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string what = config_refusal(text);
    EXPECT_NE(what.find(expected), std::string::npos) << "got: '" << what << "', wanted: '" << expected << "'";
  }
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                            "max_position_embeddings"}) {
    json doc = json::parse("{" + llama + "}");
    doc.erase(field);
    EXPECT_EQ(config_refusal(doc.dump()), std::string("--hf-config c.json: ") + field + ": missing; expected a positive integer");
  }
  for (const char* field : {"n_layer", "n_embd", "n_head", "n_positions"}) {
    json doc = json::parse("{" + gpt2 + R"(, "vocab_size": 100})");
    doc.erase(field);
    EXPECT_EQ(config_refusal(doc.dump()), std::string("--hf-config c.json: ") + field + ": missing; expected a positive integer");
  }
}

// What each family's optional fields mean when present and when absent.
TEST(HfConfig, OptionalFieldsTakeTheirLibraryDefaults) {
  const std::string llama =
      R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "vocab_size": 100, "max_position_embeddings": 256)";
  HfModel m = parse_hf_config(R"({"model_type": "llama", )" + llama + "}", "c.json");
  EXPECT_EQ(m.shape.kv_heads, 4);  // absent: the heads
  EXPECT_FALSE(m.shape.tied_embeddings);
  EXPECT_FALSE(m.shape.qkv_bias);
  EXPECT_FALSE(m.head_dim_given);
  m = parse_hf_config(R"({"model_type": "mistral", "attention_bias": true, "head_dim": 32, "num_key_value_heads": 2, )" +
                          llama + "}",
                      "c.json");
  EXPECT_EQ(m.family, "llama");
  EXPECT_TRUE(m.shape.qkv_bias);
  EXPECT_TRUE(m.shape.out_bias);
  EXPECT_EQ(m.shape.head_dim, 32);
  EXPECT_TRUE(m.head_dim_given);
  EXPECT_EQ(m.shape.kv_heads, 2);
  m = parse_hf_config(R"({"model_type": "qwen2", "attention_bias": false, )" + llama + "}", "c.json");
  EXPECT_TRUE(m.shape.qkv_bias);  // qwen2's q, k, v always have a bias
  EXPECT_FALSE(m.shape.out_bias);
  m = parse_hf_config(
      R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "vocab_size": 100, "n_inner": null})",
      "c.json");
  EXPECT_EQ(m.shape.ffn, 256);  // null: 4 * n_embd
  EXPECT_TRUE(m.shape.tied_embeddings);
}

// A transformer's model record (family and shape) reads back as written; a bad shape
// field is refused by name; an MLP's record has neither field.
TEST(TransformerRecords, FamilyAndShapeReadBackAndAreCheckedByName) {
  const std::string reference = testing::env("SHARDSCOPE_REFERENCE_DIR");
  if (reference.empty()) GTEST_SKIP() << "run through ctest";
  std::ifstream in(reference + "/records/ddp-emulated.json");
  json doc = json::parse(in);
  EXPECT_FALSE(doc["runs"][0]["model"].contains("family"));
  EXPECT_FALSE(doc["runs"][0]["model"].contains("shape"));
  ModelConfig m;
  m.name = "llama";
  m.transformer = parse_run_args({"--model", "llama", "--layers", "2", "--hidden", "64", "--heads", "4",
                                  "--kv-heads", "2", "--ffn", "96", "--vocab", "100", "--seq", "16"})
                      .model.transformer;
  m.batch = 3;
  const json model = to_json(model_record(m));
  EXPECT_EQ(model["family"], "llama");
  EXPECT_EQ(model["shape"]["kv_heads"], 2);
  EXPECT_EQ(model["shape"]["head_dim"], 16);
  EXPECT_EQ(model["params"].get<std::int64_t>(), transformer_params(m.transformer));
  EXPECT_EQ(model["layers"], 2);
  EXPECT_EQ(model["width"], 64);
  doc["runs"][0]["model"] = model;
  EXPECT_EQ(to_json(read_result(doc, "t.json")), doc);
  doc["runs"][0]["model"]["shape"]["heads"] = "four";
  try {
    (void)read_result(doc, "t.json");
    FAIL() << "a string of heads was read";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("model.shape.heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardscope
