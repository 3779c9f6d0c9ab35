#include <algorithm>
#include <array>
#include <string_view>

#include "harness/model/models.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

struct Entry {
  std::string_view name;  // what --model takes
  std::unique_ptr<Model> (*make)(const ModelConfig&);
};

// One line per model.
constexpr std::array<Entry, 3> kModels = {{
    {"mlp", [](const ModelConfig& c) { return make_mlp(c); }},
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
  if (tp.size > 1 && config.name != "mlp")
    throw UsageError("--mesh tp=" + std::to_string(tp.size) + " and --model " + config.name +
                     ": this build splits only the MLP across a tensor-parallel group; give tp=1");
  std::unique_ptr<Model> model = config.name == "mlp" ? make_mlp(config, tp) : find_model(config.name)->make(config);
  model->set_checkpoint(config.checkpoint);
  return model;
}

}  // namespace shardscope
