# The layers (the folder says the layer): the engine below never includes the printers
# or the command line above it, and the kernels know nothing of a backend.
#   - nothing in kernels/, include/ or the engine's folders of harness/ includes
#     harness/report/ or harness/cli/;
#   - include/ (the public headers) includes nothing from harness/;
#   - kernels/ and include/shardscope/config.hpp do not include shardscope/backend.hpp
#     (they take the kernels' arguments from shardscope/kernel_args.hpp);
#   - the predictions (harness/predict/) read no executor code: nothing from
#     harness/pipeline/, and no call that builds a schedule's lists, lowers them or walks
#     a program (make_schedule, lower, walk_peak), so measured == predicted is a check.
# Run by ctest as: cmake -DROOT=<source folder> -P tests/check_layers.cmake
if(NOT ROOT)
  message(FATAL_ERROR "check_layers: pass -DROOT=<source folder>")
endif()

set(lower kernels include harness/backends harness/comm harness/common harness/memory harness/model
          harness/pipeline harness/predict harness/records harness/run harness/schedules harness/strategies)
set(problems "")
set(files "")
foreach(folder IN LISTS lower)
  if(EXISTS ${ROOT}/${folder})
    file(GLOB_RECURSE found ${ROOT}/${folder}/*.hpp ${ROOT}/${folder}/*.cpp ${ROOT}/${folder}/*.cu
         ${ROOT}/${folder}/*.cuh ${ROOT}/${folder}/*.h)
    list(APPEND files ${found})
  endif()
endforeach()
if(NOT files)
  message(FATAL_ERROR "check_layers: no source under ${ROOT}: the check would pass on nothing")
endif()

function(refuse file regex why)
  file(STRINGS ${file} hits REGEX "${regex}")
  foreach(hit IN LISTS hits)
    file(RELATIVE_PATH rel ${ROOT} ${file})
    string(STRIP "${hit}" hit)
    set(problems "${problems}\n  ${rel}: ${hit}  (${why})" PARENT_SCOPE)
  endforeach()
endfunction()

foreach(f IN LISTS files)
  file(RELATIVE_PATH rel ${ROOT} ${f})
  refuse(${f} "^[ \t]*#[ \t]*include[ \t]*[\"<]harness/(report|cli)/" "a layer below report/ and cli/")
  if(rel MATCHES "^include/")
    refuse(${f} "^[ \t]*#[ \t]*include[ \t]*[\"<]harness/" "a public header")
  endif()
  if(rel MATCHES "^harness/predict/")
    refuse(${f} "^[ \t]*#[ \t]*include[ \t]*[\"<]harness/pipeline/" "the forms read no executor code")
    refuse(${f} "(^|[^A-Za-z_])(make_schedule|lower|walk_peak)[ \t]*\\(" "the forms build no lists or programs")
  endif()
  if(rel MATCHES "^kernels/" OR rel STREQUAL "include/shardscope/config.hpp")
    refuse(${f} "^[ \t]*#[ \t]*include[ \t]*[\"<]shardscope/backend\\.hpp" "kernels and config know no backend")
  endif()
endforeach()

list(LENGTH files checked)
if(problems)
  message(FATAL_ERROR "check_layers: includes that cross a layer upward:${problems}")
endif()
message(STATUS "check_layers: ${checked} files, no include crosses a layer upward")
