encore_add_test(encore_test_sample ${CMAKE_CURRENT_LIST_DIR}/test_sample_cpu.cpp ${CMAKE_CURRENT_LIST_DIR}/test_sample_gpu.cu)
