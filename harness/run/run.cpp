#include "harness/run/run.hpp"

#include <chrono>
#include <optional>

#ifdef SHARDSCOPE_WITH_CUDA
#include "harness/backends/cuda_backend.hpp"
#endif
#ifdef SHARDSCOPE_WITH_NCCL
#include "harness/comm/nccl_comm.hpp"
#endif
#include "harness/common/json_text.hpp"
#include "harness/model/data.hpp"
#include "harness/model/model.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "harness/predict/workspace_forms.hpp"
#include "harness/records/json_read.hpp"
#include "harness/records/json_write.hpp"
#include "harness/run/memory_check.hpp"
#include "harness/run/provenance.hpp"
#include "harness/run/records.hpp"
#include "harness/strategies/partition.hpp"
#include "shardscope/check.hpp"
#include "shardscope/predict.hpp"
#include "shardscope/strategy.hpp"

namespace shardscope {
namespace {

std::string choose_backend(const RunConfig& cfg) {
  if (!cfg.backend.empty()) return cfg.backend;
  return cuda_device_count() > 0 ? "cuda" : "cpu";
}

CommOptions choose_comm(const RunConfig& cfg, const std::string& backend, const MpiSession& mpi) {
  CommOptions o;
  o.timeout_s = cfg.comm_timeout_s;
  if (cfg.emulate_world > 0) {
    if (mpi.world() > 1)
      throw UsageError("--emulate runs one process that plays one rank; do not start it under mpirun (" +
                       std::to_string(mpi.world()) + " ranks)");
    if (!cfg.comm.empty() && cfg.comm != "fake")
      throw UsageError("--comm " + cfg.comm + ": --emulate always uses the fake communicator");
    o.kind = "fake";
    o.emulate_world = cfg.emulate_world;
    o.emulate_rank = cfg.emulate_rank;
    return o;
  }
  if (cfg.comm == "fake") throw UsageError("--comm fake needs --emulate W:r");
  if (!cfg.comm.empty()) {
    if (cfg.comm == "self" && mpi.world() > 1)
      throw UsageError("--comm self: only for one rank; this job has " + std::to_string(mpi.world()));
    // NCCL at one rank needs no bootstrap (the GPU check runs it on a machine without MPI).
    if (cfg.comm == "mpi" && !mpi.active())
      throw UsageError("--comm mpi: this build has no MPI; allowed: self, nccl (one rank, cuda), fake (with --emulate)");
    o.kind = cfg.comm;
    return o;
  }
  if (mpi.world() == 1) {
    o.kind = "self";
  } else {
#ifdef SHARDSCOPE_WITH_NCCL
    o.kind = backend == "cuda" ? "nccl" : "mpi";
#else
    o.kind = "mpi";
#endif
  }
  return o;
}

}  // namespace

void validate_data_parallel(const RunConfig& cfg) {
  refuse_unbuilt_autocast(cfg);
  // --units shapes zero2 and zero3 only (docs/design.md §3: accepted, no effect, elsewhere).
  if (shards_by_unit(cfg.strategy) && cfg.layers_per_unit > cfg.model.layers)
    throw UsageError("--units " + std::to_string(cfg.layers_per_unit) + ": more layers per unit than --layers " +
                     std::to_string(cfg.model.layers) + "; use --units all for one root unit");
}

void refuse_unbuilt_autocast(const RunConfig& cfg) {
  if (cfg.precision != PrecisionKind::bf16 || effective_engine(cfg.engine, cfg.strategy, cfg.precision) ==
                                                  EngineKind::deepspeed)
    return;
  if (cfg.pipeline()) return;  // a pipeline's stages: pipeline_shape says what is built
  if (!shards_by_unit(cfg.strategy)) return;
  // FSDP1's MixedPrecision and fully_shard's MixedPrecisionPolicy (param_dtype=bf16,
  // reduce_dtype=fp32): the MLP's zero2/zero3.
  const std::string which = "--precision bf16 and --strategy " +
                            std::string(cfg.hybrid() ? "hsdp" : strategy_name(cfg.strategy));
  // A transformer's mesh under bf16 runs autocast's ddp and zero1 along dp (tensor_parallel_forms);
  // FSDP's mixed precision on a mesh is not built yet.
  if (cfg.mesh.given && !cfg.hybrid())
    throw UsageError("--mesh and " + which + ": FSDP's mixed precision on a mesh is not built yet; allowed: "
                     "--strategy ddp|zero1 (autocast), or no --mesh");
  // GPT-2's and Llama's bf16 modules (harness/model/gpt2_param_bf16.cpp, llama_param_bf16.cpp) and
  // the MLP's layers re-run a wrapped block as the fp32 ones do, and the transformers' recompute
  // their attention core (--checkpoint attention): every checkpoint policy is built.
}

void refuse_checkpointed_pipeline(const RunConfig& cfg) {
  // A pipeline's stages checkpoint their blocks (full, every:K) or their attention cores
  // (attention) as a data-parallel run does (fp32, gpipe, 1f1b and interleaved-1f1b, along dp
  // of a mesh); what is not built is refused by name.
  if (!cfg.pipeline() || !cfg.model.checkpoint.any()) return;
  const std::string both = "--checkpoint " + cfg.model.checkpoint.text() + " and --schedule " +
                           std::string(schedule_name(*cfg.schedule));
  if (*cfg.schedule == ScheduleKind::zb_h1 || *cfg.schedule == ScheduleKind::zbv)
    throw UsageError(both + ": the zero-bubble split (B and W apart) of a checkpointed stage is not built yet; "
                     "allowed: gpipe, 1f1b, interleaved-1f1b, or --checkpoint none");
  if (cfg.mesh.tp > 1)
    throw UsageError(both + " and --mesh tp=" + std::to_string(cfg.mesh.tp) +
                     ": checkpointed tensor-parallel stages are not built yet; allowed: --mesh dp=D,pp=S, or "
                     "--checkpoint none");
  // Under bf16 (autocast, a region per micro-batch): GPT-2's and Llama's blocks wrapped.
  if (cfg.precision == PrecisionKind::bf16 && !cfg.model.is_transformer())
    throw UsageError(both + " and --precision bf16 and --model mlp: the MLP's checkpointed stages under autocast "
                     "are not built yet; give --precision fp32, --model gpt2|llama or --checkpoint none");
  if (cfg.precision == PrecisionKind::bf16 && cfg.model.checkpoint.attention())
    throw UsageError(both + " and --precision bf16: selective recompute in a bf16 pipeline's stages is not built "
                     "yet; give --checkpoint full or every:K, or --precision fp32");
}

namespace {

// A rank's group under --mesh (one per axis) or HSDP (shard, replicate): its name, its
// communicator, its members (world ranks, in its order) and the bytes its forms give.
struct RankGroup {
  std::string name;
  Communicator* comm = nullptr;
  std::vector<int> members;
  std::int64_t predicted = 0;
};

// The groups' communicators, for their summed ledger.
std::vector<Communicator*> group_comms(const std::vector<RankGroup>& groups) {
  std::vector<Communicator*> comms;
  for (const RankGroup& g : groups) comms.push_back(g.comm);
  return comms;
}

RankRecord run_data_parallel(const RunConfig& cfg, Backend& backend, Communicator& world_comm) {
  const int world = world_comm.world();
  const int rank = world_comm.rank();
  Prediction pred = predict_data_parallel(cfg, world, rank);
  add_backend_workspace(pred, backend.name());
  check_memory(pred.peak_total, backend, rank);

  // Under --mesh the strategy reduces over the rank's data-parallel group and the model
  // splits over its tensor-parallel group; under HSDP it shards over the shard group and
  // all-reduces over the replicate group. Each group keeps its own ledger.
  std::optional<MeshComms> mesh;
  std::unique_ptr<Communicator> shard, replicate;
  std::vector<RankGroup> groups;
  if (cfg.mesh.given) {
    mesh = make_mesh_comms(world_comm, cfg.mesh);
    for (int a = 0; a < kMeshAxes; ++a)
      groups.push_back({std::string(kMeshAxisNames[a]), mesh->groups[a].get(),
                        cfg.mesh.group(rank, static_cast<MeshAxis>(a)), pred.axis_comm_bytes[static_cast<std::size_t>(a)]});
  } else if (cfg.hybrid()) {
    const std::vector<int> in_shard = hsdp_group(rank, world, cfg.shard_group, true);
    const std::vector<int> in_replicate = hsdp_group(rank, world, cfg.shard_group, false);
    shard = world_comm.split(in_shard);
    replicate = world_comm.split(in_replicate);
    groups.push_back({"shard", shard.get(), in_shard, pred.comm_total() - pred.replicate_comm_bytes});
    groups.push_back({"replicate", replicate.get(), in_replicate, pred.replicate_comm_bytes});
  }
  Communicator& comm = mesh ? mesh->group(MeshAxis::dp) : shard ? *shard : world_comm;
  Communicator* tp = mesh ? &mesh->group(MeshAxis::tp) : nullptr;
  // The ledger the rank's "comm" reports: its one communicator's, or its groups' summed.
  auto rank_ledger = [&] { return groups.empty() ? comm.ledger() : summed_ledger(group_comms(groups)); };

  StrategyContext ctx{cfg, backend, comm, tp, replicate.get(), cfg.hybrid() ? rank : -1};
  std::unique_ptr<Strategy> strategy = make_strategy(ctx);
  {
    ScopedRange range(backend, "setup");
    strategy->setup();
  }
  std::vector<double> step_ms, comm_ms;  // comm_ms: the step's time inside collectives
  std::vector<double> exposed_ms;        // the part of it the step waited for
  std::vector<double> losses;
  for (int s = 0; s < cfg.steps; ++s) {
    strategy->prepare_batch(s);
    backend.synchronize();
    world_comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const float loss = strategy->step();
    backend.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    const CommLedger step_ledger = rank_ledger();  // the ledgers hold this step's calls
    comm_ms.push_back(step_ledger.total_ms());
    exposed_ms.push_back(step_ledger.total_exposed_ms());
    losses.push_back(loss);
  }
  const Tracker& tr = backend.tracker();
  RankRecord r;
  r.rank = rank;
  r.resting = category_figures(tr.current());
  r.peak = peak_figures(tr.peak(), describe_place(tr.peak().place));
  r.predicted = rank_predicted(pred);
  r.allocator = allocator_figures(backend);
  if (!groups.empty()) {
    const CommLedger sum = summed_ledger(group_comms(groups));
    r.comm = comm_figures(sum, world, true);  // busbw per group only
    r.comm_bytes = sum.total_bytes();
    r.comm_groups.emplace();
    for (const RankGroup& g : groups) r.comm_groups->push_back(group_record(g.name, *g.comm, g.members, g.predicted));
  } else {
    r.comm = comm_figures(comm.ledger(), world, comm.emulated());
    r.comm_bytes = comm.ledger().total_bytes();
  }
  r.step_ms = time_summary(step_ms);
  r.step_ms_all = step_ms;
  r.comm_ms = time_summary(comm_ms);
  r.comm_ms_all = comm_ms;
  r.comm_exposed_ms = time_summary(exposed_ms);
  r.comm_exposed_ms_all = exposed_ms;
  r.loss = losses;
  const SavedAfterForward saved = strategy->saved_after_forward();
  r.saved = RankSaved{saved.bytes, saved.tensors};
  if (tr.recording()) r.timeline = timeline_record(tr.timeline());
  return r;
}

}  // namespace

DataParallelRun data_parallel_run(const RunConfig& cfg, int world) {
  const bool fsdp = shards_by_unit(cfg.strategy);
  DataParallelRun run;
  run.strategy = std::string(strategy_name(cfg.strategy));
  run.engine = std::string(engine_name(effective_engine(cfg.engine, cfg.strategy, cfg.precision)));
  run.precision = std::string(precision_name(cfg.precision));
  run.accumulate = cfg.accumulate;
  run.no_sync = cfg.no_sync;
  run.overlap = cfg.overlap;
  run.world = world;
  run.units = fsdp ? static_cast<int>(fsdp_units(cfg.model, cfg.layers_per_unit, world).size()) : 1;
  // --units has no effect on ddp and zero1 (docs/design.md §3): their one unit is the model.
  if (cfg.layers_per_unit != 0 && fsdp) run.layers_per_unit = cfg.layers_per_unit;
  run.prefetch = cfg.prefetch;
  run.ddp_bucket = cfg.ddp_bucket;
  run.bucket_mb = cfg.bucket_mb;
  run.steps = cfg.steps;
  run.timed_steps = timed_steps(cfg.steps);
  run.seed = cfg.seed;
  if (cfg.mesh.given) run.mesh = MeshRecord{cfg.mesh.dp, cfg.mesh.tp, cfg.mesh.pp, cfg.model.sequence_parallel};
  if (cfg.hybrid()) {
    run.strategy = "hsdp";
    run.shard_group = cfg.shard_group;
  }
  run.model = model_record(cfg.model);
  return run;
}

nlohmann::json data_parallel_header(const RunConfig& cfg, int world) {
  nlohmann::json run = to_json(RunRecord(data_parallel_run(cfg, world)));
  for (const char* key : {"ranks", "backend", "comm", "emulated"}) run.erase(key);
  return run;
}

namespace {

// A refusal that only some ranks meet (what a rank sees of its machine) must end every
// rank, or the others would wait forever in the next collective: the lowest refusing
// rank's reason goes to all, and every rank throws it.
void agree_on_refusal(const std::string& refusal, const MpiSession& mpi) {
  const int first = -all_reduce_max(refusal.empty() ? -mpi.world() : -mpi.rank());
  if (first >= mpi.world()) return;
  std::string text = refusal;
  broadcast_string(text, first);
  throw UsageError(mpi.world() > 1 ? "rank " + std::to_string(first) + ": " + text : text);
}

}  // namespace

// The flags are the same on every rank (run_command made sure before calling), so every
// refusal that follows from them alone comes on every rank at once; what depends on a
// rank's machine is agreed explicitly.
JobSetup prepare_job(const RunConfig& cfg, const MpiSession& mpi) {
  check_model_runnable(cfg.model.name);
  JobSetup setup;
  setup.backend = choose_backend(cfg);
  if (!all_ranks_equal(setup.backend))
    throw UsageError("the ranks of this job do not all see a GPU: pass --backend cpu or --backend cuda");
  setup.comm = choose_comm(cfg, setup.backend, mpi);
  setup.world = setup.comm.kind == "fake" ? setup.comm.emulate_world : mpi.world();
  if (cfg.hybrid() && setup.world % cfg.shard_group != 0)
    throw UsageError("--shard-group " + std::to_string(cfg.shard_group) + ": it must divide the world, " +
                     (setup.world == 1 ? std::string("1 rank (one process without mpirun)")
                                       : std::to_string(setup.world) + " ranks (mpirun's)"));
  if (cfg.mesh.given && setup.comm.kind != "fake")
    check_mesh_world(cfg.mesh, setup.world, setup.world == 1 ? "one process without mpirun" :
                                            "mpirun's " + std::to_string(setup.world) + " ranks");
  refuse_checkpointed_pipeline(cfg);
  refuse_unbuilt_autocast(cfg);
  // The autocast models keep bf16 tensors as host bits (harness/model/autocast_parts.hpp).
  if ((cfg.model.autocast || cfg.model.param_bf16) && setup.backend == "cuda")
    throw UsageError("--precision bf16 and --backend cuda: the autocast step runs on the cpu backend only; pass "
                     "--backend cpu");
  if (cfg.pipeline())
    validate_pipeline(cfg, cfg.mesh.given ? cfg.mesh.pp : setup.world);
  else
    validate_data_parallel(cfg);
  return setup;
}

std::optional<ResultDocument> run_job(const RunConfig& cfg, const JobSetup& setup, MpiSession& mpi) {
  const std::string& backend_name = setup.backend;
  const int world = setup.world;
  std::unique_ptr<Backend> backend;
  std::string refusal;
  try {
    backend = make_backend(backend_name, mpi.local_rank());
  } catch (const UsageError& e) {
    refusal = e.what();
  }
  agree_on_refusal(refusal, mpi);
  if (backend_name == "cuda" && cfg.allow_tf32) backend->set_allow_tf32(true);
  std::unique_ptr<Communicator> comm = make_communicator(setup.comm, backend.get());
  // The run's start, the origin of every timeline: right after a barrier, so the ranks
  // of one job share it (to the barrier's skew).
  comm->barrier();
  backend->tracker().set_recording(cfg.timeline);

  // Where the rank ran: its rank on the node, which picks its GPU, and that GPU's index
  // (none on cpu).
  Placement placement{mpi.local_rank(), std::nullopt};
  if (backend->device() >= 0) placement.device = backend->device();
  // Each rank's record travels to rank 0 as JSON, where it is read back as any file is.
  nlohmann::json rank_record;
  if (cfg.pipeline()) {
    StageRecord record = run_pipeline(cfg, *backend, *comm);
    record.placement = placement;
    rank_record = to_json(record);
  } else {
    RankRecord record = run_data_parallel(cfg, *backend, *comm);
    record.placement = placement;
    rank_record = to_json(record);
  }
  const std::string device = backend->device_description();
  std::string cuda_text, nccl_text;  // library versions, for provenance (cuda runs only)
#ifdef SHARDSCOPE_WITH_CUDA
  if (backend_name == "cuda") cuda_text = cuda_versions_text();
#endif
#ifdef SHARDSCOPE_WITH_NCCL
  if (backend_name == "cuda") nccl_text = nccl_version_text();
#endif
  std::vector<std::string> all = gather_strings_to_root(json_text(rank_record));
  if (mpi.rank() != 0) return std::nullopt;
  if (all.empty()) all.push_back(json_text(rank_record));

  const RunPlace place{backend_name, comm->name(), comm->emulated(),
                       comm->emulated() ? std::optional<int>(cfg.emulate_rank) : std::nullopt};
  ResultDocument doc;
  doc.version = SHARDSCOPE_VERSION;
  doc.backend = backend_name;
  doc.comm = comm->name();
  doc.emulated = comm->emulated();
  doc.provenance = provenance(cfg.command_line, device, cuda_text, nccl_text);
  if (cfg.pipeline()) {
    PipelineRun run = pipeline_run(cfg, cfg.mesh.given ? cfg.mesh.pp : world);
    for (std::size_t r = 0; r < all.size(); ++r)
      run.stages.push_back(read_stage_record(nlohmann::json::parse(all[r]), "rank " + std::to_string(r) + "'s record"));
    fill_bubbles(cfg, !comm->emulated(), run);
    run.place = place;
    doc.runs.push_back(std::move(run));
  } else {
    DataParallelRun run = data_parallel_run(cfg, world);
    // The MLP's bf16 Linears run the backend's gemm_bf16 (the transformers' autocast parts their own).
    if ((cfg.model.autocast || cfg.model.param_bf16) && !cfg.model.is_transformer()) run.bf16_gemm = backend->bf16_gemm();
    for (std::size_t r = 0; r < all.size(); ++r)
      run.ranks.push_back(read_rank_record(nlohmann::json::parse(all[r]), "rank " + std::to_string(r) + "'s record"));
    run.place = place;
    doc.runs.push_back(std::move(run));
  }
  return doc;
}

}  // namespace shardscope
