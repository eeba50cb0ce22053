# The `encore` command (pipeline/cli/), built by default and installed with the library. Its
# argument parser is CLI11 (Debian: libcli11-dev); -DENCORE_BUILD_CLI=OFF builds without it.
option(ENCORE_BUILD_CLI "Build the encore command (needs CLI11)" ON)
if(ENCORE_BUILD_CLI)
  find_package(CLI11 CONFIG)
  if(NOT CLI11_FOUND)
    message(FATAL_ERROR "The encore command needs CLI11 (Debian: apt-get install libcli11-dev); "
                        "or configure with -DENCORE_BUILD_CLI=OFF")
  endif()
  add_executable(encore_cli ${CMAKE_CURRENT_LIST_DIR}/main.cpp ${CMAKE_CURRENT_LIST_DIR}/info.cpp
                 ${CMAKE_CURRENT_LIST_DIR}/generate.cpp ${CMAKE_CURRENT_LIST_DIR}/token_text.cpp)
  target_link_libraries(encore_cli PRIVATE encore CLI11::CLI11 CUDA::cudart)
  target_include_directories(encore_cli PRIVATE ${PROJECT_SOURCE_DIR}/ops)
  target_compile_options(encore_cli PRIVATE -Wall -Wextra)
  set_target_properties(encore_cli PROPERTIES OUTPUT_NAME encore RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
  install(TARGETS encore_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
