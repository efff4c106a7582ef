# Packages, from the build folder: `cpack -G DEB`, `cpack -G RPM`, `cpack -G TGZ`.
#
# DEB and RPM come as two packages: phaselab (the application, the CLI, the
# desktop integration, the model download helper) and phaselab-cuda (the CUDA
# backend library, loaded at run time when present). The CUDA runtime and
# cuBLAS do not come from the distribution, so only phaselab-cuda refers to
# them, and only as a recommendation: both packages install on a machine
# without CUDA, where PhaseLab says why it uses the CPU. The TGZ holds both and
# runs from any folder it is unpacked into. packaging/README.md says how the
# packages are checked (tests/package/check-packages.sh) and which lintian
# warnings remain and why.
set(_pkg_dir ${CMAKE_CURRENT_LIST_DIR})

# ---- what every package holds besides the binaries -------------------------
# Man pages and the Debian changelog are compressed as Debian policy asks
# (gzip -9n: no name, no time stamp, so the files are reproducible).
set(_gen ${CMAKE_BINARY_DIR}/packaging)
file(MAKE_DIRECTORY ${_gen})
find_program(GZIP_EXECUTABLE gzip REQUIRED)
set(_gz_outputs)
foreach(src man/phaselab.1 man/phaselab-cli.1 changelog)
  get_filename_component(_name ${src} NAME)
  if(_name STREQUAL "changelog")
    set(_name changelog.Debian)
  endif()
  add_custom_command(OUTPUT ${_gen}/${_name}.gz
                     COMMAND ${GZIP_EXECUTABLE} -9nc ${_pkg_dir}/${src} > ${_gen}/${_name}.gz
                     DEPENDS ${_pkg_dir}/${src})
  list(APPEND _gz_outputs ${_gen}/${_name}.gz)
endforeach()
add_custom_target(phaselab_package_docs ALL DEPENDS ${_gz_outputs})
install(FILES ${_gen}/phaselab.1.gz ${_gen}/phaselab-cli.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT app)
foreach(comp_pkg app:phaselab cuda:phaselab-cuda)
  string(REPLACE ":" ";" _cp ${comp_pkg})
  list(GET _cp 0 _comp)
  list(GET _cp 1 _pkg)
  install(FILES ${_pkg_dir}/copyright ${_gen}/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${_pkg} COMPONENT ${_comp})
endforeach()

# ---- common -----------------------------------------------------------------
set(CPACK_PACKAGE_NAME "phaselab")
set(CPACK_PACKAGE_VENDOR "PhaseLab")
set(CPACK_PACKAGE_CONTACT "PhaseLab developers <phaselab@example.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_HOMEPAGE_URL "${PROJECT_HOMEPAGE_URL}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_RESOURCE_FILE_README "${PROJECT_SOURCE_DIR}/README.md")
set(CPACK_GENERATOR "DEB;RPM;TGZ")
set(CPACK_PROJECT_CONFIG_FILE "${_pkg_dir}/CPackProjectConfig.cmake")
set(CPACK_STRIP_FILES ON)
file(READ ${_pkg_dir}/description.txt _description)
string(STRIP "${_description}" _description)

set(CPACK_COMPONENTS_ALL app)
if(TARGET phaselab_cuda)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
set(CPACK_COMPONENT_APP_DISPLAY_NAME "PhaseLab")
set(CPACK_COMPONENT_CUDA_DISPLAY_NAME "PhaseLab CUDA backend")
set(CPACK_COMPONENT_CUDA_DEPENDS app)

# ---- DEB ----------------------------------------------------------------------
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "science")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${PROJECT_HOMEPAGE_URL}")
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_APP_PACKAGE_NAME "phaselab")
set(CPACK_DEBIAN_APP_DESCRIPTION "${PROJECT_DESCRIPTION}\n${_description}")
# Dependencies computed from the binaries (dpkg-shlibdeps).
set(CPACK_DEBIAN_APP_PACKAGE_SHLIBDEPS ON)
# The SQLite driver is a Qt plugin (loaded, not linked): shlibdeps cannot see it.
# pip fetches the default model from the application's welcome page.
set(CPACK_DEBIAN_APP_PACKAGE_DEPENDS "libqt6sql6-sqlite")
set(CPACK_DEBIAN_APP_PACKAGE_RECOMMENDS "python3-pip")
set(CPACK_DEBIAN_APP_PACKAGE_SUGGESTS "phaselab-cuda")
set(CPACK_DEBIAN_CUDA_PACKAGE_NAME "phaselab-cuda")
set(CPACK_DEBIAN_CUDA_PACKAGE_SECTION "science")
set(_cuda_summary "CUDA backend for PhaseLab (NVIDIA GPUs)")
set(_cuda_description "This package holds PhaseLab's CUDA backend, a library that PhaseLab loads at
run time to run models on NVIDIA GPUs. It needs the CUDA 13 runtime and cuBLAS
from NVIDIA's CUDA toolkit or package repository; without them PhaseLab says
why and runs on the CPU.")
set(CPACK_DEBIAN_CUDA_DESCRIPTION "${_cuda_summary}\n${_cuda_description}\n\n${_description}")
# dpkg-shlibdeps cannot resolve libcudart/libcublas (not from a Debian package):
# the C and C++ runtime dependencies are written out, the CUDA ones recommended.
set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "phaselab (= ${PROJECT_VERSION}-1), libc6 (>= 2.34), libgcc-s1 (>= 3.0), libstdc++6 (>= 12)")
set(CPACK_DEBIAN_CUDA_PACKAGE_RECOMMENDS "cuda-cudart-13-0, libcublas-13-0")

# ---- RPM ----------------------------------------------------------------------
set(CPACK_RPM_COMPONENT_INSTALL ON)
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
set(CPACK_RPM_PACKAGE_LICENSE "MIT")
set(CPACK_RPM_PACKAGE_GROUP "Applications/Engineering")
set(CPACK_RPM_PACKAGE_URL "${PROJECT_HOMEPAGE_URL}")
set(CPACK_RPM_PACKAGE_RELEASE 1)
set(CPACK_RPM_APP_PACKAGE_NAME "phaselab")
set(CPACK_RPM_APP_PACKAGE_DESCRIPTION "${_description}")
set(CPACK_RPM_CUDA_PACKAGE_NAME "phaselab-cuda")
set(CPACK_RPM_CUDA_PACKAGE_SUMMARY "${_cuda_summary}")
set(CPACK_RPM_CUDA_PACKAGE_DESCRIPTION "${_cuda_description}")
set(CPACK_RPM_CUDA_PACKAGE_REQUIRES "phaselab = ${PROJECT_VERSION}")
# The folders every system already owns.
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION
    /usr/share/applications /usr/share/icons /usr/share/icons/hicolor /usr/share/metainfo
    /usr/share/mime /usr/share/mime/packages /usr/share/man /usr/share/man/man1 /usr/libexec
    /usr/share/doc)

# ---- TGZ: one archive with everything, runnable where it is unpacked ----------
set(CPACK_ARCHIVE_COMPONENT_INSTALL OFF)

include(CPack)
cpack_add_component(app DISPLAY_NAME "PhaseLab" REQUIRED)
cpack_add_component(cuda DISPLAY_NAME "PhaseLab CUDA backend" DEPENDS app)
