# cmake -DOMNI_BUILD_DIR=... -DOMNI_SOURCE_DIR=... -DOMNI_WITH_TORCH=ON|OFF -P run.cmake
# Installs the build into a scratch prefix, builds tests/consumer against it
# with find_package(omni), and runs the consumers.
set(work ${OMNI_BUILD_DIR}/consumer-test)
file(REMOVE_RECURSE ${work})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${OMNI_BUILD_DIR} --prefix ${work}/prefix)
set(launcher "")
find_program(CCACHE ccache)
if(CCACHE)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
run(${CMAKE_COMMAND} -S ${OMNI_SOURCE_DIR}/tests/consumer -B ${work}/build -G Ninja
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${work}/prefix
    -DCONSUMER_WITH_TORCH=${OMNI_WITH_TORCH} ${launcher})
run(${CMAKE_COMMAND} --build ${work}/build -j 2)
run(${work}/build/consumer_core)
if(OMNI_WITH_TORCH)
  run(${work}/build/consumer_torch)
endif()
