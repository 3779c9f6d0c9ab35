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

const Entry* find_model(const std::string& name) {
  for (const Entry& e : kModels)
    if (e.name == name) return &e;
  return nullptr;
}

}  // namespace

std::string model_names_text() {
  std::string text;
  for (const Entry& e : kModels) text += (text.empty() ? "" : ", ") + std::string(e.name);
  return text;
}

void check_model_name(const std::string& name) {
  if (!find_model(name)) throw UsageError("--model: unknown '" + name + "'; allowed: " + model_names_text());
}

std::unique_ptr<Model> make_model(const ModelConfig& config) {
  check_model_name(config.name);
  return find_model(config.name)->make(config);
}

}  // namespace shardscope
