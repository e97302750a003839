# nvml_device_source_test: the real NVML code path against fake driver libraries, no GPU needed.
#
# Included from tests/CMakeLists.txt, which has already done find_package(GTest) and
# include(GoogleTest). Paths are relative to this file, so it works from any including directory.
if(NOT TARGET fake_nvml_full)
  add_subdirectory(${CMAKE_CURRENT_LIST_DIR}/../fake_nvml ${CMAKE_CURRENT_BINARY_DIR}/fake_nvml)
endif()

add_executable(nvml_device_source_test ${CMAKE_CURRENT_LIST_DIR}/nvml_device_source_test.cc)
target_link_libraries(nvml_device_source_test PRIVATE gpulock GTest::gtest_main ${CMAKE_DL_LIBS})
target_compile_definitions(nvml_device_source_test PRIVATE
  FAKE_NVML_FULL_PATH="$<TARGET_FILE:fake_nvml_full>"
  FAKE_NVML_OLD_PATH="$<TARGET_FILE:fake_nvml_old>"
  FAKE_NVML_NO_UUID_PATH="$<TARGET_FILE:fake_nvml_no_uuid>")
# The libraries are loaded by path at run time, not linked: make sure they are built first.
add_dependencies(nvml_device_source_test fake_nvml_full fake_nvml_old fake_nvml_no_uuid)
gtest_discover_tests(nvml_device_source_test)
