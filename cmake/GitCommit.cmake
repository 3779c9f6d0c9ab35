# Run at every build (cmake -P): writes OUT with the source tree's commit, followed by
# "-dirty" when tracked files differ from it, so that a result's provenance names the
# code that really ran. OUT is rewritten only when that changes, so nothing rebuilds
# needlessly. Without git (or outside a checkout) the commit is "unknown".
# Only SRC's own checkout counts: a copy inside another repository is not that
# repository's commit. --no-optional-locks: a build must not take git's index lock.
set(commit "unknown")
execute_process(COMMAND git --no-optional-locks rev-parse --show-toplevel WORKING_DIRECTORY "${SRC}"
                OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(rc EQUAL 0 AND top)
  file(REAL_PATH "${top}" top)
  file(REAL_PATH "${SRC}" src)
  if(top STREQUAL src)
    execute_process(COMMAND git --no-optional-locks rev-parse --short=12 HEAD WORKING_DIRECTORY "${SRC}"
                    OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND head)
      set(commit "${head}")
    endif()
  endif()
endif()
if(NOT commit STREQUAL "unknown")
  execute_process(COMMAND git --no-optional-locks status --porcelain --untracked-files=no
                  WORKING_DIRECTORY "${SRC}" OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    string(APPEND commit "-dirty")
  endif()
endif()
set(text "// Generated at build time by cmake/GitCommit.cmake.\n#define SHARDSCOPE_GIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
