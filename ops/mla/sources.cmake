list(APPEND ENCORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/mla_validate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mla_ref.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mla_ops.cu
  ${CMAKE_CURRENT_LIST_DIR}/mla_splitkv.cu)
