encore_add_test(encore_test_mla ${CMAKE_CURRENT_LIST_DIR}/test_mla_cpu.cpp ${CMAKE_CURRENT_LIST_DIR}/test_mla_gpu.cu)
