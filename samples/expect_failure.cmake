# Runs PROGRAM with ARGS (separated by '|') and checks that it fails (a non-zero exit) with EXPECT
# in its output: a sample that refuses its flags, or cannot write a file, says so and exits
# non-zero.
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND ${PROGRAM} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} ${ARGS} exited with 0; it must fail. Its output:\n${out}")
endif()
string(FIND "${out}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the output of ${PROGRAM} ${ARGS} (exit ${rc}) lacks '${EXPECT}':\n${out}")
endif()
