# The encore command (pipeline/cli/): arguments, `info` on a tiny kimi-linear file, and `generate`
# (which needs a GPU; without one it must say so and fail).
if(TARGET encore_cli)
  add_executable(encore_write_gguf ${CMAKE_CURRENT_LIST_DIR}/write_gguf.cpp)
  target_link_libraries(encore_write_gguf PRIVATE encore CUDA::cudart)
  set(tiny ${CMAKE_CURRENT_BINARY_DIR}/cli_tiny.gguf)
  set(encore_bin $<TARGET_FILE:encore_cli>)
  add_test(NAME cli.write_tiny_gguf COMMAND encore_write_gguf ${tiny} tiny 7)
  set_tests_properties(cli.write_tiny_gguf PROPERTIES FIXTURES_SETUP cli_tiny)

  add_test(NAME cli.help COMMAND ${encore_bin} --help)
  add_test(NAME cli.no_subcommand COMMAND ${encore_bin})
  add_test(NAME cli.info COMMAND ${encore_bin} info --model ${tiny})
  add_test(NAME cli.info_missing_file COMMAND ${encore_bin} info --model ${tiny}.absent)
  add_test(NAME cli.info_not_gguf COMMAND ${encore_bin} info --model ${CMAKE_CURRENT_LIST_FILE})
  add_test(NAME cli.generate_needs_prompt COMMAND ${encore_bin} generate --model ${tiny})
  add_test(NAME cli.generate_bad_id COMMAND ${encore_bin} generate --model ${tiny} --prompt-ids 1,x)
  add_test(NAME cli.generate_id_outside_vocab COMMAND ${encore_bin} generate --model ${tiny} --prompt-ids 1,1000000)
  add_test(NAME cli.generate_bad_path COMMAND ${encore_bin} generate --model ${tiny} --prompt-ids 1 --path eager)
  add_test(NAME cli.generate_bad_batch COMMAND ${encore_bin} generate --model ${tiny} --prompt-ids 1 --batch 65)
  add_test(NAME cli.generate_bad_gemv_core COMMAND ${encore_bin} generate --model ${tiny} --prompt-ids 1 --gemv-core fp8)
  # (bash scripts, not cmake -P: the GPU machines have ctest and the build but may lack cmake)
  foreach(kind graph megakernel)
    add_test(NAME cli.generate_${kind} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_generate.sh ${encore_bin} ${tiny} ${kind}
             ${CMAKE_CURRENT_BINARY_DIR}/cli_logits_${kind}.bin 512)
  endforeach()
  add_test(NAME cli.info_lists_every_refusal COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_info_refusals.sh ${encore_bin} ${tiny}
           ${CMAKE_CURRENT_BINARY_DIR}/cli_tiny_f32.gguf ${PROJECT_SOURCE_DIR}/bench/agree/widen.py)
  set_tests_properties(cli.info_lists_every_refusal PROPERTIES FIXTURES_REQUIRED cli_tiny SKIP_REGULAR_EXPRESSION "gguf-py not importable")
  set_tests_properties(cli.info cli.info_missing_file cli.info_not_gguf cli.generate_needs_prompt cli.generate_bad_id
                       cli.generate_id_outside_vocab cli.generate_bad_path cli.generate_bad_batch cli.generate_bad_gemv_core cli.generate_graph
                       cli.generate_megakernel PROPERTIES FIXTURES_REQUIRED cli_tiny)
  set_tests_properties(cli.help PROPERTIES PASS_REGULAR_EXPRESSION "generate")
  set_tests_properties(cli.info PROPERTIES PASS_REGULAR_EXPRESSION "encore +runs it")
  set_tests_properties(cli.no_subcommand cli.info_missing_file cli.generate_needs_prompt cli.generate_bad_id
                       cli.generate_bad_path cli.generate_bad_batch PROPERTIES WILL_FAIL TRUE)
  # (the value's check, not an unknown option, must be what rejects it)
  set_tests_properties(cli.generate_bad_gemv_core PROPERTIES PASS_REGULAR_EXPRESSION "--gemv-core: fp8 not in")
  set_tests_properties(cli.info_not_gguf PROPERTIES WILL_FAIL TRUE)
  set_tests_properties(cli.generate_id_outside_vocab PROPERTIES PASS_REGULAR_EXPRESSION "outside the vocabulary")
endif()

# The command's token text (compiled in from pipeline/cli/).
encore_add_test(encore_test_cli ${CMAKE_CURRENT_LIST_DIR}/test_token_text.cpp ${PROJECT_SOURCE_DIR}/pipeline/cli/token_text.cpp)
