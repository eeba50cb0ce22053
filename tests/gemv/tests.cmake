encore_add_test(encore_test_gemv ${CMAKE_CURRENT_LIST_DIR}/test_q4k_gemv.cu ${CMAKE_CURRENT_LIST_DIR}/test_q4k_gemv_validation.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_q4k_f16_core_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_q4k_f16_banks.cu)
