list(APPEND ENCORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/model_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor_arena.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weight_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/buffer_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_params.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_list.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_run.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_kernels.cu
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_ref.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random_weights.cu)
