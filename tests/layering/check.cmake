# Compiles a one-line source that includes HEADER against a layer's include root (LAYER_ROOT, as
# the library's build does) and checks the outcome: EXPECT is "compiles" for a header the layer
# may include, "fails" for one above it.
set(source ${WORK_DIR}/include_${NAME}.cc)
file(WRITE ${source} "#include \"${HEADER}\"\n")
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${LAYER_ROOT} ${source}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(EXPECT STREQUAL "compiles" AND NOT rc EQUAL 0)
  message(FATAL_ERROR "${HEADER} does not compile against ${LAYER_ROOT}:\n${out}")
elseif(EXPECT STREQUAL "fails")
  if(rc EQUAL 0)
    message(FATAL_ERROR "${HEADER} compiled against ${LAYER_ROOT}; the layer must not see it")
  endif()
  string(FIND "${out}" "${HEADER}: No such file" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${HEADER} failed against ${LAYER_ROOT} for another reason:\n${out}")
  endif()
endif()
