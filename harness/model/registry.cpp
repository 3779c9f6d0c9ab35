#include <algorithm>
#include <array>
#include <string>
#include <string_view>

#include "harness/model/models.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

struct Entry {
  std::string_view name;  // what --model takes
  std::unique_ptr<Model> (*make)(const ModelConfig&, const TensorParallel&);
};

// One line per model.
constexpr std::array<Entry, 3> kModels = {{
    {"mlp", make_mlp},
    {"gpt2", make_gpt2},
    {"llama", make_llama},
}};

// What --model accepts: the families a plan predicts. A family without an entry above
// is planned, and refused by a run (make_model) until its model is registered.
constexpr std::array<std::string_view, 3> kFamilies = {"mlp", "gpt2", "llama"};

const Entry* find_model(const std::string& name) {
  for (const Entry& e : kModels)
    if (e.name == name) return &e;
  return nullptr;
}

}  // namespace

std::string model_names_text() {
  std::string text;
  for (std::string_view name : kFamilies) text += (text.empty() ? "" : ", ") + std::string(name);
  return text;
}

void check_model_name(const std::string& name) {
  if (std::find(kFamilies.begin(), kFamilies.end(), name) == kFamilies.end())
    throw UsageError("--model: unknown '" + name + "'; allowed: " + model_names_text());
}

void check_model_runnable(const std::string& name) {
  check_model_name(name);
  if (!find_model(name))
    throw UsageError("--model " + name + ": this build cannot run a " + name +
                     " yet (its model is not registered); `shardscope plan` predicts its model states");
}

std::unique_ptr<Model> make_model(const ModelConfig& config, const TensorParallel& tp) {
  check_model_runnable(config.name);
  check_tensor_parallel(config, tp.size);
  std::unique_ptr<Model> model = find_model(config.name)->make(config, tp);
  model->set_checkpoint(config.checkpoint);
  if (config.autocast && config.autocast_step) model->use_step_casts();
  return model;
}

void check_tensor_parallel(const ModelConfig& m, int tp) {
  if (tp == 1) return;
  if (!m.is_transformer()) return check_mlp_tensor_parallel(m, tp);
  const std::string mesh = "--mesh tp=" + std::to_string(tp);
  const TransformerShape& s = m.transformer;
  auto need = [&](int value, const char* what, const char* why) {
    if (value % tp != 0)
      throw UsageError(mesh + ": the " + what + " (" + std::to_string(value) + ") must divide by tp (" + why + ")");
  };
  need(s.heads, "heads", "each rank holds heads/tp of the attention");
  need(s.ffn, "ffn", "each rank holds ffn/tp of the MLP's inner features");
  need(s.vocab, "vocabulary", "each rank holds vocab/tp rows of the embedding and the head; Megatron pads it");
  // Fewer kv heads than tp are replicated: each rank holds the one its query heads read,
  // the copies' gradients summed over the group (docs/design.md, "Tensor parallelism of
  // the transformers"). A count that neither divides nor is divided by tp has no such split.
  if (s.kv_heads % tp != 0 && tp % s.kv_heads != 0)
    throw UsageError(mesh + ": the kv heads (" + std::to_string(s.kv_heads) + ") must divide by tp (each rank holds "
                     "kv_heads/tp of them) or divide tp (each kv head replicated on tp/kv_heads ranks)");
}

}  // namespace shardscope
