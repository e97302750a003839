# What `cmake --install` (and so the Debian package, cmake/package.cmake) puts where: the
# command, its man page and shell completions, gpulock-gpu, the C API's shared library, the public headers,
# the C++ library and a CMake package config, the Python package, the documentation, and the
# system files of contrib/ (config template, tmpfiles.d, systemd unit).
#
# Relative destinations follow the install prefix (/usr for the package, /usr/local by
# default). Libraries go to lib/<multiarch triplet> on Debian whatever the prefix, so a build
# configured with the default prefix can still be packaged for /usr.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(CMAKE_LIBRARY_ARCHITECTURE)
  set(GPULOCK_INSTALL_LIBDIR "lib/${CMAKE_LIBRARY_ARCHITECTURE}")
else()
  set(GPULOCK_INSTALL_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
endif()
set(GPULOCK_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE STRING
    "Where the Python package goes, under the prefix (Debian's python3 reads lib/python3/dist-packages under /usr)")
set(GPULOCK_C_SOVERSION 0)
set(gpulock_docdir "${CMAKE_INSTALL_DATADIR}/doc/gpulock")

# The man pages and the Debian changelog, compressed as Debian wants them (gzip -9n: no name,
# no time stamp, so the package is reproducible).
find_program(GZIP_PROGRAM gzip REQUIRED)
function(gpulock_compressed source output)
  get_filename_component(directory "${output}" DIRECTORY)
  add_custom_command(OUTPUT "${output}"
    COMMAND ${CMAKE_COMMAND} -E make_directory "${directory}"
    COMMAND ${GZIP_PROGRAM} -9nc "${source}" > "${output}"
    DEPENDS "${source}"
    COMMENT "Compressing ${source}")
endfunction()
set(gpulock_manual "${PROJECT_BINARY_DIR}/man/gpulock.1.gz")
set(gpulock_gpu_manual "${PROJECT_BINARY_DIR}/man/gpulock-gpu.1.gz")
set(gpulock_changelog "${PROJECT_BINARY_DIR}/packaging/changelog.Debian.gz")
gpulock_compressed("${PROJECT_SOURCE_DIR}/docs/gpulock.1" "${gpulock_manual}")
gpulock_compressed("${PROJECT_SOURCE_DIR}/docs/gpulock-gpu.1" "${gpulock_gpu_manual}")
gpulock_compressed("${PROJECT_SOURCE_DIR}/packaging/debian/changelog" "${gpulock_changelog}")
add_custom_target(gpulock_compressed_docs ALL
  DEPENDS "${gpulock_manual}" "${gpulock_gpu_manual}" "${gpulock_changelog}")

# The command, its manual and completions.
install(TARGETS gpulock_cli RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(TARGETS gpulock_serve_cli RUNTIME DESTINATION "${CMAKE_INSTALL_LIBEXECDIR}/gpulock")
install(FILES "${gpulock_manual}" DESTINATION "${CMAKE_INSTALL_MANDIR}/man1")
install(FILES contrib/completion/gpulock.bash DESTINATION "${CMAKE_INSTALL_DATADIR}/bash-completion/completions"
        RENAME gpulock)
install(FILES contrib/completion/_gpulock DESTINATION "${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions")
install(FILES contrib/completion/gpulock.fish DESTINATION "${CMAKE_INSTALL_DATADIR}/fish/vendor_completions.d")

# The C API, the headers, the C++ library and find_package(gpulock).
install(TARGETS gpulock_c LIBRARY DESTINATION "${GPULOCK_INSTALL_LIBDIR}")
install(TARGETS gpulock ARCHIVE DESTINATION "${GPULOCK_INSTALL_LIBDIR}")
install(DIRECTORY include/gpulock DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(FILES "${PROJECT_BINARY_DIR}/src/generated/gpulock/version.hpp"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/gpulock")
set(gpulock_cmakedir "${GPULOCK_INSTALL_LIBDIR}/cmake/gpulock")
file(RELATIVE_PATH GPULOCK_CONFIG_TO_PREFIX "/prefix/${gpulock_cmakedir}" "/prefix")
configure_file(cmake/gpulockConfig.cmake.in "${PROJECT_BINARY_DIR}/cmake/gpulockConfig.cmake" @ONLY)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/cmake/gpulockConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/cmake/gpulockConfig.cmake"
              "${PROJECT_BINARY_DIR}/cmake/gpulockConfigVersion.cmake"
        DESTINATION "${gpulock_cmakedir}")

# The Python package: the extension module built for this build's python3, beside the
# package's Python files.
# With it, gpulock-gpu (GPU.py's replacement, a command of the Python package) and its manual.
if(GPULOCK_BUILD_PYTHON)
  install(TARGETS gpulock_python_native LIBRARY DESTINATION "${GPULOCK_INSTALL_PYTHONDIR}/gpulock")
  install(DIRECTORY python/gpulock DESTINATION "${GPULOCK_INSTALL_PYTHONDIR}"
          PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
  install(PROGRAMS packaging/gpulock-gpu DESTINATION "${CMAKE_INSTALL_BINDIR}")
  install(FILES "${gpulock_gpu_manual}" DESTINATION "${CMAKE_INSTALL_MANDIR}/man1")
endif()

# Documentation.
install(FILES README.md "${gpulock_changelog}" packaging/debian/copyright
        DESTINATION "${gpulock_docdir}")
install(DIRECTORY docs/ DESTINATION "${gpulock_docdir}" FILES_MATCHING PATTERN "*.md")

# System files, whose places depend on the prefix only at install time: for /usr (the
# package) the config template becomes /etc/gpulock/config.toml and the unit goes to
# /lib/systemd/system, as Debian 12 wants; for another prefix both stay under it (an
# administrator copies them to /etc). The unit runs the installed binary.
install(FILES contrib/tmpfiles.d/gpulock.conf DESTINATION "lib/tmpfiles.d")
install(CODE "
  set(source_dir \"${PROJECT_SOURCE_DIR}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/install_system_files.cmake\")
")
