list(APPEND ENCORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/gguf.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf_decode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor_arena.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weight_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/buffer_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_params.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_list.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_run.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_kernels.cu
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_ref.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random_weights.cu
  ${CMAKE_CURRENT_LIST_DIR}/random_weights_host.cpp
  ${CMAKE_CURRENT_LIST_DIR}/megakernel/kernel.cu
  ${CMAKE_CURRENT_LIST_DIR}/megakernel/kernel_two_per_sm.cu
  ${CMAKE_CURRENT_LIST_DIR}/megakernel/kernel_trace.cu
  ${CMAKE_CURRENT_LIST_DIR}/megakernel/lower.cu
  ${CMAKE_CURRENT_LIST_DIR}/megakernel/megakernel.cu)
# The megakernel's op bodies are separate functions (kernel.cuh): compiled whole-program, ptxas
# caps their registers when several are called from one kernel and spills kilobytes in every body;
# with separable compilation each body gets the full register file (only callee-saved registers
# are saved, once per call). The library's device link resolves it.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/megakernel/kernel.cu PROPERTIES COMPILE_OPTIONS "-rdc=true")
# The traced megakernel, whose bodies record their marks: a unit of its own, so the others carry none.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/megakernel/kernel_trace.cu PROPERTIES COMPILE_OPTIONS "-rdc=true")
# The two-blocks-per-SM megakernel: the same bodies capped at 128 registers (two 256-thread blocks
# share an SM's 64K registers). The cap applies to every function of the unit, hence a unit of its own.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/megakernel/kernel_two_per_sm.cu PROPERTIES COMPILE_OPTIONS "-rdc=true;-maxrregcount=128")
# ggml's decoders round q * d + m unfused: so must ours, to stay bit-exact.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/gguf_decode.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
