# cmake -DOMNI_BUILD_DIR=... -DOMNI_SOURCE_DIR=... -DOMNI_WITH_TORCH=ON|OFF
#       -DOMNI_CONSUME=install|build-tree [-DOMNI_CORE_ONLY=ON] -P run.cmake
# Builds tests/consumer against Omni with find_package(omni) and runs the
# consumers:
#   install     installs the build into a scratch prefix and uses it; also runs
#               the installed `omni` CLI with no library path set (RUNPATH);
#   build-tree  uses the build directory itself (omni_DIR=<build dir>).
# OMNI_CORE_ONLY: find_package(omni COMPONENTS core) with Torch made
# unfindable (CMAKE_DISABLE_FIND_PACKAGE_Torch).
if(NOT OMNI_CONSUME)
  set(OMNI_CONSUME install)
endif()
set(work ${OMNI_BUILD_DIR}/consumer-test-${OMNI_CONSUME})
if(OMNI_CORE_ONLY)
  set(work ${work}-core)
  set(OMNI_WITH_TORCH OFF)
endif()
file(REMOVE_RECURSE ${work})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
set(find_args "")
if(OMNI_CONSUME STREQUAL "install")
  run(${CMAKE_COMMAND} --install ${OMNI_BUILD_DIR} --prefix ${work}/prefix)
  set(find_args -DCMAKE_PREFIX_PATH=${work}/prefix)
  # The installed CLI finds libomni_core through its RUNPATH alone.
  run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${work}/prefix/bin/omni info)
elseif(OMNI_CONSUME STREQUAL "build-tree")
  set(find_args -Domni_DIR=${OMNI_BUILD_DIR})
else()
  message(FATAL_ERROR "OMNI_CONSUME must be install or build-tree, got '${OMNI_CONSUME}'")
endif()
if(OMNI_CORE_ONLY)
  list(APPEND find_args -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON)
endif()
set(launcher "")
find_program(CCACHE ccache)
if(CCACHE)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE})
endif()
run(${CMAKE_COMMAND} -S ${OMNI_SOURCE_DIR}/tests/consumer -B ${work}/build -G Ninja
    -DCMAKE_BUILD_TYPE=Release ${find_args}
    -DCONSUMER_WITH_TORCH=${OMNI_WITH_TORCH} ${launcher})
run(${CMAKE_COMMAND} --build ${work}/build -j 2)
run(${work}/build/consumer_core)
if(OMNI_WITH_TORCH)
  run(${work}/build/consumer_torch)
endif()
