# Installs this build into a scratch prefix and builds + runs a consumer project against it.
add_test(NAME encore_install_consumer
  COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DSOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}
          -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/install_consumer -P ${CMAKE_CURRENT_LIST_DIR}/run.cmake)
set_tests_properties(encore_install_consumer PROPERTIES TIMEOUT 300 LABELS install)
