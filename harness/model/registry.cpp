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
constexpr std::array<Entry, 1> kModels = {{
    {"mlp", make_mlp},
}};

}  // namespace

std::string model_names_text() {
  std::string text;
  for (const Entry& e : kModels) text += (text.empty() ? "" : ", ") + std::string(e.name);
  return text;
}

std::unique_ptr<Model> make_model(const ModelConfig& config) {
  for (const Entry& e : kModels)
    if (e.name == config.name) return e.make(config);
  throw UsageError("--model: unknown '" + config.name + "'; allowed: " + model_names_text());
}

}  // namespace shardscope
