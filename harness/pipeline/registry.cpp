// The schedule registry: a new schedule is one generator file, one ScheduleKind and its
// name (shardscope/schedule_kind.hpp), and one line here.
#include <array>
#include <string>

#include "harness/pipeline/generators.hpp"
#include "shardscope/check.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {

namespace {

// How many chunks a schedule takes per stage.
enum class Chunks { one, two_or_more, exactly_two };

struct Entry {
  schedules::StageActions (*generate)(int stages, int microbatches, int chunks);
  bool split_backward;  // emits W actions
  Chunks chunks;        // two_or_more: interleaved, needs M % S == 0; exactly_two: zbv's V, needs M >= 2S-1
};

// One entry per schedule, in ScheduleKind's order.
constexpr std::array<Entry, kScheduleCount> kSchedules = {{
    {schedules::gpipe, false, Chunks::one},
    {schedules::one_f_one_b, false, Chunks::one},
    {schedules::interleaved_1f1b, false, Chunks::two_or_more},
    {schedules::zb_h1, true, Chunks::one},
    {schedules::zbv, true, Chunks::exactly_two},
}};

const Entry& checked_entry(ScheduleKind kind, int stages, int microbatches, int chunks) {
  const Entry& entry = kSchedules[static_cast<int>(kind)];
  const std::string name(schedule_name(kind));
  // S is the world size of a pipeline run (mpirun -np, or --worlds in a sweep).
  if (stages < 1)
    throw UsageError("--schedule " + name + " needs at least 1 stage (world size " +
                     std::to_string(stages) + ")");
  if (microbatches < 1)
    throw UsageError("--microbatches must be >= 1 (got " + std::to_string(microbatches) + ")");
  if (chunks < 1) throw UsageError("--chunks must be >= 1 (got " + std::to_string(chunks) + ")");
  if (entry.chunks == Chunks::one && chunks != 1)
    throw UsageError("--chunks " + std::to_string(chunks) + " is only valid with --schedule " +
                     std::string(schedule_name(ScheduleKind::interleaved_1f1b)) + " (and 2 with --schedule " +
                     std::string(schedule_name(ScheduleKind::zbv)) + ")");
  if (entry.chunks == Chunks::exactly_two) {
    if (chunks != 2)
      throw UsageError("--schedule " + name + " holds exactly 2 chunks per stage, in a V (got --chunks " +
                       std::to_string(chunks) + ")");
    // torch pads shorter lists with idle slots; the V unfilled is no schedule of its own.
    if (microbatches < 2 * stages - 1)
      throw UsageError("--schedule " + name + " needs --microbatches >= 2S-1 to fill its V (S=" +
                       std::to_string(stages) + ", M=" + std::to_string(microbatches) + "; give --microbatches " +
                       std::to_string(2 * stages - 1) + " or more)");
  }
  if (entry.chunks == Chunks::two_or_more) {
    // One chunk would be plain 1F1B with a longer warm-up: refuse rather than rename.
    if (chunks < 2)
      throw UsageError("--schedule " + name + " needs --chunks >= 2 (got " +
                       std::to_string(chunks) + "); with one chunk per stage use --schedule " +
                       std::string(schedule_name(ScheduleKind::one_f_one_b)));
    if (microbatches % stages != 0)
      throw UsageError("--schedule " + name +
                       " needs --microbatches to be a multiple of the stage count (S=" +
                       std::to_string(stages) + ", M=" + std::to_string(microbatches) + ")");
  }
  return entry;
}

}  // namespace

void check_schedule(ScheduleKind kind, int stages, int microbatches, int chunks) {
  (void)checked_entry(kind, stages, microbatches, chunks);
}

Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int chunks) {
  const Entry& entry = checked_entry(kind, stages, microbatches, chunks);
  Schedule s;
  s.kind = kind;
  s.stages = stages;
  s.microbatches = microbatches;
  s.chunks = chunks;
  s.split_backward = entry.split_backward;
  s.actions = entry.generate(stages, microbatches, chunks);
  return s;
}

const char* action_name(ActionKind kind) {
  static const char* const kNames[] = {"F", "B", "W"};  // indexed by ActionKind
  return kNames[static_cast<int>(kind)];
}

const char* payload_name(Payload payload) {
  return payload == Payload::activation ? "activation" : "gradient";
}

std::string to_string(const Action& a) {
  return std::string(action_name(a.kind)) + "(m=" + std::to_string(a.microbatch) + ", chunk " +
         std::to_string(a.chunk) + ")";
}

}  // namespace shardscope
