# The Debian package, made by CPack's DEB generator from the install rules (cmake/install.cmake):
#   scripts/package            # a Release build in build-package/, then build-package/gpulock_*.deb
# or, from any build directory:  cpack -G DEB --config BUILD/CPackConfig.cmake
# The maintainer scripts in packaging/debian/ apply tmpfiles.d on install and leave the systemd
# unit disabled until the administrator enables it.
set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "gpulock")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "gpulock")
set(CPACK_PACKAGE_CONTACT "gpulock maintainers <maintainers@users.noreply.a-seed-6253fbfc.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "exclusive, never-stale GPU leases for shared machines")
# The extended description: CPack indents each line and puts the summary above it.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "gpulock gives the people who share a multi-GPU machine exclusive GPU leases
held as kernel locks by the processes of the job, so that a lease ends when
the job ends, however it ends. Requests wait in a fair queue shared by all
users, with no daemon. A Redis backend shares one pool of GPUs across
containers and hosts.

This package holds the gpulock command with its man page and bash, zsh and
fish completions; the C API (libgpulock_c.so) and the C++ library with their
headers and CMake package config; the Python package for python3 with
gpulock-gpu, GPU.py's commands over gpulock leases; the
tmpfiles.d entry for the lock directory; and gpulock-init.service, which
makes the lock files root-owned at boot once enabled.")
# Install into the staging tree with DESTDIR and the real prefix, /usr whatever the build's
# CMAKE_INSTALL_PREFIX, so that install-time code (cmake/install_system_files.cmake) sees /usr.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX "/usr")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME "DEB-DEFAULT")
set(CPACK_DEBIAN_PACKAGE_RELEASE "1")
set(CPACK_DEBIAN_PACKAGE_SECTION "utils")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
# Library dependencies from dpkg-shlibdeps; the Python extension is built for one python3.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
if(GPULOCK_BUILD_PYTHON)
  math(EXPR gpulock_next_python_minor "${Python_VERSION_MINOR} + 1")
  set(CPACK_DEBIAN_PACKAGE_DEPENDS
      "python3 (>= ${Python_VERSION_MAJOR}.${Python_VERSION_MINOR}~), python3 (<< ${Python_VERSION_MAJOR}.${gpulock_next_python_minor})")
endif()
# Without bash-completion the completions the package ships do nothing (gpulock doctor says so).
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd, bash-completion")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "redis-tools, libfmt-dev, libtomlplusplus-dev, libhiredis-dev")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/packaging/debian/conffiles;${PROJECT_SOURCE_DIR}/packaging/debian/triggers;${PROJECT_SOURCE_DIR}/packaging/debian/postinst;${PROJECT_SOURCE_DIR}/packaging/debian/prerm;${PROJECT_SOURCE_DIR}/packaging/debian/postrm")
include(CPack)
