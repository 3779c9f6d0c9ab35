# The binary must not need NVML (libnvidia-ml.so.1): harness/backends/nvml_query.cpp loads
# it at run time, so shardscope starts on nodes without the NVIDIA driver. Fails when ldd
# lists libnvidia-ml among the libraries the binary needs, or when it does not start.
# Run as: cmake -DBIN=path/to/shardscope -P check_no_nvml.cmake
execute_process(COMMAND ldd ${BIN} OUTPUT_VARIABLE libs ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ldd ${BIN} failed (${rc}): ${err}")
endif()
if(libs MATCHES "nvidia-ml")
  message(FATAL_ERROR "${BIN} needs NVML at load time:\n${libs}")
endif()
execute_process(COMMAND ${BIN} --version OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BIN} --version exited ${rc}: ${err}")
endif()
message(STATUS "no NVML among the libraries ${BIN} needs; it starts: ${out}")
