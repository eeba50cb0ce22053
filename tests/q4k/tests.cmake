encore_add_test(encore_test_q4k ${CMAKE_CURRENT_LIST_DIR}/test_q4k_format.cpp ${CMAKE_CURRENT_LIST_DIR}/test_q4k_dequantize_gpu.cu)
encore_add_test(encore_test_q4k_golden ${CMAKE_CURRENT_LIST_DIR}/test_q4k_ggml_golden.cpp)
