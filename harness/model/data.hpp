// Deterministic data and initial parameters from counter-based hashing, so any rank
// (and any test) can regenerate any other rank's batch or any slice of any tensor
// without holding the whole model.
#pragma once

#include <cstdint>
#include <vector>

#include "shardscope/config.hpp"

namespace shardscope {

// Uniform in [-1, 1) from (seed, stream, index).
float hashed_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

// 64 random bits from (seed, stream, index): token ids are these modulo the vocabulary.
std::uint64_t hashed_bits(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

// The stream of the batch that `rank` draws at `step` (its inputs; a token model's
// targets lie past them in the same stream).
std::uint64_t batch_stream(int step, int rank);

// Rows [row_begin, row_begin + rows) of the batch that `rank` draws at `step`, each of
// `row_elems` values in [-1, 1): (rows, row_elems), row r's values at indices
// (row_begin + r) * row_elems + c of the stream, so any slice of rows is the same values.
std::vector<float> hashed_rows(std::uint64_t seed, int step, int rank, int row_begin, int rows, int row_elems);

// The MLP's batch: hashed_rows with cfg.model.width values a row.
std::vector<float> batch_rows(const RunConfig& cfg, int step, int rank, int row_begin, int rows);

// Elements [begin, begin + count) of parameter tensor `tensor` (its index in the
// model's torch order), uniform in [-bound, bound).
void init_uniform_slice(std::uint64_t seed, int tensor, float bound, std::int64_t begin, std::int64_t count,
                        float* out);

// Elements [begin, begin + count) of the model's flat parameter vector (tensors
// concatenated in torch order); positions past the end (FSDP padding) are zero. The
// model cfg.model names initialises them (Model::init_flat_slice).
std::vector<float> init_flat_slice(const RunConfig& cfg, std::int64_t begin, std::int64_t count);

// Offset of tensor `t` in the flat parameter vector.
std::int64_t tensor_offset(const ModelConfig& m, int t);

}  // namespace shardscope
