// Reading why a sweep job did not finish, from its stderr (the job's own
// "shardscope: error: ..." line and mpirun's reports).
#pragma once

#include <string>

namespace shardscope {

// The text after "shardscope: error: " on the last such line of `stderr_text`; "" when none.
std::string shardscope_error_text(const std::string& stderr_text);

// The rank mpirun's report names: "process rank 1 with PID ...", "MPI_ABORT was invoked
// on rank 1", "Process name: [[29871,1],1]", or the job's own "shardscope: error: rank 1: ".
// -1 when none does.
int failed_rank(const std::string& stderr_text);

// The one-line error of a failed job, without the "shardscope: error: " prefix:
// "rank N: <what>" when a rank is known (`known_rank` >= 0, as for an emulated rank, or
// named in stderr), else "<label>: <what>". <what> is the job's own error text, else
// mpirun's account ("exited on signal 9 (Killed)", "exited with code 3", "called
// MPI_Abort"), else the last line of stderr, else `how` (how the process ended).
std::string failure_message(const std::string& stderr_text, const std::string& label, int known_rank,
                            const std::string& how);

// The one-line error of a job whose mpirun failed on its own, no rank reporting anything
// (too few slots, an option it does not know): "<label>: mpirun <how> (no rank reported
// an error): \"<mpirun's first line>\"".
std::string launcher_failure_message(const std::string& stderr_text, const std::string& label,
                                     const std::string& how);

}  // namespace shardscope
