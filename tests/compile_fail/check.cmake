# Compiles SOURCE (which must fail) with the library's include directories and checks that the
# compiler's output contains EXPECT.
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${ROOT} -I${ROOT}/api ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled; it must not")
endif()
string(FIND "${out}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the compiler's message lacks '${EXPECT}':\n${out}")
endif()
