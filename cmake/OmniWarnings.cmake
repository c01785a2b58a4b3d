# omni_set_warnings(target): the project's warning set; errors when OMNI_WERROR.
function(omni_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual
    -Wimplicit-fallthrough)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  if(OMNI_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
