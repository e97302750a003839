# Run by `cmake --install` (from cmake/install.cmake): installs the config template and the
# systemd units where the prefix wants them. Reads source_dir, CMAKE_INSTALL_PREFIX and DESTDIR.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(config_dir "/etc/gpulock")
  set(unit_dir "/lib/systemd/system")
else()
  set(config_dir "${CMAKE_INSTALL_PREFIX}/etc/gpulock")
  set(unit_dir "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")
endif()

# file(INSTALL) adds DESTDIR itself; file(WRITE) below does not.
file(INSTALL "${source_dir}/contrib/config.toml" DESTINATION "${config_dir}")

foreach(unit_name gpulock-init.service gpulock-serve.service gpulock-metrics.service
                  gpulock-metrics.timer gpulock-journal.service gpulock-journal.timer)
  file(READ "${source_dir}/contrib/systemd/${unit_name}" unit)
  string(REPLACE "/usr/local/bin/gpulock" "${CMAKE_INSTALL_PREFIX}/bin/gpulock" unit "${unit}")
  string(REPLACE "adjust the path of the gpulock binary" "ExecStart names the binary installed with this file" unit
         "${unit}")
  string(REPLACE "(adjust the path of the gpulock\n# binary; " "(ExecStart names the installed\n# binary; " unit
         "${unit}")
  set(unit_file "$ENV{DESTDIR}${unit_dir}/${unit_name}")
  message(STATUS "Installing: ${unit_file}")
  file(WRITE "${unit_file}" "${unit}")
  file(CHMOD "${unit_file}" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endforeach()
