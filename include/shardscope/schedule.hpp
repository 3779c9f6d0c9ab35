// Pipeline schedules as data (docs/design.md §4): for each stage, the ordered list of actions
// it runs. No communication and no math here: lower() turns the lists into per-stage
// programs with explicit p2p groups, validate() proves them, replay() times them.
//
// Vocabulary. S stages, M micro-batches, v chunks per stage. The model's layers are cut
// into V = S*v contiguous pieces ("virtual stages", Megatron's interleaving); piece k
// lives on stage k % S as its chunk k / S. Without interleaving v = 1 and k = stage.
// zbv places its two chunks in a V instead: stage s holds pieces s and 2S-1-s
// (placed_vstage in schedule_kind.hpp).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardscope/schedule_kind.hpp"

namespace shardscope {

// F: forward of one (micro-batch, chunk). B: its backward; with split_backward it is only
// the input-gradient half (what the previous stage waits for) and W, run later, is the
// weight-gradient half (zero-bubble schedules). Without split_backward, B does both.
enum class ActionKind { F, B, W };

// The one spelling of each kind ("F", "B", "W"): lists, records, errors and the
// replayed bubble's parser all use it.
const char* action_name(ActionKind kind);

struct Action {
  ActionKind kind;
  int microbatch;  // 0..M-1
  int chunk;       // 0..v-1; virtual stage = chunk * S + stage (zbv: stage, 2S-1-stage)
};

inline bool operator==(const Action& a, const Action& b) {
  return a.kind == b.kind && a.microbatch == b.microbatch && a.chunk == b.chunk;
}
inline bool operator!=(const Action& a, const Action& b) { return !(a == b); }

struct Schedule {
  ScheduleKind kind = ScheduleKind::gpipe;
  int stages = 0;       // S
  int microbatches = 0; // M
  int chunks = 1;       // v
  bool split_backward = false;  // true: every (m, chunk) also has a W action
  std::vector<std::vector<Action>> actions;  // [stage] -> ordered actions
};

inline int virtual_stages(const Schedule& s) { return s.stages * s.chunks; }
inline int vstage_of(const Schedule& s, int stage, int chunk) { return placed_vstage(s.kind, s.stages, stage, chunk); }
inline int stage_of_vstage(const Schedule& s, int vstage) { return placed_stage(s.kind, s.stages, vstage); }
inline int chunk_of_vstage(const Schedule& s, int vstage) { return placed_chunk(s.kind, s.stages, vstage); }

// Builds the schedule. Throws UsageError naming the flag and the constraint:
// S, M, chunks >= 1; --chunks other than 1 only with interleaved-1f1b, which needs
// --chunks >= 2 (one chunk is 1f1b: use that name; nothing is quietly downgraded) and
// M a multiple of S, and zbv, which holds exactly 2 and needs M >= 2S-1 (its V filled).
Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int chunks);
// The same checks, without building the lists.
void check_schedule(ScheduleKind kind, int stages, int microbatches, int chunks);

// "F(m=3, chunk 1)"
std::string to_string(const Action& a);

// ---- lowering: per-stage programs with explicit point-to-point groups ----------------

enum class Payload { activation, gradient };

// "activation", "gradient"
const char* payload_name(Payload payload);

// One op of a p2p group. `vstage` is the virtual stage that PRODUCED the payload: the
// activation of F(m, k) is labelled k (its consumer runs F(m, k+1)); the input gradient
// of B(m, k) is labelled k (its consumer runs B(m, k-1)). Both ends carry the same
// label, so a send and its receive compare equal field by field (except is_send/peer).
struct P2p {
  bool is_send;
  int peer;  // stage on the other end
  Payload payload;
  int microbatch;
  int vstage;
};

// One communicator call (Communicator::p2p: every op posted together, returns when all
// completed; may be empty) followed by at most one action.
struct ProgramStep {
  std::vector<P2p> comm;  // sends first, then the receive this step's action needs
  std::optional<Action> action;
};
using StageProgram = std::vector<ProgramStep>;

// Program of stage s: actions[s].size() + 1 steps; step i runs the group, then
// actions[s][i]; the last step has no action, only sends still owed (often empty).
// An action's cross-stage input is received in its own step's group. A send is held
// until the receiver asks for it: it rides in the sender's group of the step in which
// the receiver runs the consuming action (unit-time rounds, see lower.cpp), so an
// output buffer lives from its action until the step whose group sends it. For 1F1B
// and GPipe that is the next step (Megatron's send_forward_recv_backward pairs); for
// zb-h1 and interleaved 1F1B it can be later. No p2p between pieces on the same stage (S == 1).
// Throws RunError when the lists cannot run at all (validate() explains why).
std::vector<StageProgram> lower(const Schedule& schedule);

// ---- validation -----------------------------------------------------------------------

struct ValidationResult {
  bool ok = false;
  std::string message;  // empty when ok; otherwise what is wrong and where
};

// Checks: each stage runs F and B (and W when split) exactly once per (micro-batch, chunk)
// it holds; B after F and W after B on the stage; same-stage data dependencies (S == 1)
// in order; the lists can run at all (no circular wait); then lowers them and checks the
// programs with validate_programs.
ValidationResult validate(const Schedule& schedule);

// Checks programs (lower()'s, or hand-made) against the schedule's lists: each program
// runs its stage's list in order; every send carries an output its stage already
// produced, to the consumer's stage; every action receives its cross-stage input in or
// before its step; ops between one (sender, receiver) pair match in FIFO order and carry
// the same (payload, microbatch, vstage); and a replay of the groups with NCCL group
// semantics (a group completes when each op's partner is posted, i.e. the partner stage
// is at or past the partner's step) ends with every stage finished, else "p2p deadlock"
// naming each stage's blocked group.
ValidationResult validate_programs(const Schedule& schedule, const std::vector<StageProgram>& programs);

// ---- replay: bubbles and time ---------------------------------------------------------

struct ReplayResult {
  double makespan = 0.0;               // end of the last action, all stages
  std::vector<double> busy;            // [stage] sum of its action durations
  std::vector<double> bubble_fraction; // [stage] 1 - busy / makespan
  // [stage][i] (start, end) of actions[stage][i]
  std::vector<std::vector<std::pair<double, double>>> action_spans;
};

// Each action starts when its stage is free and its inputs are done (F(m,k) needs
// F(m,k-1); B(m,k) needs F(m,k) and B(m,k+1); W(m,k) needs B(m,k)); communication takes
// no time. Throws RunError when the lists cannot run (call validate() first).
ReplayResult replay(const Schedule& schedule,
                    const std::function<double(int stage, const Action&)>& duration);

// ---- theory (docs/design.md §4) and measured counts -------------------------------------------

// Bubble fraction: gpipe, 1f1b (S-1)/(M+S-1); interleaved (S-1)/(vM+S-1);
// zb-h1 (S-1)/(3M+S-1) (F, B and W taking equal time); zbv (S-1)/(6M+S-1). With uniform action times the
// replay gives these exactly, except zb-h1 with M < S: (2S-1-M)/(2M+2S-1), as the
// pipeline never fills.
double bubble_theory(const Schedule& schedule);

// docs/design.md §4's figure: peak (micro-batch, chunk) pairs on `stage` counted from F to B:
// gpipe M; 1f1b min(S-s, M); interleaved min(2(S-s-1)+(v-1)S+1, vM); zb-h1 what 1f1b
// holds, min(S-s, M); zbv 2S on every stage (each pair a chunk of half a stage's layers).
int peak_live_microbatches_theory(const Schedule& schedule, int stage);

// Counted until each pair's last backward action (W when the backward is split), which
// is how long its saved tensors stay: the figure above for every schedule but zb-h1,
// whose W's are delayed by s on stage s, so that every stage peaks at min(S, M), 1F1B's
// maximum over stages (stage 0) and the paper's claim (see zb_h1.cpp for why per-stage
// 1F1B memory and its bubble cannot both hold from F to W).
int peak_held_microbatches_theory(const Schedule& schedule, int stage);

// The two, measured by walking the stage's action list: live from F until B, and held
// from F until the last backward action.
int peak_live_microbatches(const Schedule& schedule, int stage);
int peak_held_microbatches(const Schedule& schedule, int stage);

}  // namespace shardscope
