// Configurations shared by the single-process and the MPI pipeline tests.
#pragma once

#include <cstdint>
#include <string>

#include "shardscope/config.hpp"

namespace shardscope::testing {

inline ModelConfig model_of(int layers, int width, int batch, Activation act, Loss loss) {
  ModelConfig m;
  m.layers = layers;
  m.width = width;
  m.batch = batch;
  m.activation = act;
  m.loss = loss;
  return m;
}

inline RunConfig pipeline_config(const std::string& schedule, int microbatches, int chunks,
                                 const ModelConfig& model, int steps, std::uint64_t seed) {
  RunConfig cfg;
  cfg.model = model;
  cfg.schedule = parse_schedule(schedule);
  cfg.microbatches = microbatches;
  cfg.chunks = chunks;
  cfg.steps = steps;
  cfg.seed = seed;
  return cfg;
}

}  // namespace shardscope::testing
