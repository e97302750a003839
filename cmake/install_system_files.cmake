# Run by `cmake --install` (from cmake/install.cmake): installs the config template and the
# systemd unit where the prefix wants them. Reads source_dir, CMAKE_INSTALL_PREFIX and DESTDIR.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(config_dir "/etc/gpulock")
  set(unit_dir "/lib/systemd/system")
else()
  set(config_dir "${CMAKE_INSTALL_PREFIX}/etc/gpulock")
  set(unit_dir "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")
endif()

# file(INSTALL) adds DESTDIR itself; file(WRITE) below does not.
file(INSTALL "${source_dir}/contrib/config.toml" DESTINATION "${config_dir}")

file(READ "${source_dir}/contrib/systemd/gpulock-init.service" unit)
string(REPLACE "/usr/local/bin/gpulock" "${CMAKE_INSTALL_PREFIX}/bin/gpulock" unit "${unit}")
string(REPLACE "adjust the path of the gpulock binary" "ExecStart names the binary installed with this file" unit
       "${unit}")
set(unit_file "$ENV{DESTDIR}${unit_dir}/gpulock-init.service")
message(STATUS "Installing: ${unit_file}")
file(WRITE "${unit_file}" "${unit}")
file(CHMOD "${unit_file}" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
