# Every header compiles on its own: one generated translation unit per header, built with the
# library's flags (internal headers through nvcc, public ones through the host compiler as well).
file(GLOB_RECURSE ENCORE_CHECKED_HEADERS CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/ops/*.h ${PROJECT_SOURCE_DIR}/ops/*.cuh
     ${PROJECT_SOURCE_DIR}/pipeline/*.h ${PROJECT_SOURCE_DIR}/pipeline/*.cuh
     ${PROJECT_SOURCE_DIR}/include/encore/*.h)
set(ENCORE_HEADER_CHECK_SOURCES)
foreach(header IN LISTS ENCORE_CHECKED_HEADERS)
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${header})
  string(MAKE_C_IDENTIFIER ${rel} id)
  set(tu ${CMAKE_BINARY_DIR}/header_check/${id}.cu)
  file(CONFIGURE OUTPUT ${tu} CONTENT "#include \"${header}\"\n")
  list(APPEND ENCORE_HEADER_CHECK_SOURCES ${tu})
  if(rel MATCHES "^include/")
    set(tu ${CMAKE_BINARY_DIR}/header_check/${id}.cpp)
    file(CONFIGURE OUTPUT ${tu} CONTENT "#include \"${header}\"\n")
    list(APPEND ENCORE_HEADER_CHECK_SOURCES ${tu})
  endif()
endforeach()
add_library(encore_header_check OBJECT ${ENCORE_HEADER_CHECK_SOURCES})
target_include_directories(encore_header_check PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/ops ${PROJECT_SOURCE_DIR})
target_link_libraries(encore_header_check PRIVATE CUDA::cudart)
target_compile_options(encore_header_check PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
