encore_add_test(encore_test_pipeline ${CMAKE_CURRENT_LIST_DIR}/test_model_config.cpp)
