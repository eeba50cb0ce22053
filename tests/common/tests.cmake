encore_add_test(encore_test_common ${CMAKE_CURRENT_LIST_DIR}/test_status.cpp)
