encore_add_test(encore_test_kda ${CMAKE_CURRENT_LIST_DIR}/test_kda_cpu.cpp ${CMAKE_CURRENT_LIST_DIR}/test_kda_gpu.cu)
