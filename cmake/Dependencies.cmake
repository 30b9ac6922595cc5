# Every dependency is a Debian package (scripts/install-deps.sh installs them); nothing is
# vendored or downloaded at build time.
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(dnnl REQUIRED)
find_package(PkgConfig REQUIRED)

pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
add_library(tilemoe::hwloc ALIAS PkgConfig::HWLOC)

find_path(NUMA_INCLUDE_DIR numa.h REQUIRED)
find_library(NUMA_LIBRARY numa REQUIRED)
add_library(tilemoe_libnuma INTERFACE)
target_include_directories(tilemoe_libnuma INTERFACE ${NUMA_INCLUDE_DIR})
target_link_libraries(tilemoe_libnuma INTERFACE ${NUMA_LIBRARY})
add_library(tilemoe::numa ALIAS tilemoe_libnuma)

if(TILEMOE_BUILD_TESTS)
  # Debian 12 ships Catch2 v2; the device machine has v3 in its system folders. Both work
  # through tests/catch.hpp.
  find_package(Catch2 REQUIRED)
  if(Catch2_VERSION VERSION_GREATER_EQUAL 3)
    set(TILEMOE_CATCH_V3 ON)
  endif()
endif()
