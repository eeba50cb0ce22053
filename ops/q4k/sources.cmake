list(APPEND ENCORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/q4k_format.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dequantize.cu)
# Byte-exactness with ggml's reference quantiser needs unfused multiply-adds.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/q4k_format.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
