# PHASELAB_SANITIZE: a comma-separated list of GCC/Clang sanitizers for the
# C and C++ code, e.g. "address,undefined" (scripts/test-sanitizers.sh).
# Empty (the default): none. The CUDA language (nvcc) is never instrumented;
# the host code of the CUDA backend is C++ and is.
#
# -fno-sanitize-recover=undefined makes each UBSan report fatal (a test with
# undefined behaviour fails rather than printing and going on);
# -fno-omit-frame-pointer gives the sanitizers' fast unwinder whole stacks.
set(PHASELAB_SANITIZE "" CACHE STRING "Sanitizers for C/C++ (e.g. address,undefined); empty: none")
if(PHASELAB_SANITIZE)
  set(_phaselab_san_flags -fsanitize=${PHASELAB_SANITIZE} -fno-omit-frame-pointer)
  if(PHASELAB_SANITIZE MATCHES "(^|,)undefined(,|$)")
    list(APPEND _phaselab_san_flags -fno-sanitize-recover=undefined)
  endif()
  message(STATUS "PhaseLab: sanitizers ${_phaselab_san_flags}")
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_phaselab_san_flags}>")
  # Every link, including shared libraries (libphaselab_cuda*.so link the
  # instrumented engine) and the CUDA backend, whose link is a host link.
  add_link_options(-fsanitize=${PHASELAB_SANITIZE})
endif()
