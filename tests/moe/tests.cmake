encore_add_test(encore_test_moe ${CMAKE_CURRENT_LIST_DIR}/test_moe_ref.cpp ${CMAKE_CURRENT_LIST_DIR}/test_moe_gpu.cu
                ${CMAKE_CURRENT_LIST_DIR}/test_moe_work_list_gpu.cu)
