encore_add_test(encore_test_pipeline
  ${CMAKE_CURRENT_LIST_DIR}/test_model_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_weight_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_buffer_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_stage_list.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_pipeline_gpu.cu
  ${CMAKE_CURRENT_LIST_DIR}/test_megakernel_lower.cu
  ${CMAKE_CURRENT_LIST_DIR}/test_megakernel_gpu.cu)
