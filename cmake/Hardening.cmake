# The distribution's hardening flags, taken from dpkg-buildflags where it
# exists (Debian and derivatives), else the same set written out. Only the
# hardening flags are kept: optimisation and debug flags stay CMake's.
set(_cflags "")
set(_ldflags "")
find_program(DPKG_BUILDFLAGS dpkg-buildflags)
if(DPKG_BUILDFLAGS)
  foreach(kind CPPFLAGS CXXFLAGS LDFLAGS)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env DEB_BUILD_MAINT_OPTIONS=hardening=+all
                            ${DPKG_BUILDFLAGS} --get ${kind}
                    OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    separate_arguments(_out UNIX_COMMAND "${_out}")
    foreach(f IN LISTS _out)
      if(f MATCHES "^-fstack-protector|^-D_FORTIFY_SOURCE|^-Wformat|^-Werror=format-security|^-fcf-protection|^-fstack-clash-protection")
        list(APPEND _cflags ${f})
      elseif(f MATCHES "^-Wl,-z,")
        list(APPEND _ldflags ${f})
      endif()
    endforeach()
  endforeach()
endif()
if(NOT _cflags)
  set(_cflags -fstack-protector-strong -D_FORTIFY_SOURCE=2 -Wformat -Werror=format-security
              -fstack-clash-protection -fcf-protection)
  set(_ldflags -Wl,-z,relro -Wl,-z,now)
endif()
list(REMOVE_DUPLICATES _cflags)
list(REMOVE_DUPLICATES _ldflags)
message(STATUS "PhaseLab: hardening flags ${_cflags} ${_ldflags}")
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_cflags}>")
add_link_options(${_ldflags})
# nvcc compiles the host side of the .cu files with the host compiler: the same flags.
string(REPLACE ";" "," _xcflags "${_cflags}")
add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_xcflags}>")
