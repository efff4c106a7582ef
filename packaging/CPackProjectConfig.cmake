# Read by cpack for each generator (CPACK_PROJECT_CONFIG_FILE).
if(CPACK_GENERATOR STREQUAL "DEB")
  # Each component's description starts with its own synopsis line; CPackDeb
  # would put the package-wide summary in front of it.
  unset(CPACK_PACKAGE_DESCRIPTION_SUMMARY)
endif()
